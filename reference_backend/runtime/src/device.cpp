// Configuration, errors, devices and the per-thread current device.
#include "executor_protocol.h"
#include "internal.h"

#include <pthread.h>

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace openreg::runtime {

namespace {

thread_local std::string tls_last_error;
// Every thread starts on device 0. initial-exec: the fastest TLS access for
// a variable read on every device query (the library is small enough to fit
// in the static TLS surplus that dlopen'ed libraries may use).
__attribute__((tls_model("initial-exec"))) thread_local int tls_current_device = 0;
// True once the configuration parsed cleanly with at least one device: the
// hot queries then skip their error checks.
std::atomic<bool> g_devices_usable{false};

std::atomic<Device*> g_devices[OR_MAX_DEVICE_COUNT];
std::mutex g_init_mutex;
std::atomic<bool> g_any_initialized{false};
std::atomic<bool> g_forked_after_init{false};

void on_fork_child() {
  // The parent's stream workers do not exist here and the device memory is
  // shared with the parent: a child must not touch any of it.
  if (g_any_initialized.load()) {
    g_forked_after_init.store(true);
  }
}

// Parses a size with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB).
bool parse_size(const char* text, size_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (!std::isdigit(static_cast<unsigned char>(text[0])) || errno != 0) return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GiB") shift = 30;
  else if (suffix == "T" || suffix == "TiB") shift = 40;
  else return false;
  if (shift && value > (ULLONG_MAX >> shift)) return false;
  *out = static_cast<size_t>(value << shift);
  return true;
}

Config parse_config() {
  Config c;
  c.device_count = OR_DEFAULT_DEVICE_COUNT;
  c.device_memory = OR_DEFAULT_DEVICE_MEMORY;
  if (const char* text = std::getenv("OPENREG_DEVICE_COUNT")) {
    errno = 0;
    char* end = nullptr;
    long value = std::strtol(text, &end, 10);
    // strtol skips leading blanks and signs: accept plain digits only.
    if (!std::isdigit(static_cast<unsigned char>(text[0])) || *end != '\0' || errno != 0 ||
        value > OR_MAX_DEVICE_COUNT) {
      c.error = orErrorInitialization;
      c.error_message = std::string("OPENREG_DEVICE_COUNT='") + text +
          "' is invalid: expected an integer in [0, " +
          std::to_string(OR_MAX_DEVICE_COUNT) +
          "] (PyTorch's DeviceIndex cannot address more devices)";
      c.device_count = 0;
      return c;
    }
    c.device_count = static_cast<int>(value);
  }
  if (const char* text = std::getenv("OPENREG_DEVICE_MEMORY")) {
    size_t bytes = 0;
    constexpr size_t kMin = 1ull << 16, kMax = 1ull << 40;
    if (!parse_size(text, &bytes) || bytes < kMin || bytes > kMax) {
      c.error = orErrorInitialization;
      c.error_message = std::string("OPENREG_DEVICE_MEMORY='") + text +
          "' is invalid: expected a byte count in [65536, 1099511627776], "
          "optionally with a suffix K, M, G or T (binary units)";
      c.device_count = 0;
      return c;
    }
    c.device_memory = bytes;
  }
  if (const char* text = std::getenv("OPENREG_EXECUTOR"); text && *text) {
    if (std::strcmp(text, "process") == 0) {
      c.process_mode = true;
    } else if (std::strcmp(text, "thread") != 0) {
      c.error = orErrorInitialization;
      c.error_message = std::string("OPENREG_EXECUTOR='") + text +
          "' is invalid: expected 'thread' (devices in this process, the default) or "
          "'process' (each device an executor process)";
      c.device_count = 0;
      return c;
    }
  }
  return c;
}

}  // namespace

std::atomic<uint64_t> g_set_device_calls{0};
std::atomic<uint64_t> g_device_inits{0};
std::atomic<uint64_t> g_mallocs{0};
std::atomic<uint64_t> g_frees{0};
std::atomic<uint64_t> g_kernels{0};

orError_t fail(orError_t code, const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  tls_last_error = buffer;
  return code;
}

void clear_last_error() { tls_last_error.clear(); }

const Config& config() {
  static const Config parsed = [] {
    pthread_atfork(nullptr, nullptr, on_fork_child);
    Config c = parse_config();
    g_devices_usable.store(c.error == orSuccess && c.device_count > 0, std::memory_order_release);
    return c;
  }();
  return parsed;
}

orError_t check_not_forked(const char* call) {
  if (g_forked_after_init.load(std::memory_order_relaxed)) {
    return fail(orErrorForkedProcess,
                "%s: the OpenReg runtime was initialized before this process "
                "was forked; devices cannot be used in the child (start "
                "children with the 'spawn' method instead)",
                call);
  }
  return orSuccess;
}

orError_t current_device(const char* call, int* device) {
  const Config& c = config();
  if (c.error != orSuccess) {
    return fail(c.error, "%s: %s", call, c.error_message.c_str());
  }
  if (c.device_count == 0) {
    return fail(orErrorNoDevice, "%s: there are no OpenReg devices "
                "(OPENREG_DEVICE_COUNT=0)", call);
  }
  *device = tls_current_device;
  return orSuccess;
}

orError_t check_device(const char* call, const char* argument, int device) {
  const Config& c = config();
  if (c.error != orSuccess) {
    return fail(c.error, "%s: %s", call, c.error_message.c_str());
  }
  if (c.device_count == 0) {
    return fail(orErrorNoDevice, "%s: %s=%d is invalid: there are no OpenReg "
                "devices (OPENREG_DEVICE_COUNT=0)", call, argument, device);
  }
  if (device < 0 || device >= c.device_count) {
    return fail(orErrorInvalidDevice,
                "%s: %s=%d is out of range: valid devices are [0, %d)", call,
                argument, device, c.device_count);
  }
  return orSuccess;
}

Device* device_if_initialized(int device) {
  if (device < 0 || device >= OR_MAX_DEVICE_COUNT) return nullptr;
  return g_devices[device].load(std::memory_order_acquire);
}

orError_t get_device(const char* call, int device, Device** out) {
  if (orError_t e = check_device(call, "device", device)) return e;
  if (orError_t e = check_not_forked(call)) return e;
  Device* d = g_devices[device].load(std::memory_order_acquire);
  if (d) {
    *out = d;
    if (d->lost.load(std::memory_order_acquire)) return fail_lost(call, device);
    return orSuccess;
  }
  std::lock_guard<std::mutex> lock(g_init_mutex);
  d = g_devices[device].load(std::memory_order_acquire);
  if (!d) {
    auto* fresh = new Device(device, config().device_memory);
    std::string error;
    if (config().process_mode) {
      // The arena's discard reaches the executor, which exists before any
      // allocation can be freed.
      const bool reserved = fresh->arena.init_reserved(&error, [fresh](void* start, size_t count) {
        fresh->executor->request("orFree", openreg::executor::kDiscard,
                                 reinterpret_cast<uintptr_t>(start), 0, count);
        clear_last_error();  // a lost executor has nothing to give back
      });
      if (reserved) {
        fresh->executor = Executor::start(fresh, &error);
        if (!fresh->executor) {
          return fail(orErrorInitialization, "%s: cannot initialize device %d: %s", call,
                      device, error.c_str());
        }
      } else {
        return fail(orErrorMemoryAllocation, "%s: cannot initialize device %d: %s",
                    call, device, error.c_str());
      }
    } else if (!fresh->arena.init(&error)) {
      // Leaks the half-built device on purpose: it holds no resources.
      return fail(orErrorMemoryAllocation, "%s: cannot initialize device %d: %s",
                  call, device, error.c_str());
    }
    StreamRef stream = new_stream(fresh, 0, /*is_default=*/true);
    fresh->default_stream = stream;
    {
      // An executor's monitor may lose the device already (lose_device).
      std::lock_guard<std::mutex> streams_lock(fresh->streams_mutex);
      fresh->streams.push_back(stream);
    }
    g_devices[device].store(fresh, std::memory_order_release);
    g_any_initialized.store(true);
    g_device_inits.fetch_add(1);
    d = fresh;
  }
  *out = d;
  if (d->lost.load(std::memory_order_acquire)) return fail_lost(call, device);
  return orSuccess;
}

void lose_device(Device* d, const std::string& cause) {
  {
    std::lock_guard<std::mutex> lock(d->lost_mutex);
    if (d->lost.load(std::memory_order_acquire)) return;  // the first cause stays
    d->lost_cause = cause;
    d->lost.store(true, std::memory_order_release);
  }
  // Wake every thread waiting for one of its streams, and its workers: taking
  // each stream's mutex after setting the flag means no waiter can check the
  // flag before it was set and then sleep through this notification.
  std::vector<StreamRef> streams;
  {
    std::lock_guard<std::mutex> lock(d->streams_mutex);
    streams = d->streams;
  }
  for (const StreamRef& s : streams) {
    { std::lock_guard<std::mutex> lock(s->mutex); }
    s->work_done.notify_all();
    s->work_ready.notify_all();
  }
}

bool device_lost(int device) {
  Device* d = device_if_initialized(device);
  return d && d->lost.load(std::memory_order_acquire);
}

orError_t fail_lost(const char* call, int device) {
  Device* d = device_if_initialized(device);
  std::string cause;
  if (d) {
    std::lock_guard<std::mutex> lock(d->lost_mutex);
    cause = d->lost_cause;
  }
  return fail(orErrorDeviceLost, "%s: OpenReg device %d was lost: %s. Its memory and queued work "
              "are gone and every later call on it fails; the other devices keep working",
              call, device, cause.c_str());
}

Device* device_owning(const void* ptr) {
  const int count = config().device_count;
  for (int i = 0; i < count; ++i) {
    Device* d = device_if_initialized(i);
    if (d && d->arena.contains(ptr)) return d;
  }
  return nullptr;
}

}  // namespace openreg::runtime

