// Streams (one worker thread each), kernels and events.
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <unordered_map>

namespace openreg::runtime {

namespace {

// Set on worker threads while a task runs: the device whose memory it may map.
thread_local int tls_kernel_device = -1;
thread_local std::string* tls_kernel_error = nullptr;

// The handle tables: each holds its objects' first reference.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const orStream*, StreamRef> streams;
  std::unordered_map<const orEvent*, EventRef> events;
  std::unordered_map<const orGraph*, std::shared_ptr<orGraph>> graphs;
};
Registry& registry() {
  static auto* r = new Registry();  // leaked: workers may outlive statics
  return *r;
}

}  // namespace

uint64_t live_event_count() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.events.size();
}

namespace {

StreamRef find_stream(const orStream* s) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.streams.find(s);
  return it == r.streams.end() ? nullptr : it->second;
}

void name_thread(std::thread& t, int device, const void* stream, bool is_default) {
  char name[16];
  std::snprintf(name, sizeof(name), is_default ? "openreg%d-dflt" : "openreg%d-%04x",
                device, static_cast<unsigned>(reinterpret_cast<uintptr_t>(stream) >> 4) & 0xffff);
  pthread_setname_np(t.native_handle(), name);
}

}  // namespace

StreamRef new_stream(Device* d, int priority, bool is_default) {
  const int device = d->index;
  auto s = std::make_shared<orStream>();
  s->device = device;
  s->lost = &d->lost;
  s->priority = priority;
  s->is_default = is_default;
  // The worker may use the raw pointer: the object outlives it (destroying a
  // stream joins the worker before dropping the table's reference).
  orStream* raw = s.get();
  s->worker = std::thread([raw] { raw->run(); });
  name_thread(s->worker, device, raw, is_default);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.streams.emplace(raw, s);
  return s;
}

orError_t resolve_event(const char* call, const char* argument, orEvent_t event,
                        EventRef* out, bool allow_lost) {
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.events.find(event);
    if (it != r.events.end()) {
      *out = it->second;
    }
  }
  if (*out) {
    if (!allow_lost && device_lost((*out)->device)) return fail_lost(call, (*out)->device);
    return orSuccess;
  }
  return fail(orErrorInvalidHandle, "%s: %s=%p is not a live OpenReg event "
              "(destroyed or never created)", call, argument,
              static_cast<void*>(event));
}

orError_t resolve_stream(const char* call, orStream_t stream, StreamRef* out,
                         bool allow_lost) {
  if (orError_t e = check_not_forked(call)) return e;
  if (!stream) {
    int device = 0;
    if (orError_t e = current_device(call, &device)) return e;
    Device* d = nullptr;
    if (orError_t e = get_device(call, device, &d)) return e;
    *out = d->default_stream;
    return orSuccess;
  }
  StreamRef found = find_stream(stream);
  if (!found) {
    return fail(orErrorInvalidHandle, "%s: stream=%p is not a live OpenReg "
                "stream (destroyed or never created)", call,
                static_cast<void*>(stream));
  }
  if (!allow_lost && found->lost->load(std::memory_order_acquire)) {
    return fail_lost(call, found->device);
  }
  *out = std::move(found);
  return orSuccess;
}

}  // namespace openreg::runtime

using namespace openreg::runtime;

namespace openreg::runtime {
namespace {

// Polls `ready` for up to kSpin before the caller sleeps on a condition
// variable. A thread put to sleep takes tens of microseconds to wake (far
// more in a virtual machine) while a small operator takes a few: a waiter
// whose work is about to finish, or an idle worker whose next task is about
// to come, saves the wake-up. It only decides how a thread waits, never what
// it waits for: every outcome is then checked again under the stream's mutex.
constexpr auto kSpin = std::chrono::microseconds(50);

template <typename Ready>
bool spin_until(Ready ready) {
  // Process mode: three threads take part in a round trip (the waiting
  // host, the stream's worker, the executor's channel thread), often more
  // than there are CPUs; a spinner that gives its CPU away between polls
  // lets the others run (with the executor's side doing the same, a
  // round trip of 70 us became 7 us on two vCPUs: executor.md).
  // Thread mode has two, and yielding only delays them.
  static const bool yield = config().process_mode;
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (yield) sched_yield();
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

}  // namespace
}  // namespace openreg::runtime

uint64_t orStream::enqueue(Task task) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (capture) {
      capture->tasks.push_back(std::move(task));
      return 0;
    }
    queue.push_back(std::move(task));
    seq = ++submitted;
    submitted_hint.store(seq, std::memory_order_release);
  }
  work_ready.notify_one();
  return seq;
}

