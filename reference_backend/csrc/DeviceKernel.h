// Running PyTorch's CPU kernels as OpenReg device kernels.
//
// A device kernel is a function run on a stream's worker thread. It sees each
// device tensor as a CPU "alias" tensor: same dtype, sizes, strides and offset,
// over the runtime's kernel-accessible mapping of the device memory (the host
// cannot reach that memory directly; in process mode the mapping is a staged
// copy, written back when the kernel returns; see runtime.h). Aliases of one
// device storage share one CPU storage, so views keep aliasing each other.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <functional>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

namespace openreg {

// What a kernel needs to know about a device tensor, without owning it.
// Asynchronous kernels hold these instead of tensors: a tensor destroyed on
// a worker thread could need the GIL (its Python object) or the allocator
// while the host waits for that worker. Memory safety comes from the caching
// allocator instead: a block freed by the host is reused only by later work
// on its own stream (or after record_stream's events), as on CUDA.
struct TensorRef {
  explicit TensorRef(const at::Tensor& t);
  const void* storage_identity;  // the device StorageImpl, as an identity only (never dereferenced)
  void* storage_data;       // device address of the storage (null if empty)
  size_t storage_nbytes;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset;
  caffe2::TypeMeta dtype;
  bool conj;
  bool neg;
};

// Enqueues `body` on `stream`. The body runs on the stream's worker with
// autograd keys excluded, and builds the aliases it needs (AliasBuilder).
//  * wait == false: returns at once; an exception in `body` becomes the
//    stream's sticky error, raised by the next synchronization. The body must
//    not own tensors (capture TensorRefs).
//  * wait == true: returns when the stream has finished the kernel (and all
//    work before it) and rethrows an exception from `body`. The body may then
//    use state of the caller's frame, tensors included. On an idle stream it
//    runs on the calling thread (orLaunchKernelSync), under a new thread's
//    PyTorch state and warning handler, as it would on the worker.
void launch_kernel(const c10::Stream& stream, std::function<void()> body, bool wait);

// Worker-side helper: builds CPU aliases, reusing one alias storage per
// device storage. Only valid inside a kernel of the storage's device.
class AliasBuilder {
 public:
  at::Tensor alias(const TensorRef& ref);
  // Also remembers the device storage, for device_storage_of.
  at::Tensor alias(const at::Tensor& device_tensor);
  // The device storage whose alias is `cpu_storage`, or nullptr (only for
  // storages aliased through alias(const at::Tensor&)).
  const c10::Storage* device_storage_of(const c10::StorageImpl* cpu_storage) const;

 private:
  const c10::Storage& cpu_storage_for(const void* identity, void* device_data, size_t nbytes);
  // Device address (or, for a storage without memory, the device storage) -> its CPU storage.
  std::unordered_map<const void*, c10::Storage> cpu_by_device_data_;
  // One alias per device tensor: an argument passed twice (cat((x, y),
  // out=x)) is one tensor to the CPU kernel too, as it is to the caller.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> cpu_by_tensor_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> device_by_cpu_;
};

// Whether the runtime runs devices as executor processes
// (OPENREG_EXECUTOR=process; docs/reference-backend/executor.md). There the
// asynchronous operator path sends its operators to the executor
// (OperatorPayload.h); launch_kernel's bodies still run in this process, in
// stream order, over the runtime's staged copies of the device memory they
// alias.
bool process_mode();

// Tests: PyTorch's process-wide settings that queued operators carry
// (OperatorPayload.h's Settings), as the executor of `device` holds them
// now (read by a kernel queued on its current stream; in thread mode, this
// process's), and as this process holds them.
std::vector<std::pair<std::string, int>> executor_settings(c10::DeviceIndex device);
std::vector<std::pair<std::string, int>> host_settings();

// Process mode: queues dst.copy_(src), two tensors of one device, on
// `stream`, to run in the device's executor (Fallback.cpp).
void launch_copy_in_executor(const c10::Stream& stream, const at::Tensor& src, const at::Tensor& dst);

// Asynchronous operators (Fallback.cpp): whether the CPU fallback queues
// operators whose results' geometry their Meta kernel tells, instead of
// waiting for them. On unless the environment variable
// OPENREG_ASYNC_OPERATORS is 0 when the library loads (each new operator and
// argument metadata pays a Meta kernel, C++ where libtorch has one; answers
// are kept: docs/reference-backend/streams-and-events.md).
bool async_operators();
void set_async_operators(bool on);
// How many operators the asynchronous path has queued in this process.
uint64_t async_operator_launches();

// A device tensor viewing `storage` with the geometry and dtype of `like`
// (a CPU tensor), sharing `storage`.
at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like,
                       c10::DispatchKeySet key_set);

}  // namespace openreg
