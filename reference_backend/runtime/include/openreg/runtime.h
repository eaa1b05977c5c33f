// OpenReg simulated accelerator runtime: a small C API in the style of a real
// accelerator runtime (CUDA, ACL, Level Zero). It knows nothing about PyTorch.
//
// Model
//  * N devices (OPENREG_DEVICE_COUNT, default 2, 0 allowed), each with its own
//    memory of OPENREG_DEVICE_MEMORY bytes (default 4 GiB).
//  * Device memory lives in a region the host cannot touch: a host load or
//    store through a device pointer faults (SIGSEGV). Only copies made by the
//    runtime and kernels running on a stream of the *same* device can reach it
//    (kernels call orKernelMapPointer to get an accessible alias).
//  * Each stream is served by its own worker thread, so work launched on it
//    really runs asynchronously, in launch order.
//  * The current device is per thread and starts at 0 in every new thread.
//  * A device is "initialized" (has a primary context) once its memory or
//    streams are first used; setting or reading the current device does not
//    initialize it.
//  * Every failing call returns an error code and leaves a message naming the
//    call, the argument and the valid range, readable in the same thread with
//    orGetLastErrorMessage().
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define OR_API __attribute__((visibility("default")))
#else
#define OR_API
#endif

typedef enum orError {
  orSuccess = 0,
  orErrorInvalidValue = 1,      // an argument is out of its valid range
  orErrorInvalidDevice = 2,     // a device index is not in [0, device count)
  orErrorMemoryAllocation = 3,  // the device (or host) is out of memory
  orErrorInvalidPointer = 4,    // a pointer is not what the call requires
  orErrorNotReady = 5,          // query: work is still pending (not a failure)
  orErrorInvalidHandle = 6,     // a stream or event handle is unknown/destroyed
  orErrorDeviceMismatch = 7,    // resources of different devices were mixed
  orErrorNoDevice = 8,          // the runtime has no device at all
  orErrorInitialization = 9,    // the configuration (environment) is invalid
  orErrorForkedProcess = 10,    // initialized before fork(); unusable in child
  orErrorKernelFailed = 11,     // a kernel on the stream raised an error
  orErrorNotPermitted = 12,     // the call is not allowed in this context
  orErrorDeviceLost = 13,       // the device was lost (orDeviceInjectFault)
  orErrorNotSupported = 14,     // the call is not available in this execution mode
} orError_t;

// The largest device count PyTorch can address (DeviceIndex is int8_t).
#define OR_MAX_DEVICE_COUNT 127
#define OR_DEFAULT_DEVICE_COUNT 2
#define OR_DEFAULT_DEVICE_MEMORY (4ull << 30)
// Every device allocation is aligned to this many bytes.
#define OR_ALLOCATION_ALIGNMENT 512

OR_API const char* orGetErrorName(orError_t error);
// Message of the last failing call made by this thread ("" if none).
OR_API const char* orGetLastErrorMessage(void);

// ---------------------------------------------------------------- devices
OR_API orError_t orGetDeviceCount(int* count);
OR_API orError_t orGetDevice(int* device);
OR_API orError_t orSetDevice(int device);
// Whether `device` has been initialized (its memory or streams were used).
// Never initializes anything; cheap.
OR_API orError_t orDeviceIsInitialized(int device, int* initialized);
// Initialize `device` now (idempotent).
OR_API orError_t orDeviceInit(int device);
// Block until all work on all streams of `device` (not the current one) is done.
OR_API orError_t orDeviceSynchronize(int device);
OR_API orError_t orDeviceGetMemoryInfo(int device, size_t* free_bytes,
                                       size_t* total_bytes);
// Priorities range from `least` (0, the default) to `greatest` (-1). Like
// CUDA, a numerically lower priority is more urgent. Each stream's work runs
// on its own thread; the thread of a priority -1 stream runs at a higher OS
// scheduling priority (nice -5) where the process may raise priorities, so
// its work is served first when workers compete for CPUs.
OR_API orError_t orDeviceGetStreamPriorityRange(int* least, int* greatest);

