// openreg._C: Python bindings of the OpenReg backend. Importing this module
// loads libopenreg_torch, whose static registrations claim PrivateUse1 for the
// guard, hooks, allocators and kernels.
#include <Allocator.h>
#include <DeviceManagement.h>
#include <Exception.h>
#include <Generator.h>
#include <Hooks.h>
#include <Stream.h>

#include <ATen/Context.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

// Python ints are wider than DeviceIndex (int8): check before narrowing, so
// that set_device(300) is an out-of-range error, not device 44.
c10::DeviceIndex to_index(int64_t index, const char* argument, bool allow_minus_one) {
  const int64_t count = openreg::device_count();
  if (allow_minus_one && index == -1) return -1;
  if (index < 0 || index >= count) {
    TORCH_CHECK(count > 0, "OpenReg: ", argument, "=", index,
                " is invalid: there are no OpenReg devices");
    TORCH_CHECK(false, "OpenReg: ", argument, "=", index,
                " is out of range: valid device indices are [0, ", count, ")");
  }
  return static_cast<c10::DeviceIndex>(index);
}

void lazy_init() {
  TORCH_CHECK(!torch::utils::is_device_in_bad_fork(at::kPrivateUse1),
              "OpenReg: cannot re-initialize OpenReg in a forked subprocess. To "
              "use OpenReg with multiprocessing, use the 'spawn' start method");
  // A child forked after this point is marked "bad fork" by PyTorch.
  torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
  at::globalContext().lazyInitDevice(at::kPrivateUse1);
}

py::dict runtime_counters() {
  orDebugCounters counters{};
  OPENREG_CHECK(orGetDebugCounters(&counters));
  py::dict d;
  d["set_device_calls"] = counters.set_device_calls;
  d["device_inits"] = counters.device_inits;
  d["mallocs"] = counters.mallocs;
  d["frees"] = counters.frees;
  d["kernels_launched"] = counters.kernels_launched;
  d["hooks_init_calls"] = openreg::hooks_init_calls();
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "OpenReg backend bindings (private; use torch.openreg)";

  m.def("_init", &lazy_init);
  m.def("_is_in_bad_fork", [] { return torch::utils::is_device_in_bad_fork(at::kPrivateUse1); });

  // Device management. Invalid indices raise RuntimeError naming the range.
  m.def("_device_count", [] { return static_cast<int>(openreg::device_count()); });
  m.def("_current_device", [] { return static_cast<int>(openreg::current_device()); });
  m.def("_set_device", [](int64_t index) {
    openreg::set_device(to_index(index, "device", false));
  });
  m.def("_exchange_device", [](int64_t index) {
    return static_cast<int>(openreg::exchange_device(to_index(index, "device", false)));
  });
  // Out-of-range (including other negative) indices leave the device as is.
  m.def("_maybe_exchange_device", [](int64_t index) {
    const auto narrowed = index < -1 || index > 127 ? -1 : index;
    return static_cast<int>(openreg::maybe_exchange_device(static_cast<c10::DeviceIndex>(narrowed)));
  });
  m.def("_is_device_initialized", [](int64_t index) {
    return index >= 0 && index < 128 &&
        openreg::is_device_initialized(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_synchronize", [](int64_t index) {
    const auto device = to_index(index, "device", true);
    py::gil_scoped_release no_gil;
    OPENREG_CHECK(orDeviceSynchronize(openreg::resolve_device_index(device)));
  });

  // Generators: the same objects PyTorch's random operators use.
  m.def("_default_generator", [](int64_t index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        openreg::default_generator(to_index(index, "device", true))));
  });

  // Instrumentation for the conformance suite and the tests.
  m.def("_runtime_counters", &runtime_counters);
  m.def("_empty_host_cache", [] { openreg::host_allocator()->empty_cache(); });
}
