// PrivateUse1HooksInterface: how ATen's Context, autograd, pin_memory,
// torch.Generator, from_blob and storage resizing reach the OpenReg backend.
#include "Hooks.h"

#include "Allocator.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Generator.h"
#include "Mutants.h"

#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <atomic>
#include <bitset>
#include <vector>

namespace openreg {

namespace {

std::atomic<uint64_t> g_init_calls{0};

// Mutant primary-context-per-thread: the devices this thread allocated on.
thread_local std::bitset<128> t_used_devices;

// Whether `ptr` lies inside device memory of the runtime.
bool device_owning(const void* ptr) {
  orPointerAttributes attributes;
  return orPointerGetAttributes(&attributes, ptr) == orSuccess &&
      attributes.type == orMemoryTypeDevice;
}

struct OpenRegHooks final : public at::PrivateUse1HooksInterface {
  // Called once per process by at::globalContext().lazyInitDevice, before
  // the first generator, pinned allocation or pointer query. Device contexts
  // stay lazy: each device initializes on first use, which is what
  // hasPrimaryContext reports.
  void init() const override {
    g_init_calls.fetch_add(1);
    int count = 0;
    OPENREG_CHECK(orGetDeviceCount(&count));  // surfaces a bad configuration
  }

  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    if (mutant::is("primary-context-always-true")) return true;
    if (mutant::is("has-primary-context-initializes")) at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
    if (mutant::is("has-primary-context-unchecked-index") && (index < 0 || index >= device_count())) std::abort();
    TORCH_CHECK(!mutant::is("has-primary-context-throws-for-unused") || is_device_initialized(index),
                "OpenReg: device ", static_cast<int>(index), " is not initialized");
    if (mutant::is("primary-context-per-thread")) return is_device_initialized(index) && t_used_devices.test(index);
    return is_device_initialized(index);
  }

  bool isBuilt() const override {
    if (mutant::is("is-built-not-overridden")) return at::PrivateUse1HooksInterface::isBuilt();
    return true;
  }

  // Never throws and never initializes a device.
  bool isAvailable() const override {
    if (mutant::is("availability-initializes") && device_count() > 0) orDeviceInit(0);
    if (mutant::is("is-available-false")) return false;
    return device_count() > 0;
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    if (mutant::is("init-on-every-generator")) at::detail::getPrivateUse1Hooks().init();
    if (mutant::is("hooks-generator-of-current-device")) return default_generator(-1);
    if (mutant::is("hooks-generators-are-copies")) {
      // A second set of generators, cloned from the real ones at the first call.
      static std::vector<at::Generator> copies = [] {
        std::vector<at::Generator> made;
        for (c10::DeviceIndex i = 0; i < device_count(); ++i) made.push_back(default_generator(i).clone());
        return made;
      }();
      return copies.at(index < 0 ? current_device() : index);
    }
    return default_generator(index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    if (mutant::is("init-on-every-generator")) at::detail::getPrivateUse1Hooks().init();
    return new_generator(index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    if (mutant::is("device-from-ptr-is-current-device")) return at::Device(c10::DeviceType::PrivateUse1, current_device());
    if (mutant::is("device-from-ptr-host-is-device-0") && !device_owning(data)) return at::Device(c10::DeviceType::PrivateUse1, 0);
    orPointerAttributes attributes;
    OPENREG_CHECK(orPointerGetAttributes(&attributes, data));
    TORCH_CHECK(attributes.type == orMemoryTypeDevice, "OpenReg: pointer ", data,
                " is not OpenReg device memory (it is ",
                attributes.type == orMemoryTypeHost ? "pinned host memory"
                                                    : "not allocated by OpenReg",
                ")");
    return at::Device(c10::DeviceType::PrivateUse1,
                      static_cast<c10::DeviceIndex>(attributes.device));
  }

  bool isPinnedPtr(const void* data) const override {
    if (mutant::is("any-host-pointer-is-pinned")) return data != nullptr && !device_owning(data);
    if (mutant::is("is-pinned-ptr-base-only")) return is_pinned_pointer(data) && !is_pinned_pointer(static_cast<const char*>(data) - 1);
    return is_pinned_pointer(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    if (mutant::is("pinned-allocator-reinitializes")) at::detail::getPrivateUse1Hooks().init();
    return host_allocator();
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count() + (mutant::is("hooks-count-disagrees") ? 1 : 0);
  }

  void setCurrentDevice(c10::DeviceIndex index) const override {
    if (mutant::is("hooks-set-current-device-noop")) return;
    set_device(index);
    if (mutant::is("hooks-current-device-stale")) t_hooks_device = index;
  }

  c10::DeviceIndex getCurrentDevice() const override {
    if (mutant::is("hooks-current-device-stale")) return t_hooks_device;
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    if (mutant::is("hooks-exchange-clamps") && index >= device_count()) index = device_count() - 1;
    const c10::DeviceIndex previous = exchange_device(index);
    return mutant::is("hooks-exchange-returns-new") ? index : previous;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    if (mutant::is("hooks-maybe-exchange-ignores-valid")) return current_device();
    return maybe_exchange_device(index);
  }

  // Mutant hooks-current-device-stale: the hooks' own idea of the current device.
  static inline thread_local c10::DeviceIndex t_hooks_device = 0;

  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t new_nbytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), new_nbytes);
  }
};

// Registered when the library loads (at `import openreg`), exactly once.
// The Python package refuses to load us when another backend holds
// PrivateUse1; should it happen anyway, a throw here (inside dlopen's static
// initialization) would abort the process, so warn instead.
const bool g_registered = [] {
  if (at::isPrivateUse1HooksRegistered()) {
    TORCH_WARN("OpenReg: PrivateUse1 hooks are already registered by another backend; "
               "OpenReg's hooks are not installed");
    return false;
  }
  auto* hooks = new OpenRegHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
  if (mutant::is("init-at-import")) hooks->init();
  return true;
}();

}  // namespace

uint64_t hooks_init_calls() { return g_init_calls.load(); }

void note_thread_use(c10::DeviceIndex index) {
  if (index >= 0 && index < 128) t_used_devices.set(index);
}

}  // namespace openreg
