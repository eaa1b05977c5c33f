// privateuse1_conformance.conformance._cxx: direct access to the C++ contract
// surface of whatever PrivateUse1 backend is loaded in this process. Nothing
// here knows a particular backend: it reaches the backend only through
// PyTorch's registries (at::detail::getPrivateUse1Hooks() and
// c10::impl::getDeviceGuardImpl(PrivateUse1)).
#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "contracts_probes.h"
#include "gtest_runner.h"
#include "hooks_watch.h"

#include <limits>

namespace py = pybind11;

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// Python ints reach the C++ API as DeviceIndex (int8_t): refuse values that
// would silently wrap instead of probing something else than asked.
c10::DeviceIndex narrow(int64_t index) {
  TORCH_CHECK_VALUE(index >= std::numeric_limits<c10::DeviceIndex>::min() &&
                        index <= std::numeric_limits<c10::DeviceIndex>::max(),
                    "device index ", index, " does not fit c10::DeviceIndex (int8)");
  return static_cast<c10::DeviceIndex>(index);
}

const at::PrivateUse1HooksInterface& hooks() {
  return at::detail::getPrivateUse1Hooks();
}

const c10::impl::DeviceGuardImplInterface& guard() {
  return *c10::impl::getDeviceGuardImpl(kType);
}

py::object wrap(const at::Generator& generator) {
  return py::reinterpret_steal<py::object>(THPGenerator_Wrap(generator));
}

py::tuple device_tuple(const c10::Device& device) {
  return py::make_tuple(c10::DeviceTypeName(device.type(), /*lower_case=*/true),
                        static_cast<int>(device.index()));
}

}  // namespace

// ======================================================================
// Hooks extras (used by conformance/test_hooks.py and test_tensors.py).
// Kept in this separate block: add_hooks_extras() is called once at the
// end of the module init below.
// ======================================================================
#include <ATen/ops/from_blob.h>

namespace {

// A hooks object that implements nothing: only used to try a second
// registration, which PyTorch must refuse.
struct UnusedHooks final : public at::PrivateUse1HooksInterface {};

void add_hooks_extras(py::module& m) {
  // Identity of the registered hooks object (to see that it never changes).
  m.def("hooks_address", [] { return reinterpret_cast<uintptr_t>(&hooks()); });
  // Tries to register a second hooks object; returns normally only if the
  // registration was accepted (the object is then leaked on purpose, since
  // the registry keeps a raw pointer to it).
  m.def("hooks_register_second", [] {
    auto extra = std::make_unique<UnusedHooks>();
    at::RegisterPrivateUse1HooksInterface(extra.get());
    extra.release();
  });
  // Context::defaultGenerator: lazily initializes, then asks the hooks.
  m.def("context_default_generator", [](int64_t i) {
    return wrap(at::globalContext().defaultGenerator(c10::Device(kType, narrow(i))));
  });
  // Context::getPinnedMemoryAllocator (lazily initializes first), then
  // what the hooks and the context say about the block it returns.
  m.def("context_pinned_roundtrip", [](int64_t nbytes) {
    at::Allocator* allocator = at::globalContext().getPinnedMemoryAllocator(kType);
    TORCH_CHECK(allocator != nullptr, "getPinnedMemoryAllocator returned null");
    c10::DataPtr block = allocator->allocate(static_cast<size_t>(nbytes));
    auto* base = static_cast<char*>(block.get());
    TORCH_CHECK(base != nullptr || nbytes == 0, "the pinned allocator returned null for ",
                nbytes, " bytes");
    auto* last = base + (nbytes > 0 ? nbytes - 1 : 0);
    return py::make_tuple(hooks().isPinnedPtr(base), hooks().isPinnedPtr(last),
                          at::globalContext().isPinnedPtr(base, kType),
                          c10::DeviceTypeName(block.device().type(), true));
  });
  // at::from_blob on device memory without a device index: PyTorch asks the
  // hooks' getDeviceFromPtr where the memory lives. index >= 0 states the
  // device explicitly (PyTorch then checks it against getDeviceFromPtr).
  // The tensor does not own the memory: keep its source alive.
  m.def("from_blob_float", [](uintptr_t ptr, int64_t numel, int64_t index) {
    auto options = at::TensorOptions().dtype(at::kFloat).device(
        index < 0 ? c10::Device(kType) : c10::Device(kType, narrow(index)));
    return at::from_blob(reinterpret_cast<void*>(ptr), {numel}, options);
  });
}

}  // namespace
// ====================================================== end hooks extras