bool orStream::reached(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex);
  return completed >= seq;
}

void orStream::wait_for(uint64_t seq) {
  // A lost device's running kernel may never end: waiters stop waiting at the
  // loss (orDeviceInjectFault wakes them).
  spin_until([&] {
    return completed_hint.load(std::memory_order_acquire) >= seq || lost->load(std::memory_order_acquire);
  });
  std::unique_lock<std::mutex> lock(mutex);
  work_done.wait(lock, [&] { return completed >= seq || lost->load(std::memory_order_acquire); });
}

namespace openreg::runtime {
namespace {

// Runs a task's work as a kernel of `device` on the calling thread and
// returns its failure message ("" on success).
std::string execute(int device, const std::function<orError_t()>& work) {
  std::string error;
  const int outer_device = tls_kernel_device;
  tls_kernel_device = device;
  tls_kernel_error = &error;
  clear_last_error();
  orError_t result;
  try {
    result = work();
  } catch (const std::exception& e) {
    error = e.what();
    result = orErrorKernelFailed;
  } catch (...) {
    error = "unknown exception";
    result = orErrorKernelFailed;
  }
  tls_kernel_error = nullptr;
  tls_kernel_device = outer_device;
  if (result == orSuccess) {
    error.clear();  // orKernelSetError alone does not fail a kernel
  } else if (error.empty()) {
    // A runtime call made by the kernel explains the failure best.
    error = orGetLastErrorMessage();
    if (error.empty()) error = std::string("kernel returned ") + orGetErrorName(result);
  }
  return error;
}

}  // namespace
}  // namespace openreg::runtime

void orStream::complete(std::string error) {
  bool held_back;
  {
    std::lock_guard<std::mutex> lock(mutex);
    ++completed;
    completed_hint.store(completed, std::memory_order_release);
    // The worker waits for the end of an inline task when work is queued
    // behind it, or when the stream is being destroyed meanwhile.
    held_back = inline_running && (!queue.empty() || stopping);
    inline_running = false;
    if (!error.empty() && kernel_error.empty()) kernel_error = std::move(error);
  }
  work_done.notify_all();
  // Work queued behind an inline kernel was held back for it.
  if (held_back) work_ready.notify_one();
}

void orStream::run() {
  tls_kernel_device = device;
  if (priority < 0) {
    // A scheduling hint; without the privilege to raise priorities it is
    // simply not applied (see runtime.h).
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), -5);
  }
  for (;;) {
    Task task;
    // Idle: the next task often comes within microseconds (a host launching
    // operators one after another).
    spin_until([&] {
      return submitted_hint.load(std::memory_order_acquire) !=
             completed_hint.load(std::memory_order_acquire);
    });
    {
      std::unique_lock<std::mutex> lock(mutex);
      work_ready.wait(lock, [&] { return !inline_running && (stopping || !queue.empty()); });
      if (queue.empty()) return;  // stopping and drained
      task = std::move(queue.front());
      queue.pop_front();
    }
    std::string error;
    // A lost device runs nothing more: its queued tasks retire unrun.
    if (task.work && !lost->load(std::memory_order_acquire)) error = execute(device, task.work);
    // What the work held (an orLaunchKernelOwned argument) is released
    // before the task counts as complete: a host that waited for the
    // stream finds it released.
    task.work = nullptr;
    if (task.marker) {
      task.marker->time = std::chrono::steady_clock::now();
      task.marker->done.store(true, std::memory_order_release);
    }
    complete(std::move(error));
  }
}