using namespace openreg::runtime;

extern "C" {

const char* orGetErrorName(orError_t error) {
  switch (error) {
    case orSuccess: return "orSuccess";
    case orErrorInvalidValue: return "orErrorInvalidValue";
    case orErrorInvalidDevice: return "orErrorInvalidDevice";
    case orErrorMemoryAllocation: return "orErrorMemoryAllocation";
    case orErrorInvalidPointer: return "orErrorInvalidPointer";
    case orErrorNotReady: return "orErrorNotReady";
    case orErrorInvalidHandle: return "orErrorInvalidHandle";
    case orErrorDeviceMismatch: return "orErrorDeviceMismatch";
    case orErrorNoDevice: return "orErrorNoDevice";
    case orErrorInitialization: return "orErrorInitialization";
    case orErrorForkedProcess: return "orErrorForkedProcess";
    case orErrorKernelFailed: return "orErrorKernelFailed";
    case orErrorNotPermitted: return "orErrorNotPermitted";
    case orErrorDeviceLost: return "orErrorDeviceLost";
    case orErrorNotSupported: return "orErrorNotSupported";
  }
  return "orErrorUnknown";
}

const char* orGetLastErrorMessage(void) { return tls_last_error.c_str(); }

orError_t orGetDeviceCount(int* count) {
  if (!count) return fail(orErrorInvalidValue, "orGetDeviceCount: count is null");
  const Config& c = config();
  *count = c.device_count;
  if (c.error != orSuccess) {
    return fail(c.error, "orGetDeviceCount: %s", c.error_message.c_str());
  }
  return orSuccess;
}

orError_t orGetDevice(int* device) {
  if (g_devices_usable.load(std::memory_order_acquire) && device) [[likely]] {
    *device = tls_current_device;
    return orSuccess;
  }
  if (!device) return fail(orErrorInvalidValue, "orGetDevice: device is null");
  return current_device("orGetDevice", device);
}

orError_t orSetDevice(int device) {
  if (!(g_devices_usable.load(std::memory_order_acquire) && device >= 0 &&
        device < config().device_count)) [[unlikely]] {
    if (orError_t e = check_device("orSetDevice", "device", device)) return e;
  }
  // Every call counts, redundant ones included: the counter exists so that
  // callers can check they skip redundant switches (as a real driver call
  // would cost them).
  g_set_device_calls.fetch_add(1, std::memory_order_relaxed);
  tls_current_device = device;
  return orSuccess;
}

orError_t orDeviceIsInitialized(int device, int* initialized) {
  if (!initialized) {
    return fail(orErrorInvalidValue, "orDeviceIsInitialized: initialized is null");
  }
  if (orError_t e = check_device("orDeviceIsInitialized", "device", device)) {
    return e;
  }
  // A forked child inherits the parent's table but owns none of it.
  *initialized = device_if_initialized(device) != nullptr &&
      !g_forked_after_init.load();
  return orSuccess;
}

orError_t orDeviceInit(int device) {
  Device* d = nullptr;
  return get_device("orDeviceInit", device, &d);
}

orError_t orDeviceSynchronize(int device) {
  // A device that was never used has no work: nothing to wait for, and no
  // reason to initialize it.
  if (orError_t e = check_device("orDeviceSynchronize", "device", device)) return e;
  if (orError_t e = check_not_forked("orDeviceSynchronize")) return e;
  Device* d = device_if_initialized(device);
  if (!d) return orSuccess;
  if (d->lost.load(std::memory_order_acquire)) return fail_lost("orDeviceSynchronize", device);
  std::vector<StreamRef> streams;
  {
    std::lock_guard<std::mutex> lock(d->streams_mutex);
    streams = d->streams;
  }
  orError_t first = orSuccess;
  for (const StreamRef& s : streams) {
    orError_t e = orStreamSynchronize(s.get());
    // A stream destroyed meanwhile has finished its work: not an error here.
    if (e != orSuccess && e != orErrorInvalidHandle && first == orSuccess) {
      first = e;
    }
  }
  if (first != orSuccess) {
    std::string inner = orGetLastErrorMessage();
    return fail(first, "orDeviceSynchronize(device=%d): %s", device, inner.c_str());
  }
  return orSuccess;
}

orError_t orDeviceGetMemoryInfo(int device, size_t* free_bytes,
                                size_t* total_bytes) {
  if (!free_bytes || !total_bytes) {
    return fail(orErrorInvalidValue, "orDeviceGetMemoryInfo: free_bytes and "
                "total_bytes must not be null");
  }
  if (orError_t e = check_device("orDeviceGetMemoryInfo", "device", device)) {
    return e;
  }
  // Answering does not need the device: an uninitialized device is all free.
  const size_t total = config().device_memory;
  Device* d = device_if_initialized(device);
  if (d && d->lost.load(std::memory_order_acquire)) return fail_lost("orDeviceGetMemoryInfo", device);
  *total_bytes = total;
  *free_bytes = d ? total - d->arena.used() : total;
  return orSuccess;
}

orError_t orDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (!least || !greatest) {
    return fail(orErrorInvalidValue, "orDeviceGetStreamPriorityRange: least and "
                "greatest must not be null");
  }
  *least = 0;
  *greatest = -1;
  return orSuccess;
}