// TORCH_EXTENSION_NAME is _cxx: the kit compiles this module with
// torch.utils.cpp_extension (conformance/_probe.py), which defines it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Direct calls into the PrivateUse1 hooks and device guard";

  // ------------------------------------------------- C++ contract tests
  // gtest_list() / gtest_run(name) (gtest_runner.cpp) and the probes that
  // Python calls directly (contracts_probes.h).
  m.def("gtest_list", &pu1c::gtest_list,
        "Names (Suite.Name) of the C++ contract tests; the suite is the contract ID with '_' for '-'");
  // The cases start threads and the backend may need the GIL: released.
  m.def("gtest_run", [](const std::string& name) {
        const pu1c::GtestOutcome outcome = pu1c::gtest_run(name);
        return std::make_tuple(outcome.passed, outcome.skipped, outcome.message);
      }, py::arg("name"), py::call_guard<py::gil_scoped_release>(),
        "Run one C++ contract test in this process: (passed, skipped, message)");
  m.def("guard_current_device", &pu1c::guard_current_device, py::arg("kind"), py::arg("repeats"),
        py::call_guard<py::gil_scoped_release>(),
        "GD-DEV-002: guard the current device `repeats` times with the given guard kind");
  m.def("guard_other_device", &pu1c::guard_other_device, py::arg("index"),
        py::call_guard<py::gil_scoped_release>(),
        "GD-DEV-002: enter and leave one DeviceGuard to device `index`");

  // ------------------------------------------------------------- hooks
  m.def("hooks_registered", [] { return at::isPrivateUse1HooksRegistered(); });
  // c10::GetAllocator returns null in release builds when nothing is
  // registered, and torch.UntypedStorage(n, device=...) then dereferences it:
  // the suite asks first, to report a missing allocator instead of a crash.
  m.def("allocator_registered", [] { return c10::GetAllocator(kType) != nullptr; });
  m.def("hooks_is_built", [] { return hooks().isBuilt(); });
  m.def("hooks_is_available", [] { return hooks().isAvailable(); });
  m.def("hooks_has_primary_context",
        [](int64_t i) { return hooks().hasPrimaryContext(narrow(i)); });
  m.def("hooks_device_count", [] { return static_cast<int>(hooks().deviceCount()); });
  m.def("hooks_get_current_device",
        [] { return static_cast<int>(hooks().getCurrentDevice()); });
  m.def("hooks_set_current_device",
        [](int64_t i) { hooks().setCurrentDevice(narrow(i)); });
  m.def("hooks_exchange_device",
        [](int64_t i) { return static_cast<int>(hooks().exchangeDevice(narrow(i))); });
  m.def("hooks_maybe_exchange_device", [](int64_t i) {
    return static_cast<int>(hooks().maybeExchangeDevice(narrow(i)));
  });
  m.def("hooks_default_generator",
        [](int64_t i) { return wrap(hooks().getDefaultGenerator(narrow(i))); });
  m.def("hooks_default_generator_address", [](int64_t i) {
    return reinterpret_cast<uintptr_t>(
        hooks().getDefaultGenerator(narrow(i)).unsafeGetGeneratorImpl());
  });
  m.def("hooks_new_generator",
        [](int64_t i) { return wrap(hooks().getNewGenerator(narrow(i))); });
  m.def("hooks_get_device_from_ptr", [](uintptr_t ptr) {
    return device_tuple(hooks().getDeviceFromPtr(reinterpret_cast<void*>(ptr)));
  });
  m.def("hooks_is_pinned_ptr", [](uintptr_t ptr) {
    return hooks().isPinnedPtr(reinterpret_cast<const void*>(ptr));
  });
  // Allocates through the hooks' pinned allocator and reports what the
  // hooks say about the block (base and an interior pointer).
  m.def("hooks_pinned_roundtrip", [](int64_t nbytes) {
    at::Allocator* allocator = hooks().getPinnedMemoryAllocator();
    TORCH_CHECK(allocator != nullptr, "getPinnedMemoryAllocator returned null");
    c10::DataPtr block = allocator->allocate(static_cast<size_t>(nbytes));
    auto* base = static_cast<char*>(block.get());
    const bool base_pinned = hooks().isPinnedPtr(base);
    const bool interior_pinned = nbytes > 1 ? hooks().isPinnedPtr(base + nbytes / 2) : base_pinned;
    return py::make_tuple(base_pinned, interior_pinned,
                          c10::DeviceTypeName(block.device().type(), true));
  });
  m.def("hooks_resize_bytes", [](const c10::Storage& storage, int64_t nbytes) {
    hooks().resizePrivateUse1Bytes(storage, static_cast<size_t>(nbytes));
  });
  // Counting the hooks' init() / getPinnedMemoryAllocator() calls, and
  // PyTorch's own lazy-initialization flag (hooks_watch.cpp).
  m.def("hooks_watch", &pu1c::watch_hooks);
  m.def("hooks_watch_calls", [] {
    const pu1c::HookCalls calls = pu1c::hook_calls();
    py::dict out;
    out["init"] = calls.init;
    out["pinned_allocator"] = calls.pinned;
    out["first_init"] = calls.first_init;
    out["first_pinned_allocator"] = calls.first_pinned;
    return out;
  });
  m.def("context_initialized", &pu1c::context_initialized);
  // Through at::globalContext(), the way ATen itself reaches the hooks.
  m.def("context_lazy_init", [] { at::globalContext().lazyInitDevice(kType); });
  m.def("context_is_pinned_ptr", [](uintptr_t ptr) {
    return at::globalContext().isPinnedPtr(reinterpret_cast<const void*>(ptr), kType);
  });
  m.def("context_get_device_from_ptr", [](uintptr_t ptr) {
    return device_tuple(at::globalContext().getDeviceFromPtr(reinterpret_cast<void*>(ptr), kType));
  });

  // ------------------------------------------------------------- guard
  m.def("guard_registered", [] { return c10::impl::hasDeviceGuardImpl(kType); });
  m.def("guard_type", [] {
    return c10::DeviceTypeName(guard().type(), /*lower_case=*/true);
  });
  m.def("guard_device_count", [] { return static_cast<int>(guard().deviceCount()); });
  m.def("guard_get_device", [] { return device_tuple(guard().getDevice()); });
  m.def("guard_set_device", [](int64_t i) { guard().setDevice(c10::Device(kType, narrow(i))); });
  m.def("guard_exchange_device", [](int64_t i) {
    return device_tuple(guard().exchangeDevice(c10::Device(kType, narrow(i))));
  });
  m.def("guard_unchecked_set_device",
        [](int64_t i) { guard().uncheckedSetDevice(c10::Device(kType, narrow(i))); });
  // Passing a CPU device must be rejected by every Device-taking method.
  m.def("guard_set_device_of_type", [](const std::string& type, int64_t i) {
    guard().setDevice(c10::Device(c10::Device(type).type(), narrow(i)));
  });
  m.def("guard_exchange_device_of_type", [](const std::string& type, int64_t i) {
    return device_tuple(guard().exchangeDevice(c10::Device(c10::Device(type).type(), narrow(i))));
  });
  m.def("guard_get_stream_of_type", [](const std::string& type, int64_t i) {
    const c10::Stream s = guard().getStream(c10::Device(c10::Device(type).type(), narrow(i)));
    return py::make_tuple(s.id(), static_cast<int>(s.device_index()));
  });
  // The device's default stream, as the guard names it (what every thread starts with).
  m.def("guard_default_stream", [](int64_t i) {
    const c10::Stream s = guard().getDefaultStream(c10::Device(kType, narrow(i)));
    return py::make_tuple(s.id(), static_cast<int>(s.device_index()));
  });
  m.def("guard_synchronize_device", [](int64_t i) {
    py::gil_scoped_release no_gil;
    guard().synchronizeDevice(narrow(i));
  });

  add_hooks_extras(m);  // hooks extras block above
}