namespace {

// Returns (and clears) the sticky kernel error of `s`, if any.
orError_t take_kernel_error(const char* call, const StreamRef& s) {
  if (s->lost->load(std::memory_order_acquire)) return fail_lost(call, s->device);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    error.swap(s->kernel_error);
  }
  if (error.empty()) return orSuccess;
  return fail(orErrorKernelFailed, "%s: a kernel on a stream of device %d "
              "failed: %s", call, s->device, error.c_str());
}

// With `s`'s mutex held: fails `call` if `s` is capturing, and invalidates
// the capture (orStreamEndCapture names the first refused call).
orError_t refuse_while_capturing(const char* call, orStream* s, const char* why) {
  if (!s->capture) return orSuccess;
  char message[512];
  std::snprintf(message, sizeof(message), "%s on a stream of device %d that is capturing a graph: %s",
                call, s->device, why);
  if (s->capture->invalidated.empty()) s->capture->invalidated = message;
  return fail(orErrorNotPermitted, "%s (the capture is now invalid; end it and capture again)", message);
}

constexpr const char* kWaitsForWork = "it waits for the stream's work, which only runs when the graph is launched";

}  // namespace

orError_t openreg::runtime::run_and_wait(const char* call, const StreamRef& s,
                                         std::function<orError_t()> work, bool is_kernel) {
  if (tls_kernel_device >= 0) {
    return fail(orErrorNotPermitted, "%s: kernels may not wait for work of a stream", call);
  }
  bool run_here;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t e = refuse_while_capturing(call, s.get(), kWaitsForWork)) return e;
    // Idle: nothing queued, nothing running (an inline task counts as
    // submitted until it completes).
    run_here = s->completed == s->submitted;
    if (run_here) {
      s->submitted_hint.store(++s->submitted, std::memory_order_release);
      s->inline_running = true;
    }
  }
  // The launch is counted once it is decided: after the inline run, or once
  // queued (the runtime's tests tell the two apart by the count).
  if (run_here) {
    s->complete(execute(s->device, work));
    if (is_kernel) g_kernels.fetch_add(1, std::memory_order_relaxed);
    return take_kernel_error(call, s);
  }
  const uint64_t seq = s->enqueue({std::move(work), nullptr});
  if (is_kernel) g_kernels.fetch_add(1, std::memory_order_relaxed);
  s->wait_for(seq);
  return take_kernel_error(call, s);
}

namespace {

orError_t create_stream(orStream_t* stream, int priority, const char* call) {
  if (!stream) return fail(orErrorInvalidValue, "%s: stream is null", call);
  *stream = nullptr;
  int least = 0, greatest = 0;
  orDeviceGetStreamPriorityRange(&least, &greatest);
  if (priority > least || priority < greatest) {
    return fail(orErrorInvalidValue, "%s: priority=%d is out of range: valid "
                "priorities are [%d, %d] (lower is more urgent)", call,
                priority, greatest, least);
  }
  int device = 0;
  if (orError_t e = current_device(call, &device)) return e;
  Device* d = nullptr;
  if (orError_t e = get_device(call, device, &d)) return e;
  StreamRef s = new_stream(d, priority, /*is_default=*/false);
  {
    std::lock_guard<std::mutex> lock(d->streams_mutex);
    d->streams.push_back(s);
  }
  *stream = s.get();
  return orSuccess;
}

}  // namespace

extern "C" {

orError_t orStreamCreate(orStream_t* stream) {
  return create_stream(stream, 0, "orStreamCreate");
}

orError_t orStreamCreateWithPriority(orStream_t* stream, int priority) {
  return create_stream(stream, priority, "orStreamCreateWithPriority");
}

orError_t orStreamDestroy(orStream_t stream) {
  const char* call = "orStreamDestroy";
  if (!stream) {
    return fail(orErrorInvalidHandle, "%s: stream is null (default streams "
                "cannot be destroyed)", call);
  }
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s, /*allow_lost=*/true)) return e;
  if (s->is_default) {
    return fail(orErrorNotPermitted, "%s: the default stream of device %d "
                "cannot be destroyed", call, s->device);
  }
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t e = refuse_while_capturing(call, s.get(), "end the capture first")) return e;
  }
  if (tls_kernel_device >= 0) {
    return fail(orErrorNotPermitted, "%s: kernels may not destroy streams", call);
  }
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.streams.erase(s.get())) {
      return fail(orErrorInvalidHandle, "%s: stream destroyed twice", call);
    }
  }
  Device* d = device_if_initialized(s->device);
  {
    std::lock_guard<std::mutex> lock(d->streams_mutex);
    d->streams.erase(std::remove(d->streams.begin(), d->streams.end(), s),
                     d->streams.end());
  }
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    s->stopping = true;
  }
  s->work_ready.notify_all();
  s->worker.join();  // drains queued work first
  s->magic.store(0);
  // The object is freed with its last reference: events recorded on it and
  // waits of other streams may still read its progress.
  return orSuccess;
}