// ----------------------------------------------------------------- memory
typedef enum orMemoryType {
  orMemoryTypeUnregistered = 0,  // not allocated by this runtime
  orMemoryTypeHost = 1,          // pinned host memory (orMallocHost)
  orMemoryTypeDevice = 2,        // device memory (orMalloc)
} orMemoryType;

typedef struct orPointerAttributes {
  orMemoryType type;
  int device;      // owning device for device memory, -1 otherwise
  void* base;      // start of the allocation containing the pointer
  size_t size;     // size of that allocation in bytes
} orPointerAttributes;

typedef enum orMemcpyKind {
  orMemcpyHostToHost = 0,
  orMemcpyHostToDevice = 1,
  orMemcpyDeviceToHost = 2,
  orMemcpyDeviceToDevice = 3,
  // Not kinds: they make every int a value of the type, so that a caller's
  // bad kind is rejected by the range check (orErrorInvalidValue) instead of
  // being undefined behaviour in C++, where an enum without a fixed
  // underlying type only holds the values of its enumerators' bit width.
  orMemcpyKindMin_ = -0x7fffffff - 1,
  orMemcpyKindMax_ = 0x7fffffff,
} orMemcpyKind;

// Allocate on the current device. size 0 yields nullptr and succeeds.
OR_API orError_t orMalloc(void** ptr, size_t size);
// Free device memory. nullptr is a no-op; interior or unknown pointers fail.
// Waits for nothing: the caller orders frees after the work that uses them.
OR_API orError_t orFree(void* ptr);
// Pinned (page-locked) host memory, registered so that it can be recognized.
OR_API orError_t orMallocHost(void** ptr, size_t size);
OR_API orError_t orFreeHost(void* ptr);
// Never fails for a pointer the runtime does not know: reports Unregistered.
// Interior pointers resolve to their allocation.
OR_API orError_t orPointerGetAttributes(orPointerAttributes* attributes,
                                        const void* ptr);

typedef struct orStream* orStream_t;
typedef struct orEvent* orEvent_t;

// Copies. Device pointers must lie inside allocations (ranges are checked).
// orMemcpy runs on the default stream of the device involved and returns when
// the copy (and the default stream's earlier work) is done; it does not wait
// for work queued on other streams.
OR_API orError_t orMemcpy(void* dst, const void* src, size_t count,
                          orMemcpyKind kind);
// Enqueue the copy on `stream` (nullptr: the current device's default stream)
// and return at once. Host memory must stay valid until the copy completes.
// One device pointer must belong to the stream's device; a device-to-device
// copy may read or write one other device (an explicit peer copy).
OR_API orError_t orMemcpyAsync(void* dst, const void* src, size_t count,
                               orMemcpyKind kind, orStream_t stream);
// orMemcpyAsync followed by orStreamSynchronize, in one call: the copy runs
// after the work launched on `stream` so far, and the call returns when all of
// it is done (with the stream's kernel error, if any). On an idle stream the
// calling thread copies (see orLaunchKernelSync). Kernels may not call it.
OR_API orError_t orMemcpySync(void* dst, const void* src, size_t count,
                              orMemcpyKind kind, orStream_t stream);
OR_API orError_t orMemsetAsync(void* dst, int value, size_t count,
                               orStream_t stream);

// ---------------------------------------------------------------- streams
// Streams belong to the current device. Handles stay valid until destroyed;
// default streams are never destroyed. orStreamDestroy waits for the stream's
// queued work; events recorded on it stay usable. As with CUDA, the address of
// a destroyed stream or event may be reused by a later one, so a handle must
// not be used after it was destroyed (until then, every call rejects it).
OR_API orError_t orStreamCreate(orStream_t* stream);
OR_API orError_t orStreamCreateWithPriority(orStream_t* stream, int priority);
OR_API orError_t orStreamDestroy(orStream_t stream);
OR_API orError_t orStreamGetDefault(int device, orStream_t* stream);
OR_API orError_t orStreamGetDevice(orStream_t stream, int* device);
OR_API orError_t orStreamGetPriority(orStream_t stream, int* priority);
// orSuccess when all work launched so far has completed, orErrorNotReady else.
OR_API orError_t orStreamQuery(orStream_t stream);
OR_API orError_t orStreamSynchronize(orStream_t stream);
// Work launched on `stream` after this call waits for the work recorded in
// `event` (at the time of this call). An unrecorded event is a no-op.
OR_API orError_t orStreamWaitEvent(orStream_t stream, orEvent_t event);