orError_t orDeviceInjectFault(int device, const char* cause) {
  const char* call = "orDeviceInjectFault";
  if (orKernelCurrentDevice() >= 0) {
    return fail(orErrorNotPermitted, "%s: kernels may not lose devices", call);
  }
  Device* d = nullptr;
  const orError_t e = get_device(call, device, &d);
  if (e == orErrorDeviceLost) {
    clear_last_error();
    return orSuccess;  // the first cause stays
  }
  if (e != orSuccess) return e;
  lose_device(d, cause && *cause ? cause : "a fault injected by orDeviceInjectFault");
  // In process mode the device's memory goes with its executor, as on a
  // device that fell off the bus.
  if (d->executor) d->executor->kill();
  return orSuccess;
}

orError_t orGetExecutionMode(int* process) {
  if (!process) return fail(orErrorInvalidValue, "orGetExecutionMode: process is null");
  const Config& c = config();
  if (c.error != orSuccess) return fail(c.error, "orGetExecutionMode: %s", c.error_message.c_str());
  *process = c.process_mode ? 1 : 0;
  return orSuccess;
}

orError_t orDeviceGetExecutorPid(int device, int* pid) {
  const char* call = "orDeviceGetExecutorPid";
  if (!pid) return fail(orErrorInvalidValue, "%s: pid is null", call);
  if (orError_t e = check_device(call, "device", device)) return e;
  if (!config().process_mode) {
    return fail(orErrorNotSupported, "%s: devices have no executor processes in thread mode "
                "(OPENREG_EXECUTOR=process starts them)", call);
  }
  Device* d = device_if_initialized(device);
  if (!d || !d->executor) {
    return fail(orErrorInvalidValue, "%s: device %d is not initialized", call, device);
  }
  *pid = d->executor->pid();
  return orSuccess;
}

orError_t orDeviceIsLost(int device, int* lost) {
  if (!lost) return fail(orErrorInvalidValue, "orDeviceIsLost: lost is null");
  if (orError_t e = check_device("orDeviceIsLost", "device", device)) return e;
  *lost = device_lost(device) ? 1 : 0;
  return orSuccess;
}

orError_t orGetDebugCounters(orDebugCounters* counters) {
  if (!counters) {
    return fail(orErrorInvalidValue, "orGetDebugCounters: counters is null");
  }
  counters->set_device_calls = g_set_device_calls.load();
  counters->device_inits = g_device_inits.load();
  counters->mallocs = g_mallocs.load();
  counters->frees = g_frees.load();
  counters->kernels_launched = g_kernels.load();
  counters->live_events = live_event_count();
  return orSuccess;
}

}  // extern "C"
