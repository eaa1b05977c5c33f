// Running PyTorch's CPU kernels as OpenReg device kernels.
//
// A device kernel is a function run on a stream's worker thread. It sees each
// device tensor as a CPU "alias" tensor: same dtype, sizes, strides and offset,
// over the runtime's kernel-accessible mapping of the device memory (the host
// cannot reach that memory directly; see runtime.h). Aliases of one device
// storage share one CPU storage, so views keep aliasing each other.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <functional>
#include <unordered_map>
#include <vector>

namespace openreg {

// Enqueues `body` on `stream`. The body runs on the stream's worker with
// autograd keys excluded, and builds the aliases it needs (AliasBuilder).
// `keep_alive` (device tensors the body reads or writes) lives until it ran.
//  * wait == false: returns at once; an exception in `body` becomes the
//    stream's sticky error, raised by the next synchronization.
//  * wait == true: returns when the stream has finished the kernel (and all
//    work before it) and rethrows an exception from `body`. The body may then
//    use state of the caller's frame.
void launch_kernel(const c10::Stream& stream, std::vector<at::Tensor> keep_alive,
                   std::function<void()> body, bool wait);

// Worker-side helper: builds CPU aliases, reusing one alias storage per
// device storage. Only valid inside a kernel of the storage's device.
class AliasBuilder {
 public:
  at::Tensor alias(const at::Tensor& device_tensor);
  // The device storage whose alias is `cpu_storage`, or nullptr.
  const c10::Storage* device_storage_of(const c10::StorageImpl* cpu_storage) const;

 private:
  struct Entry {
    c10::Storage device;
    c10::Storage cpu;
  };
  std::unordered_map<const c10::StorageImpl*, Entry> by_device_;
  std::unordered_map<const c10::StorageImpl*, const c10::Storage*> by_cpu_;
};

// A device tensor viewing `storage` with the geometry and dtype of `like`
// (a CPU tensor), sharing `storage`.
at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like,
                       c10::DispatchKeySet key_set);

}  // namespace openreg