// Stream memory operations on host memory (as CUDA's cuStreamWaitValue32
// and cuStreamWriteValue32 on host-registered memory), in both execution
// modes: work launched on `stream` after orStreamWaitValue32 waits until the
// 32-bit word at `address` is >= `value` (read with acquire order, polled);
// orStreamWriteValue32 stores `value` there (release order) once the work
// before it is done. `address` must be 4-byte aligned and stay valid until
// the operation ran. A wait that is never satisfied holds the stream (and
// orStreamSynchronize) forever: meant for tests and for host-driven gating.
OR_API orError_t orStreamWaitValue32(orStream_t stream, const uint32_t* address, uint32_t value);
OR_API orError_t orStreamWriteValue32(orStream_t stream, uint32_t* address, uint32_t value);

// A kernel: a function run on the stream's worker thread. It returns
// orSuccess or an error code; on error it may call orKernelSetError first.
// A failed kernel makes the stream's next query/synchronize return
// orErrorKernelFailed with the kernel's message (the error is then cleared).
typedef orError_t (*orKernelFn)(void* arg);
OR_API orError_t orLaunchKernel(orStream_t stream, orKernelFn fn, void* arg);
// Launches `fn` on `stream` and returns when it, and all work launched on the
// stream before it, has completed, with what orStreamSynchronize would return
// then (orErrorKernelFailed with the message when this kernel or an earlier
// one failed). When the stream is idle the kernel runs on the calling thread,
// as a kernel of the stream's device (orKernelMapPointer and
// orKernelCurrentDevice behave as on the worker), which saves the two thread
// wake-ups of a launch followed by a wait. Work launched on the stream from
// any thread while it runs waits for it, as it would behind a queued kernel.
// Kernels may not call it (orErrorNotPermitted).
OR_API orError_t orLaunchKernelSync(orStream_t stream, orKernelFn fn, void* arg);
// orLaunchKernel's `arg` is borrowed: it must stay valid until the kernel
// ran (when captured into a graph, until the graph is destroyed).
// orLaunchKernelOwned hands `arg` to the runtime instead, which calls
// `release(arg)` once nothing can run the kernel anymore: after it ran, or
// when the graph that captured it is destroyed (and its launches ran). On
// failure `arg` stays the caller's.
typedef void (*orReleaseFn)(void* arg);
OR_API orError_t orLaunchKernelOwned(orStream_t stream, orKernelFn fn, void* arg,
                                     orReleaseFn release);
// Inside a kernel: an accessible alias for `count` bytes at a device pointer.
// Fails unless the caller is a kernel running on a stream of the device that
// owns the memory, and the range lies inside one allocation.
OR_API orError_t orKernelMapPointer(const void* device_ptr, size_t count,
                                    void** accessible);
// Inside a kernel: declares that the kernel writes every byte of the
// `count` bytes at `accessible` (an address orKernelMapPointer gave it, or
// inside one such mapping), whatever it reads first: a collective's output,
// a fill. In thread mode the kernel's writes already are the device's and
// nothing happens. In process mode the range is then written back whole
// when the kernel returns, in one run, where otherwise only the bytes that
// differ from the device's are (the staging's only way to tell what the
// kernel wrote; a float32 sum that keeps some bytes of most elements is
// millions of runs), so writes of other streams to that range meanwhile are
// overwritten, as they would be by the kernel itself. Fails outside a kernel
// (orErrorNotPermitted) and for a range that is not inside one allocation
// of the kernel's device at addresses a map of this kernel gave
// (orErrorInvalidPointer).
OR_API orError_t orKernelMarkWritten(void* accessible, size_t count);
// Inside a kernel: the device the kernel runs on (-1 outside kernels).
OR_API int orKernelCurrentDevice(void);
OR_API void orKernelSetError(const char* message);