orError_t orStreamGetDefault(int device, orStream_t* stream) {
  if (!stream) return fail(orErrorInvalidValue, "orStreamGetDefault: stream is null");
  Device* d = nullptr;
  if (orError_t e = get_device("orStreamGetDefault", device, &d)) return e;
  *stream = d->default_stream.get();
  return orSuccess;
}

orError_t orStreamGetDevice(orStream_t stream, int* device) {
  if (!device) return fail(orErrorInvalidValue, "orStreamGetDevice: device is null");
  StreamRef s;
  if (orError_t e = resolve_stream("orStreamGetDevice", stream, &s, /*allow_lost=*/true)) return e;
  *device = s->device;
  return orSuccess;
}

orError_t orStreamGetPriority(orStream_t stream, int* priority) {
  if (!priority) {
    return fail(orErrorInvalidValue, "orStreamGetPriority: priority is null");
  }
  StreamRef s;
  if (orError_t e = resolve_stream("orStreamGetPriority", stream, &s, /*allow_lost=*/true)) return e;
  *priority = s->priority;
  return orSuccess;
}

orError_t orStreamQuery(orStream_t stream) {
  const char* call = "orStreamQuery";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  bool done;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t e = refuse_while_capturing(call, s.get(), kWaitsForWork)) return e;
    done = s->completed == s->submitted;
  }
  if (!done) return orErrorNotReady;
  return take_kernel_error(call, s);
}

orError_t orStreamSynchronize(orStream_t stream) {
  const char* call = "orStreamSynchronize";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (tls_kernel_device >= 0) {
    return fail(orErrorNotPermitted, "%s: kernels may not synchronize streams", call);
  }
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t e = refuse_while_capturing(call, s.get(), kWaitsForWork)) return e;
    target = s->submitted;
  }
  s->wait_for(target);
  return take_kernel_error(call, s);
}

// The work of a host-function kernel: the function itself in thread mode;
// in process mode, the function over staged copies of the device memory it
// maps (staging.cpp), since that memory lives in the executor.
static std::function<orError_t()> host_kernel_work(const StreamRef& s, orKernelFn fn, void* arg) {
  if (config().process_mode) {
    Device* d = device_if_initialized(s->device);  // a live stream's device is initialized
    return [d, fn, arg]() { return run_staged_host_kernel(d, fn, arg); };
  }
  return [fn, arg]() { return fn(arg); };
}

orError_t orLaunchKernel(orStream_t stream, orKernelFn fn, void* arg) {
  const char* call = "orLaunchKernel";
  if (!fn) return fail(orErrorInvalidValue, "%s: fn is null", call);
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  g_kernels.fetch_add(1, std::memory_order_relaxed);
  s->enqueue({host_kernel_work(s, fn, arg), nullptr});
  return orSuccess;
}

orError_t orLaunchKernelOwned(orStream_t stream, orKernelFn fn, void* arg, orReleaseFn release) {
  const char* call = "orLaunchKernelOwned";
  if (!fn) return fail(orErrorInvalidValue, "%s: fn is null", call);
  if (!release) return fail(orErrorInvalidValue, "%s: release is null", call);
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  g_kernels.fetch_add(1, std::memory_order_relaxed);
  // The task (and, once captured, the graph and each launch of it) shares
  // the argument; the last of them releases it.
  std::shared_ptr<void> owned(arg, release);
  std::function<orError_t()> work = host_kernel_work(s, fn, arg);
  s->enqueue({[work = std::move(work), owned = std::move(owned)]() { return work(); }, nullptr});
  return orSuccess;
}

