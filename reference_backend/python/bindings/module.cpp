// openreg._C: Python bindings of the OpenReg backend. Importing this module
// loads libopenreg_torch, whose static registrations claim PrivateUse1 for the
// guard, hooks, allocators and kernels.
#include <Allocator.h>
#include <DeviceKernel.h>
#include <DeviceManagement.h>
#include <Exception.h>
#include <Generator.h>
#include <Hooks.h>
#include <MetaKernels.h>
#include <ProcessGroup.h>
#include <Stream.h>

#include "inductor.h"

#include <torch/headeronly/version.h>

#include <ATen/Context.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace py = pybind11;

namespace {

// A device index as Python passed it. Python ints are unbounded and wider
// than DeviceIndex (int8): they are checked before narrowing, so that
// set_device(300) or set_device(2**64) is an out-of-range error naming the
// given index, not device 44 or a TypeError.
struct PyIndex {
  int64_t value;   // meaningful unless `overflow`
  bool overflow;   // does not fit int64: out of range whatever the count
  std::string text;
};

PyIndex unpack_index(const py::handle& object, const char* argument = "device") {
  // Accepts int and anything with __index__; anything else is a TypeError.
  // bool has __index__ but is no device index (set_device rejects it too).
  if (PyBool_Check(object.ptr())) {
    throw py::type_error(std::string("OpenReg: ") + argument + " must be an int device "
                         "index, not bool (got " + (object.ptr() == Py_True ? "True" : "False") + ")");
  }
  const auto as_int = py::reinterpret_steal<py::object>(PyNumber_Index(object.ptr()));
  if (!as_int) throw py::error_already_set();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(as_int.ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  return {static_cast<int64_t>(value), overflow != 0, py::str(as_int).cast<std::string>()};
}

c10::DeviceIndex to_index(const py::handle& object, const char* argument,
                          bool allow_minus_one) {
  const PyIndex index = unpack_index(object, argument);
  const int64_t count = openreg::device_count();
  if (!index.overflow && allow_minus_one && index.value == -1) return -1;
  if (index.overflow || index.value < 0 || index.value >= count) {
    TORCH_CHECK(count > 0, "OpenReg: ", argument, "=", index.text,
                " is invalid: ", openreg::no_devices_reason());
    TORCH_CHECK(false, "OpenReg: ", argument, "=", index.text,
                " is out of range: valid device indices are [0, ", count, ")");
  }
  return static_cast<c10::DeviceIndex>(index.value);
}

// Set once Python's openreg._lazy_init() has completed (it calls _init).
std::atomic<bool> g_python_initialized{false};

void lazy_init() {
  TORCH_CHECK(!torch::utils::is_device_in_bad_fork(at::kPrivateUse1),
              "OpenReg: cannot re-initialize OpenReg in a forked subprocess. To "
              "use OpenReg with multiprocessing, use the 'spawn' start method");
  // A child forked after this point is marked "bad fork" by PyTorch.
  torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
  at::globalContext().lazyInitDevice(at::kPrivateUse1);
  g_python_initialized.store(true, std::memory_order_release);
}

// torch.openreg.current_device(): called often (generated Tensor methods,
// device-agnostic code), so the common case stays in C++; the first call
// goes through Python's lazy initialization, and a bad fork raises there.
int current_device_checked() {
  if (!g_python_initialized.load(std::memory_order_acquire) ||
      torch::utils::is_device_in_bad_fork(at::kPrivateUse1)) [[unlikely]] {
    py::module_::import("openreg").attr("_lazy_init")();
  }
  return static_cast<int>(openreg::current_device());
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
  d["live_events"] = counters.live_events;
  d["hooks_init_calls"] = openreg::hooks_init_calls();
  return d;
}

std::mutex& gates_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Testing gates (_testing_block_stream): the two words a held stream writes
// and waits on. Entries are kept for the process's life (8 bytes each): a
// stream may still read `opened` after the host set it.
struct Gate {
  uint32_t running = 0;
  uint32_t opened = 0;
};
struct GateEntry {
  Gate words;
  bool opened_by_host = false;
};
std::unordered_map<int64_t, std::unique_ptr<GateEntry>>& gates() {
  static auto* map = new std::unordered_map<int64_t, std::unique_ptr<GateEntry>>();
  return *map;
}
int64_t& next_gate_id() {
  static int64_t id = 1;
  return id;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "OpenReg backend bindings (private; use torch.openreg)";
  // The torch release these bindings were compiled against: C++ built for
  // one release must not run inside another (the ABI moves between them).
  m.attr("_built_with_torch") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                                "." + std::to_string(TORCH_VERSION_PATCH);

  // The creator torch.distributed calls for each group of the "orccl"
  // backend (openreg/distributed.py registers it for the device type).
  m.def("_create_process_group", [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                    int64_t timeout_ms) {
    return openreg::create_process_group(store, rank, size, std::chrono::milliseconds(timeout_ms));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_init", &lazy_init);
  m.def("_is_in_bad_fork", [] { return torch::utils::is_device_in_bad_fork(at::kPrivateUse1); });

  // Device management. Invalid indices raise RuntimeError naming the range.
  m.def("_device_count", [] { return static_cast<int>(openreg::device_count()); });
  m.def("_no_devices_reason", &openreg::no_devices_reason);
  m.def("_current_device", [] { return static_cast<int>(openreg::current_device()); });
  m.def("current_device", &current_device_checked,
        "Index of the current OpenReg device of the calling thread (0 in new threads).");
  m.def("_set_device", [](const py::object& index) {
    openreg::set_device(to_index(index, "device", false));
  });
  m.def("_exchange_device", [](const py::object& index) {
    return static_cast<int>(openreg::exchange_device(to_index(index, "device", false)));
  });
  // Out-of-range (including other negative) indices leave the device as is.
  m.def("_maybe_exchange_device", [](const py::object& object) {
    const PyIndex index = unpack_index(object);
    const auto narrowed =
        index.overflow || index.value < -1 || index.value > 127 ? -1 : index.value;
    return static_cast<int>(openreg::maybe_exchange_device(static_cast<c10::DeviceIndex>(narrowed)));
  });
  m.def("_is_device_initialized", [](const py::object& object) {
    const PyIndex index = unpack_index(object);
    return !index.overflow && index.value >= 0 && index.value < 128 &&
        openreg::is_device_initialized(static_cast<c10::DeviceIndex>(index.value));
  });
  m.def("_synchronize", [](const py::object& index) {
    const auto device = to_index(index, "device", true);
    py::gil_scoped_release no_gil;
    OPENREG_CHECK(orDeviceSynchronize(openreg::resolve_device_index(device)));
  });

  // Device loss (docs/reference-backend/runtime.md, "Device loss"): a fault
  // injected into one device, after which every call on it raises.
  m.def("_inject_device_fault", [](const py::object& index, const std::string& cause) {
    const auto device = openreg::resolve_device_index(to_index(index, "device", true));
    py::gil_scoped_release no_gil;
    OPENREG_CHECK(orDeviceInjectFault(device, cause.c_str()));
  }, py::arg("device"), py::arg("cause") = "");
  // Process mode (OPENREG_EXECUTOR=process): the executor process of an
  // initialized device (RuntimeError in thread mode).
  m.def("_executor_pid", [](const py::object& index) {
    const auto device = openreg::resolve_device_index(to_index(index, "device", true));
    int pid = 0;
    OPENREG_CHECK(orDeviceGetExecutorPid(device, &pid));
    return pid;
  }, py::arg("device"));
  m.def("_process_mode", [] { return openreg::process_mode(); });
  // PyTorch's process-wide settings that queued operators carry to the
  // executor (OperatorPayload.h), as the device's executor holds them now
  // and as this process does.
  m.def("_testing_executor_settings", [](int device) {
    pybind11::dict out;
    for (const auto& [name, value] : openreg::executor_settings(static_cast<c10::DeviceIndex>(device))) {
      out[pybind11::str(name)] = value;
    }
    return out;
  }, pybind11::arg("device"));
  m.def("_testing_host_settings", [] {
    pybind11::dict out;
    for (const auto& [name, value] : openreg::host_settings()) out[pybind11::str(name)] = value;
    return out;
  });
  m.def("_is_device_lost", [](const py::object& index) {
    const auto device = openreg::resolve_device_index(to_index(index, "device", true));
    int lost = 0;
    OPENREG_CHECK(orDeviceIsLost(device, &lost));
    return lost != 0;
  }, py::arg("device"));

  // Generators: the same objects PyTorch's random operators use.
  m.def("_default_generator", [](const py::object& index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        openreg::default_generator(to_index(index, "device", true))));
  });

  // Streams beyond what torch.Stream exposes.
  m.def("_stream_priority", [](const c10::Stream& stream) {
    return openreg::stream_priority(stream);
  });
  m.def("_default_stream", [](const py::handle& index) {
    return openreg::default_stream(to_index(index, "device", true));
  });
  // torch.Event.elapsed_time accepts only exact torch.Event objects (a type
  // check in torch/csrc/Event.cpp), not torch.openreg.Event, a subclass.
  m.def("_event_elapsed_time", [](const py::handle& start, const py::handle& end) {
    TORCH_CHECK_TYPE(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
                     "OpenReg: elapsed_time expects two torch.Event objects");
    return reinterpret_cast<THPEvent*>(start.ptr())->event.elapsedTime(
        reinterpret_cast<THPEvent*>(end.ptr())->event);
  });

  // Asynchronous operators (on by default; OPENREG_ASYNC_OPERATORS=0 turns
  // them off when the library loads): read and switch for the process.
  m.def("_async_operators", &openreg::async_operators);
  m.def("_set_async_operators", &openreg::set_async_operators, py::arg("on"));
  // Whether the asynchronous path asks PyTorch's C++ Meta kernel of an
  // operator overload (MetaKernels.h), and how many have one.
  m.def("_has_cxx_meta_kernel", [](const std::string& name, const std::string& overload) {
    return openreg::cxx_meta_kernel(c10::OperatorName(name, overload)) != nullptr;
  }, py::arg("name"), py::arg("overload"));
  m.def("_cxx_meta_kernel_count", &openreg::cxx_meta_kernel_count);
  m.def("_async_operator_launches", &openreg::async_operator_launches);

  // Testing aid: a kernel that blocks `stream` until the gate is opened,
  // so that tests can observe work still in flight without guessing at
  // sleeps. Returns a gate id for _testing_open_gate.
  m.def("_testing_block_stream", [](const c10::Stream& stream) {
    // Stream memory operations, which work in both execution modes: the
    // stream writes `running` when it reaches the hold, then waits for
    // `opened`. The call returns with the hold in effect: the stream's last
    // task is running (not merely queued).
    Gate* gate = nullptr;
    int64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(gates_mutex());
      id = next_gate_id()++;
      gate = &gates().emplace(id, std::make_unique<GateEntry>()).first->second->words;
    }
    const orStream_t native = openreg::native_stream(stream);
    OPENREG_CHECK(orStreamWriteValue32(native, &gate->running, 1));
    OPENREG_CHECK(orStreamWaitValue32(native, &gate->opened, 1));
    // Bounded: work queued before the gate (or a wait on another held
    // stream) may keep it from starting; the hold is in effect either way.
    py::gil_scoped_release no_gil;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (__atomic_load_n(&gate->running, __ATOMIC_ACQUIRE) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return id;
  });
  m.def("_testing_open_gate", [](int64_t id) {
    std::lock_guard<std::mutex> lock(gates_mutex());
    auto it = gates().find(id);
    TORCH_CHECK(it != gates().end(), "OpenReg: no gate ", id);
    TORCH_CHECK(!it->second->opened_by_host, "OpenReg: gate ", id, " is already open");
    it->second->opened_by_host = true;
    // The entry stays: the stream may read the word after this store.
    __atomic_store_n(&it->second->words.opened, 1u, __ATOMIC_RELEASE);
  });

  // The floor for benchmarks: a pybind11 call that does nothing.
  m.def("_noop", [] {});

  // Instrumentation for the conformance suite and the tests.
  m.def("_runtime_counters", &runtime_counters);
  openreg_bindings::add_inductor_api(m);
  m.def("_empty_host_cache", [] { openreg::host_allocator()->empty_cache(); });
  m.def("_set_memory_fraction", [](double fraction, int device) {
    openreg::set_memory_fraction(static_cast<c10::DeviceIndex>(device), fraction);
  });
  m.def("_get_memory_fraction",
        [](int device) { return openreg::memory_fraction(static_cast<c10::DeviceIndex>(device)); });
}