// ---------------------------------------------------------------- modules
// Kernels that can run in either execution mode (see "execution modes"
// below): functions of a shared library (a module), found by name and
// launched with a parameter block that is copied at the launch, as CUDA's
// cuModuleLoad / cuLaunchKernel do. A module kernel reaches device memory
// only through its context, never through the runtime's own symbols, so a
// module needs nothing but this header.
#define OR_MAX_KERNEL_PARAMS 32768
typedef struct orKernelContext {
  int device;  // the device the kernel runs on
  // An accessible address for `count` bytes at a device pointer of `device`.
  orError_t (*map_pointer)(const void* device_ptr, size_t count, void** accessible);
  // The message of the kernel's failure (used when it returns an error).
  void (*set_error)(const char* message);
} orKernelContext;
typedef orError_t (*orModuleKernelFn)(const orKernelContext* context, const void* params,
                                      size_t params_size);
typedef struct orModule* orModule_t;
typedef struct orFunction* orFunction_t;
// Loads the module at `path` (dlopen). Modules stay loaded until the process
// ends; loading a path again returns the same module.
OR_API orError_t orModuleLoad(orModule_t* module, const char* path);
// The kernel `name` of `module` (an exported orModuleKernelFn).
OR_API orError_t orModuleGetFunction(orFunction_t* function, orModule_t module,
                                     const char* name);
// Launches `function` on `stream` with a copy of `params_size` bytes at
// `params` (at most OR_MAX_KERNEL_PARAMS; 16-byte aligned when it runs).
OR_API orError_t orLaunchModuleKernel(orStream_t stream, orFunction_t function,
                                      const void* params, size_t params_size);

// -------------------------------------------------------- execution modes
// OPENREG_EXECUTOR selects, once per process, where devices run:
//   "thread" (default): in this process; each stream is a worker thread and
//     device memory is a memfd whose host-visible view is PROT_NONE.
//   "process": each device is an executor process (openreg-executor, found
//     next to the library that holds the runtime, or at OPENREG_EXECUTOR_PATH)
//     that owns the device memory; this process only reserves its addresses.
//     Streams are ordered here; copies and module kernels run in the
//     executor. Host-function kernels (orLaunchKernel, orLaunchKernelSync)
//     run in this process, in stream order (as cudaLaunchHostFunc), over
//     staged copies: orKernelMapPointer returns a host copy of the pages it
//     covers (one copy per allocation and kernel, read from the executor on
//     first use), and when the kernel returns, the bytes it changed, and
//     only those, are written back (and the ranges it marked written with
//     orKernelMarkWritten, whole). An executor that dies loses its device
//     (see device loss) with the cause.
// `process` is 1 in process mode, else 0.
OR_API orError_t orGetExecutionMode(int* process);
// The executor's process id of an initialized device in process mode
// (orErrorNotSupported in thread mode).
OR_API orError_t orDeviceGetExecutorPid(int device, int* pid);

// ----------------------------------------------------------------- events
#define orEventDefault 0x0
#define orEventDisableTiming 0x2
OR_API orError_t orEventCreate(orEvent_t* event);
OR_API orError_t orEventCreateWithFlags(orEvent_t* event, unsigned flags);
OR_API orError_t orEventDestroy(orEvent_t event);
// Capture the work launched so far on `stream`. The event and the stream must
// belong to the same device (the event's device is the current device at
// creation).
OR_API orError_t orEventRecord(orEvent_t event, orStream_t stream);
// orSuccess if never recorded or the captured work is done; orErrorNotReady.
OR_API orError_t orEventQuery(orEvent_t event);
OR_API orError_t orEventSynchronize(orEvent_t event);
OR_API orError_t orEventGetDevice(orEvent_t event, int* device);
// Milliseconds between two completed, timing-enabled events of one device.
OR_API orError_t orEventElapsedTime(float* ms, orEvent_t start, orEvent_t end);