orError_t orStreamWaitValue32(orStream_t stream, const uint32_t* address, uint32_t value) {
  const char* call = "orStreamWaitValue32";
  if (!address) return fail(orErrorInvalidValue, "%s: address is null", call);
  if (reinterpret_cast<uintptr_t>(address) % alignof(uint32_t) != 0) {
    return fail(orErrorInvalidValue, "%s: address=%p is not 4-byte aligned", call,
                static_cast<const void*>(address));
  }
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  // Runs where the stream is ordered (its worker thread, in this process in
  // both modes): polls the word, sleeping between reads up to a millisecond.
  s->enqueue({[address, value]() {
                const auto* word = reinterpret_cast<const std::atomic<uint32_t>*>(address);
                long sleep_ns = 1000;
                while (word->load(std::memory_order_acquire) < value) {
                  const timespec pause{0, sleep_ns};
                  nanosleep(&pause, nullptr);
                  sleep_ns = std::min(sleep_ns * 2, 1000000L);
                }
                return orSuccess;
              },
              nullptr, "wait value"});
  return orSuccess;
}

orError_t orStreamWriteValue32(orStream_t stream, uint32_t* address, uint32_t value) {
  const char* call = "orStreamWriteValue32";
  if (!address) return fail(orErrorInvalidValue, "%s: address is null", call);
  if (reinterpret_cast<uintptr_t>(address) % alignof(uint32_t) != 0) {
    return fail(orErrorInvalidValue, "%s: address=%p is not 4-byte aligned", call,
                static_cast<void*>(address));
  }
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  s->enqueue({[address, value]() {
                reinterpret_cast<std::atomic<uint32_t>*>(address)->store(value, std::memory_order_release);
                return orSuccess;
              },
              nullptr, "write value"});
  return orSuccess;
}

orError_t orLaunchKernelSync(orStream_t stream, orKernelFn fn, void* arg) {
  const char* call = "orLaunchKernelSync";
  if (!fn) return fail(orErrorInvalidValue, "%s: fn is null", call);
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  return run_and_wait(call, s, host_kernel_work(s, fn, arg), /*is_kernel=*/true);
}

orError_t orKernelMapPointer(const void* device_ptr, size_t count,
                             void** accessible) {
  const char* call = "orKernelMapPointer";
  if (!accessible) return fail(orErrorInvalidValue, "%s: accessible is null", call);
  *accessible = nullptr;
  if (tls_kernel_device < 0) {
    return fail(orErrorNotPermitted, "%s: only kernels running on an OpenReg "
                "stream may access device memory; the host must copy it with "
                "orMemcpy", call);
  }
  Device* d = device_owning(device_ptr);
  if (!d) {
    return fail(orErrorInvalidPointer, "%s: device_ptr=%p is not OpenReg "
                "device memory", call, device_ptr);
  }
  if (d->index != tls_kernel_device) {
    return fail(orErrorDeviceMismatch, "%s: a kernel on device %d may not "
                "access memory of device %d; copy it first", call,
                tls_kernel_device, d->index);
  }
  if (config().process_mode) return staged_map_pointer(call, d, device_ptr, count, accessible);
  void* base;
  size_t size;
  if (!d->arena.find(device_ptr, count, &base, &size)) {
    return fail(orErrorInvalidPointer, "%s: [%p, +%zu bytes) is not inside a "
                "live allocation of device %d", call, device_ptr, count, d->index);
  }
  *accessible = d->arena.kernel_alias(device_ptr);
  return orSuccess;
}

