// PrivateUse1HooksInterface: how ATen's Context, autograd, pin_memory,
// torch.Generator, from_blob and storage resizing reach the OpenReg backend.
#include "Hooks.h"

#include "Allocator.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Generator.h"

#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <atomic>

namespace openreg {

namespace {

std::atomic<uint64_t> g_init_calls{0};

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
    return is_device_initialized(index);
  }

  bool isBuilt() const override {
    return true;
  }

  // Never throws and never initializes a device.
  bool isAvailable() const override {
    return device_count() > 0;
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
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
    return is_pinned_pointer(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return host_allocator();
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }

  void setCurrentDevice(c10::DeviceIndex index) const override {
    set_device(index);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return exchange_device(index);
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return maybe_exchange_device(index);
  }

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
  return true;
}();

}  // namespace

uint64_t hooks_init_calls() { return g_init_calls.load(); }

}  // namespace openreg