// ----------------------------------------------------------------- graphs
// Stream capture, as CUDA's cudaStreamBeginCapture / cudaGraphLaunch: between
// orStreamBeginCapture and orStreamEndCapture, the asynchronous work launched
// on the stream (kernels, module kernels, asynchronous copies and memsets,
// stream memory operations) is recorded into a graph instead of running.
// orGraphLaunch queues the recorded work, in capture order, on a stream of the
// graph's device, as often as wanted; the graph holds what its work needs
// (parameter blocks, the arguments of orLaunchKernelOwned) until it is
// destroyed. Device and host memory the work reads or writes is used at each
// launch, at the addresses it had during capture: keeping it allocated is the
// caller's part.
//  * The default stream cannot capture (orErrorNotPermitted), as on CUDA.
//  * Calls that need the capturing stream's work to have run, or that would
//    make it depend on work outside the capture, fail with
//    orErrorNotPermitted and invalidate the capture: orLaunchKernelSync,
//    orMemcpySync, orStreamSynchronize, orStreamQuery, orEventRecord and
//    orStreamWaitEvent on the capturing stream, and orStreamDestroy of it.
//    orStreamEndCapture then fails (naming the first such call) and ends the
//    capture without a graph.
//  * Capture is per stream: other streams, allocation and the other devices
//    work as usual meanwhile, from any thread.
typedef struct orGraph* orGraph_t;
OR_API orError_t orStreamBeginCapture(orStream_t stream);
OR_API orError_t orStreamEndCapture(orStream_t stream, orGraph_t* graph);
// `capturing` is 1 between orStreamBeginCapture and orStreamEndCapture.
OR_API orError_t orStreamIsCapturing(orStream_t stream, int* capturing);
// Queues the graph's work on `stream` (a stream of the graph's device; on a
// capturing stream, the work is captured again) and returns at once.
OR_API orError_t orGraphLaunch(orGraph_t graph, orStream_t stream);
// Launches already queued keep what they need: destroying a graph never
// waits for them.
OR_API orError_t orGraphDestroy(orGraph_t graph);
// How many operations the graph records.
OR_API orError_t orGraphGetNodeCount(orGraph_t graph, size_t* count);
// Writes the graph as Graphviz DOT to the file at `path`: its operations, in
// the order they run.
OR_API orError_t orGraphDebugDotPrint(orGraph_t graph, const char* path);

// ------------------------------------------------------------ device loss
// Loses `device`, as a device that faults or falls off the bus: from now on
// every call on it fails with orErrorDeviceLost and a message naming the
// device and `cause` (null or "": "a fault injected by orDeviceInjectFault"),
// until the process ends, as after a sticky error on CUDA. Its queued work
// never runs (a kernel running at the time finishes); threads waiting for it
// wake and fail; its memory counts as gone (orDeviceGetMemoryInfo fails).
// Calls that only release or describe handles keep working: orFree,
// orStreamDestroy, orEventDestroy, orStreamGetDevice, orStreamGetPriority,
// orEventGetDevice, orPointerGetAttributes, and the current-device calls.
// Other devices are untouched; work of theirs that waits for an event of the
// lost device stops waiting. Initializes the device if needed; losing a lost
// device again succeeds and keeps the first cause. Kernels may not call it.
OR_API orError_t orDeviceInjectFault(int device, const char* cause);
// Whether `device` was lost (never initializes anything).
OR_API orError_t orDeviceIsLost(int device, int* lost);

// ------------------------------------------------------------ diagnostics
typedef struct orDebugCounters {
  uint64_t set_device_calls;     // successful orSetDevice calls, redundant ones too
  uint64_t device_inits;         // devices initialized in this process
  uint64_t mallocs;              // successful orMalloc calls (size > 0)
  uint64_t frees;                // successful orFree calls (non-null)
  uint64_t kernels_launched;
  uint64_t live_events;          // events created and not yet destroyed
} orDebugCounters;
OR_API orError_t orGetDebugCounters(orDebugCounters* counters);

#ifdef __cplusplus
}  // extern "C"
#endif