orError_t orKernelMarkWritten(void* accessible, size_t count) {
  const char* call = "orKernelMarkWritten";
  if (tls_kernel_device < 0) {
    return fail(orErrorNotPermitted, "%s: only kernels running on an OpenReg "
                "stream write device memory", call);
  }
  if (!accessible && count > 0) return fail(orErrorInvalidValue, "%s: accessible is null", call);
  Device* d = device_if_initialized(tls_kernel_device);
  if (!d) return fail(orErrorInvalidDevice, "%s: the kernel's device %d is not initialized", call, tls_kernel_device);
  if (config().process_mode) return staged_mark_written(call, d, accessible, count);
  // Thread mode: the kernel wrote the device's memory itself; only the range is checked.
  const void* device_ptr = d->arena.device_of_kernel_alias(accessible);
  void* base;
  size_t size;
  if (!device_ptr || !d->arena.find(device_ptr, count, &base, &size)) {
    return fail(orErrorInvalidPointer, "%s: [%p, +%zu bytes) is not inside one allocation of device %d "
                "mapped by this kernel (orKernelMapPointer)", call, accessible, count, d->index);
  }
  return orSuccess;
}

int orKernelCurrentDevice(void) { return tls_kernel_device; }

void orKernelSetError(const char* message) {
  if (tls_kernel_error && message) *tls_kernel_error = message;
}

}  // extern "C"

namespace {

orError_t create_event(orEvent_t* event, unsigned flags, const char* call) {
  if (!event) return fail(orErrorInvalidValue, "%s: event is null", call);
  *event = nullptr;
  if (flags & ~static_cast<unsigned>(orEventDisableTiming)) {
    return fail(orErrorInvalidValue, "%s: flags=0x%x has unknown bits: valid "
                "flags are orEventDefault(0x0) and orEventDisableTiming(0x2)",
                call, flags);
  }
  int device = 0;
  if (orError_t e = current_device(call, &device)) return e;
  Device* d = nullptr;
  if (orError_t e = get_device(call, device, &d)) return e;
  auto e = std::make_shared<orEvent>();
  e->device = device;
  e->timing = !(flags & orEventDisableTiming);
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.events.emplace(e.get(), e);
  }
  *event = e.get();
  return orSuccess;
}

}  // namespace

extern "C" {

orError_t orEventCreate(orEvent_t* event) {
  return create_event(event, orEventDefault, "orEventCreate");
}

orError_t orEventCreateWithFlags(orEvent_t* event, unsigned flags) {
  return create_event(event, flags, "orEventCreateWithFlags");
}

orError_t orEventDestroy(orEvent_t event) {
  EventRef e;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = event ? r.events.find(event) : r.events.end();
    if (it == r.events.end()) {
      return fail(orErrorInvalidHandle, "orEventDestroy: event=%p is not a "
                  "live OpenReg event", static_cast<void*>(event));
    }
    e = std::move(it->second);
    r.events.erase(it);
  }
  // Pending markers hold their own reference, and a call still using the
  // event holds one to it: the object goes with the last of them.
  e->magic.store(0);
  return orSuccess;
}

orError_t orEventGetDevice(orEvent_t event, int* device) {
  if (!device) return fail(orErrorInvalidValue, "orEventGetDevice: device is null");
  EventRef e;
  if (orError_t r = resolve_event("orEventGetDevice", "event", event, &e, /*allow_lost=*/true)) return r;
  *device = e->device;
  return orSuccess;
}

orError_t orEventRecord(orEvent_t event, orStream_t stream) {
  const char* call = "orEventRecord";
  EventRef e;
  if (orError_t r = resolve_event(call, "event", event, &e)) return r;
  StreamRef s;
  if (orError_t r = resolve_stream(call, stream, &s)) return r;
  if (s->device != e->device) {
    return fail(orErrorDeviceMismatch, "%s: the event belongs to device %d but "
                "the stream belongs to device %d", call, e->device, s->device);
  }
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t r = refuse_while_capturing(call, s.get(),
            "events record work that runs now, and captured work only runs when the graph is launched")) {
      return r;
    }
  }
  auto marker = std::make_shared<Marker>();
  std::lock_guard<std::mutex> lock(e->mutex);
  e->seq = s->enqueue({{}, marker});
  e->stream = std::move(s);
  e->marker = std::move(marker);
  return orSuccess;
}

orError_t orEventQuery(orEvent_t event) {
  if (orError_t r = check_not_forked("orEventQuery")) return r;
  EventRef e;
  if (orError_t r = resolve_event("orEventQuery", "event", event, &e)) return r;
  std::lock_guard<std::mutex> lock(e->mutex);
  if (!e->stream) return orSuccess;
  return e->marker->done.load(std::memory_order_acquire) ? orSuccess
                                                         : orErrorNotReady;
}

