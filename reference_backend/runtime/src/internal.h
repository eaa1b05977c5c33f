// Internal structures of the OpenReg runtime. Not installed; not used outside
// runtime/src.
#pragma once

#include <openreg/runtime.h>

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace openreg::runtime {

// Records `message` as this thread's last error and returns `code`.
orError_t fail(orError_t code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

void clear_last_error();

struct Config {
  int device_count = 0;
  size_t device_memory = 0;
  bool process_mode = false;  // OPENREG_EXECUTOR=process
  orError_t error = orSuccess;  // set when the environment is invalid
  std::string error_message;
};
// Parsed once from the environment, on first use.
const Config& config();

// Validates `device` against the configured count; `call` names the caller.
orError_t check_device(const char* call, const char* argument, int device);

// The calling thread's current device; fails (naming `call`) when the
// configuration is invalid or there are no devices.
orError_t current_device(const char* call, int* device);

// Fails with orErrorForkedProcess in a child forked after initialization.
orError_t check_not_forked(const char* call);

// One device's memory: a memfd mapped twice. The "device view" is PROT_NONE,
// so host dereferences of device pointers fault; the "kernel view" is the
// read-write alias that copies and kernels use.
class Arena {
 public:
  Arena(int device, size_t capacity);
  // Arenas are never destroyed: devices live until the process ends.

  bool init(std::string* error);
  // Process mode: reserves the device's addresses (PROT_NONE, no memory
  // behind them); the executor maps the memory at the same addresses.
  // `discard` gives whole pages of a freed block back (in the executor).
  bool init_reserved(std::string* error,
                     std::function<void(void* start, size_t count)> discard);
  // Returns the device pointer, or nullptr when out of memory.
  void* allocate(size_t size);
  // false if `ptr` is not the start of a live allocation.
  bool release(void* ptr);
  bool contains(const void* ptr) const {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto b = reinterpret_cast<uintptr_t>(device_base_);
    return p >= b && p < b + capacity_;
  }
  // Finds the live allocation containing [ptr, ptr+count); false if none.
  bool find(const void* ptr, size_t count, void** base, size_t* size) const;
  void* base() const { return device_base_; }
  // Kernel-view alias of a device pointer inside this arena (thread mode).
  void* kernel_alias(const void* ptr) const {
    return kernel_base_ + (static_cast<const char*>(ptr) - device_base_);
  }
  // The device pointer whose kernel-view alias is `alias`, or nullptr when
  // `alias` is outside this arena's kernel view (thread mode).
  const void* device_of_kernel_alias(const void* alias) const {
    const char* a = static_cast<const char*>(alias);
    if (!kernel_base_ || a < kernel_base_ || a >= kernel_base_ + capacity_) return nullptr;
    return device_base_ + (a - kernel_base_);
  }
  size_t capacity() const { return capacity_; }
  size_t used() const;

 private:
  // Sizes are reserved in OR_ALLOCATION_ALIGNMENT steps, but range checks and
  // pointer attributes use the size the caller asked for.
  struct Allocation {
    size_t reserved;
    size_t requested;
  };

  void insert_free(size_t offset, size_t size);
  void erase_free(size_t offset, size_t size);
  // Discards the whole pages inside [offset, offset+size) (they read as zero
  // afterwards). Only for blocks that no one can be handed meanwhile.
  void punch(size_t offset, size_t size);

  int device_;
  size_t capacity_;  // exactly the configured bytes: the accounting limit
  size_t mapped_;    // capacity_ rounded up to whole pages
  int fd_ = -1;
  std::function<void(void*, size_t)> discard_;  // process mode
  char* device_base_ = nullptr;
  char* kernel_base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_by_offset_;
  std::set<std::pair<size_t, size_t>> free_by_size_;  // (size, offset)
  std::map<size_t, Allocation> allocated_;            // by offset
  size_t used_ = 0;
};

struct Marker {
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point time;
};

struct Task {
  std::function<orError_t()> work;   // empty for pure markers
  std::shared_ptr<Marker> marker;    // completed after `work`, if set
  const char* what = "kernel";       // what the work is, for graph dumps
};

// The work recorded by a capturing stream (orStreamBeginCapture).
struct Capture {
  std::vector<Task> tasks;
  // The first call refused during the capture ("" while none was).
  std::string invalidated;
};

}  // namespace openreg::runtime

struct orStream {
  static constexpr uint32_t kLive = 0x5354524d;  // "STRM"
  std::atomic<uint32_t> magic{kLive};
  int device = 0;
  // The device's lost flag (Device::lost): waiters stop waiting and the
  // worker stops running tasks once it is set.
  const std::atomic<bool>* lost = nullptr;
  int priority = 0;
  bool is_default = false;

  std::mutex mutex;
  std::condition_variable work_ready;
  std::condition_variable work_done;
  std::deque<openreg::runtime::Task> queue;
  uint64_t submitted = 0;  // tasks ever enqueued
  uint64_t completed = 0;  // tasks finished, in order
  // Copies of the two counters, read without the mutex by the short spins of
  // waiters and of the idle worker (see spin_until in stream.cpp).
  std::atomic<uint64_t> submitted_hint{0};
  std::atomic<uint64_t> completed_hint{0};
  bool stopping = false;
  // A kernel of orLaunchKernelSync runs on the calling thread; the worker
  // holds queued work back until it has completed.
  bool inline_running = false;
  std::string kernel_error;  // sticky error of a failed kernel
  // Set while the stream captures: enqueue records work here instead.
  std::unique_ptr<openreg::runtime::Capture> capture;
  std::thread worker;

  // Enqueues and returns the task's sequence number (1-based); while the
  // stream captures, records the task in the capture and returns 0.
  uint64_t enqueue(openreg::runtime::Task task);
  void wait_for(uint64_t seq);
  bool reached(uint64_t seq);
  // Marks the end of task `error`'s run (the worker's or an inline one).
  void complete(std::string error);
  void run();
};

struct orEvent {
  static constexpr uint32_t kLive = 0x45564e54;  // "EVNT"
  std::atomic<uint32_t> magic{kLive};
  int device = 0;
  bool timing = true;
  std::mutex mutex;
  // The stream of the last record (null if never recorded). Shared: waiting
  // on the event reads the stream's progress even after it was destroyed.
  std::shared_ptr<orStream> stream;
  uint64_t seq = 0;
  std::shared_ptr<openreg::runtime::Marker> marker;
};

struct orGraph {
  static constexpr uint32_t kLive = 0x47525048;  // "GRPH"
  std::atomic<uint32_t> magic{kLive};
  int device = 0;
  std::vector<openreg::runtime::Task> tasks;  // in capture order, no markers
};

namespace openreg::runtime {

class Executor;

struct Device {
  explicit Device(int index, size_t capacity)
      : index(index), arena(index, capacity) {}
  int index;
  Arena arena;
  // Process mode: the device's executor process (null in thread mode).
  // Never destroyed, like the device.
  Executor* executor = nullptr;
  std::shared_ptr<orStream> default_stream;
  std::mutex streams_mutex;
  std::vector<std::shared_ptr<orStream>> streams;  // live, default included
  // Device loss (orDeviceInjectFault): set once, never cleared.
  std::atomic<bool> lost{false};
  std::mutex lost_mutex;
  std::string lost_cause;
};

// Loses `d` with `cause` (the first cause stays) and wakes its waiters.
void lose_device(Device* d, const std::string& cause);

// Process mode: the host side of one device's executor process
// (executor.cpp; the protocol is executor_protocol.h).
class Executor {
 public:
  // Starts the executor of `d`, whose memory the arena has reserved, and
  // waits until it serves requests. nullptr with `error` set on failure.
  static Executor* start(Device* d, std::string* error);
  // One request, run in the executor; returns its status and sets the
  // thread's last error (naming `call`) on failure. orErrorDeviceLost once
  // the executor is gone.
  orError_t request(const char* call, uint32_t command, uint64_t a, uint64_t b, uint64_t c,
                    const void* payload = nullptr, size_t payload_size = 0);
  // Copies between host memory here and device memory in the executor.
  orError_t write(const char* call, void* device_dst, const void* host_src, size_t count);
  orError_t read(const char* call, void* host_dst, const void* device_src, size_t count);
  // Writes `count` runs: local[i] (host) to remote[i] (device), equal lengths.
  orError_t write_runs(const char* call, const iovec* local, const iovec* remote, size_t count);
  int pid() const { return pid_; }
  // Ends the executor (SIGKILL); its monitor then loses the device.
  void kill();

 private:
  explicit Executor(Device* d) : device_(d) {}
  void monitor(std::string path);
  int acquire_channel();
  void release_channel(int index);

  Device* device_;
  int fd_ = -1;
  void* shared_ = nullptr;  // executor::Shared
  std::atomic<int> pid_{-1};
  // Set once the executor has exited, before it is reaped; copies and
  // signals hold it shared, so none reaches a process that reuses the pid.
  std::shared_mutex gone_mutex_;
  bool gone_ = false;
  std::mutex start_mutex_;
  std::condition_variable started_;
  bool spawned_ = false;
  std::string spawn_error_;
  std::mutex channels_mutex_;
  std::condition_variable channel_free_;
  std::vector<int> free_channels_;
};

// Process mode: runs the host-function kernel `fn(arg)` of device `d` on
// the calling thread (a kernel of `d`: the task of a stream, or an inline
// orLaunchKernelSync) over staged host copies of the device memory it maps,
// and writes back the bytes it changed when it returns (staging.cpp).
orError_t run_staged_host_kernel(Device* d, orKernelFn fn, void* arg);
// orKernelMapPointer in process mode, inside run_staged_host_kernel.
orError_t staged_map_pointer(const char* call, Device* d, const void* device_ptr, size_t count,
                             void** accessible);
// orKernelMarkWritten in process mode, inside run_staged_host_kernel.
orError_t staged_mark_written(const char* call, Device* d, void* accessible, size_t count);

// Fails with orErrorDeviceLost, naming `call`, the device and the cause.
orError_t fail_lost(const char* call, int device);
// Whether `device` was lost (false for an uninitialized device).
bool device_lost(int device);

// The device if initialized, else nullptr. Never initializes.
Device* device_if_initialized(int device);
// Initializes on first use. `call` names the caller for error messages.
orError_t get_device(const char* call, int device, Device** out);
// The device owning `ptr` (device memory), or nullptr.
Device* device_owning(const void* ptr);

// Streams and events are owned jointly: the handle table holds one reference
// until orStreamDestroy/orEventDestroy, and every call, event record and
// pending cross-stream wait that uses one holds another while it does. An
// object is freed when the last of them lets go, never under a running call.
using StreamRef = std::shared_ptr<orStream>;
using EventRef = std::shared_ptr<orEvent>;

// Creates a stream of `device` with its worker thread and registers its handle.
StreamRef new_stream(Device* device, int priority, bool is_default);

// Resolves nullptr to the current device's default stream and validates.
// A stream of a lost device fails (orErrorDeviceLost) unless `allow_lost`.
orError_t resolve_stream(const char* call, orStream_t stream, StreamRef* out,
                         bool allow_lost = false);

// Validates an event handle; an event of a lost device fails unless `allow_lost`.
orError_t resolve_event(const char* call, const char* argument, orEvent_t event,
                        EventRef* out, bool allow_lost = false);

// Runs `work` as the next task of `s` and returns when it and everything
// before it has completed, with the stream's sticky error (as
// orStreamSynchronize). On an idle stream `work` runs on the calling thread,
// as a kernel of the stream's device, while the worker holds later work back.
// Counted as a kernel launch if `is_kernel`. `call` names the caller in errors.
orError_t run_and_wait(const char* call, const StreamRef& s, std::function<orError_t()> work,
                       bool is_kernel);

// Events created and not yet destroyed.
uint64_t live_event_count();

extern std::atomic<uint64_t> g_set_device_calls;
extern std::atomic<uint64_t> g_device_inits;
extern std::atomic<uint64_t> g_mallocs;
extern std::atomic<uint64_t> g_frees;
extern std::atomic<uint64_t> g_kernels;

}  // namespace openreg::runtime