orError_t orEventSynchronize(orEvent_t event) {
  // In a forked child the worker that would complete the event is gone.
  if (orError_t r = check_not_forked("orEventSynchronize")) return r;
  EventRef e;
  if (orError_t r = resolve_event("orEventSynchronize", "event", event, &e)) return r;
  StreamRef s;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    s = e->stream;
    seq = e->seq;
  }
  if (s) s->wait_for(seq);
  if (device_lost(e->device)) return fail_lost("orEventSynchronize", e->device);
  return orSuccess;
}

orError_t orStreamWaitEvent(orStream_t stream, orEvent_t event) {
  const char* call = "orStreamWaitEvent";
  EventRef e;
  if (orError_t r = resolve_event(call, "event", event, &e)) return r;
  StreamRef s;
  if (orError_t r = resolve_stream(call, stream, &s)) return r;
  StreamRef producer;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(e->mutex);
    producer = e->stream;
    seq = e->seq;
  }
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (orError_t r = refuse_while_capturing(call, s.get(),
            "a graph cannot depend on work outside its capture")) {
      return r;
    }
  }
  if (!producer || producer == s) return orSuccess;  // FIFO already orders it
  // Waits only reference work submitted before this call, so waits between
  // streams can never form a cycle. The task keeps the producer alive.
  s->enqueue({[producer = std::move(producer), seq]() {
                producer->wait_for(seq);
                return orSuccess;
              },
              nullptr, "wait for event"});
  return orSuccess;
}

orError_t orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end) {
  const char* call = "orEventElapsedTime";
  if (!ms) return fail(orErrorInvalidValue, "%s: ms is null", call);
  EventRef start_ref, end_ref;
  if (orError_t r = resolve_event(call, "start", start, &start_ref)) return r;
  if (orError_t r = resolve_event(call, "end", end, &end_ref)) return r;
  if (!start->timing || !end->timing) {
    return fail(orErrorInvalidValue, "%s: both events must be created with "
                "timing enabled (without orEventDisableTiming)", call);
  }
  if (start->device != end->device) {
    return fail(orErrorDeviceMismatch, "%s: start belongs to device %d and end "
                "to device %d; both must be on one device", call, start->device,
                end->device);
  }
  std::shared_ptr<Marker> a, b;
  {
    std::lock_guard<std::mutex> lock(start->mutex);
    a = start->marker;
  }
  {
    std::lock_guard<std::mutex> lock(end->mutex);
    b = end->marker;
  }
  if (!a || !b) {
    return fail(orErrorInvalidValue, "%s: both events must be recorded before "
                "measuring the time between them", call);
  }
  if (!a->done.load(std::memory_order_acquire) ||
      !b->done.load(std::memory_order_acquire)) {
    return fail(orErrorNotReady, "%s: the work captured by the events has not "
                "completed; synchronize first", call);
  }
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return orSuccess;
}

}  // extern "C"

// ----------------------------------------------------------------- graphs

namespace {

orError_t resolve_graph(const char* call, orGraph_t graph, std::shared_ptr<orGraph>* out) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = graph ? r.graphs.find(graph) : r.graphs.end();
  if (it == r.graphs.end()) {
    return fail(orErrorInvalidHandle, "%s: graph=%p is not a live OpenReg graph (destroyed or never made)",
                call, static_cast<void*>(graph));
  }
  *out = it->second;
  return orSuccess;
}

}  // namespace

extern "C" {

orError_t orStreamBeginCapture(orStream_t stream) {
  const char* call = "orStreamBeginCapture";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (tls_kernel_device >= 0) return fail(orErrorNotPermitted, "%s: kernels may not capture", call);
  if (s->is_default) {
    return fail(orErrorNotPermitted, "%s: the default stream of device %d cannot capture; capture on a "
                "stream made by orStreamCreate", call, s->device);
  }
  std::lock_guard<std::mutex> lock(s->mutex);
  if (s->capture) {
    return fail(orErrorNotPermitted, "%s: the stream is already capturing; end that capture first", call);
  }
  s->capture = std::make_unique<Capture>();
  return orSuccess;
}

orError_t orStreamEndCapture(orStream_t stream, orGraph_t* graph) {
  const char* call = "orStreamEndCapture";
  if (!graph) return fail(orErrorInvalidValue, "%s: graph is null", call);
  *graph = nullptr;
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  std::unique_ptr<Capture> capture;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    capture = std::move(s->capture);
  }
  if (!capture) {
    return fail(orErrorNotPermitted, "%s: the stream is not capturing (no orStreamBeginCapture)", call);
  }
  if (!capture->invalidated.empty()) {
    return fail(orErrorNotPermitted, "%s: the capture was invalidated by a call it cannot record: %s", call,
                capture->invalidated.c_str());
  }
  auto g = std::make_shared<orGraph>();
  g->device = s->device;
  g->tasks = std::move(capture->tasks);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.graphs.emplace(g.get(), g);
  *graph = g.get();
  return orSuccess;
}

orError_t orStreamIsCapturing(orStream_t stream, int* capturing) {
  const char* call = "orStreamIsCapturing";
  if (!capturing) return fail(orErrorInvalidValue, "%s: capturing is null", call);
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s, /*allow_lost=*/true)) return e;
  std::lock_guard<std::mutex> lock(s->mutex);
  *capturing = s->capture ? 1 : 0;
  return orSuccess;
}

orError_t orGraphLaunch(orGraph_t graph, orStream_t stream) {
  const char* call = "orGraphLaunch";
  std::shared_ptr<orGraph> g;
  if (orError_t e = resolve_graph(call, graph, &g)) return e;
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (s->device != g->device) {
    return fail(orErrorDeviceMismatch, "%s: the graph was captured on device %d but the stream belongs "
                "to device %d", call, g->device, s->device);
  }
  // Each launch queues copies of the tasks: they share what the graph holds.
  for (const Task& task : g->tasks) s->enqueue(task);
  return orSuccess;
}

orError_t orGraphDestroy(orGraph_t graph) {
  std::shared_ptr<orGraph> g;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = graph ? r.graphs.find(graph) : r.graphs.end();
    if (it == r.graphs.end()) {
      return fail(orErrorInvalidHandle, "orGraphDestroy: graph=%p is not a live OpenReg graph",
                  static_cast<void*>(graph));
    }
    g = std::move(it->second);
    r.graphs.erase(it);
  }
  g->magic.store(0);
  return orSuccess;
}

orError_t orGraphGetNodeCount(orGraph_t graph, size_t* count) {
  if (!count) return fail(orErrorInvalidValue, "orGraphGetNodeCount: count is null");
  std::shared_ptr<orGraph> g;
  if (orError_t e = resolve_graph("orGraphGetNodeCount", graph, &g)) return e;
  *count = g->tasks.size();
  return orSuccess;
}

orError_t orGraphDebugDotPrint(orGraph_t graph, const char* path) {
  const char* call = "orGraphDebugDotPrint";
  if (!path) return fail(orErrorInvalidValue, "%s: path is null", call);
  std::shared_ptr<orGraph> g;
  if (orError_t e = resolve_graph(call, graph, &g)) return e;
  FILE* f = std::fopen(path, "w");
  if (!f) return fail(orErrorInvalidValue, "%s: cannot write path=%s: %s", call, path, std::strerror(errno));
  std::fprintf(f, "digraph openreg_graph {\n  label=\"OpenReg graph of device %d: %zu operations\";\n",
               g->device, g->tasks.size());
  for (size_t i = 0; i < g->tasks.size(); ++i) {
    std::fprintf(f, "  n%zu [label=\"%zu: %s\"];\n", i, i, g->tasks[i].what);
    if (i > 0) std::fprintf(f, "  n%zu -> n%zu;\n", i - 1, i);
  }
  std::fprintf(f, "}\n");
  const bool ok = std::fclose(f) == 0;
  if (!ok) return fail(orErrorInvalidValue, "%s: cannot write path=%s", call, path);
  return orSuccess;
}

}  // extern "C"
