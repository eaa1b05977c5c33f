#include "DeviceKernel.h"

#include "Exception.h"
#include "Stream.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <exception>

namespace openreg {

namespace {

struct KernelTask {
  std::vector<at::Tensor> keep_alive;
  std::function<void()> body;
  bool wait;
  std::exception_ptr error;  // wait mode: handed back to the caller
};

orError_t run_task(void* arg) {
  auto* task = static_cast<KernelTask*>(arg);
  orError_t status = orSuccess;
  try {
    // Aliases are plain CPU tensors: skip autograd and view tracking.
    c10::impl::ExcludeDispatchKeyGuard no_autograd(
        c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    task->body();
  } catch (const std::exception& e) {
    if (task->wait) {
      task->error = std::current_exception();
    } else {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      orKernelSetError(c10_error ? c10_error->what_without_backtrace() : e.what());
      status = orErrorKernelFailed;
    }
  }
  if (!task->wait) delete task;  // async tasks are owned by the worker
  return status;
}

}  // namespace

void launch_kernel(const c10::Stream& stream, std::vector<at::Tensor> keep_alive,
                   std::function<void()> body, bool wait) {
  const orStream_t native = native_stream(stream);
  if (wait) {
    KernelTask task{std::move(keep_alive), std::move(body), true, nullptr};
    OPENREG_CHECK(orLaunchKernel(native, &run_task, &task));
    OPENREG_CHECK(orStreamSynchronize(native));
    if (task.error) std::rethrow_exception(task.error);
    return;
  }
  auto* task = new KernelTask{std::move(keep_alive), std::move(body), false, nullptr};
  const orError_t status = orLaunchKernel(native, &run_task, task);
  if (status != orSuccess) delete task;
  OPENREG_CHECK(status);
}

at::Tensor AliasBuilder::alias(const at::Tensor& t) {
  if (!t.defined()) return t;
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
  const c10::Storage& storage = t.storage();
  auto it = by_device_.find(storage.unsafeGetStorageImpl());
  if (it == by_device_.end()) {
    const size_t nbytes = storage.nbytes();
    void* accessible = nullptr;
    if (storage.data() != nullptr && nbytes > 0) {
      OPENREG_CHECK(orKernelMapPointer(storage.data(), nbytes, &accessible));
    }
    c10::Storage cpu(c10::Storage::use_byte_size_t(), nbytes,
                     c10::DataPtr(accessible, c10::Device(c10::kCPU)),
                     /*allocator=*/nullptr, /*resizable=*/false);
    it = by_device_.emplace(storage.unsafeGetStorageImpl(), Entry{storage, cpu}).first;
    by_cpu_.emplace(it->second.cpu.unsafeGetStorageImpl(), &it->second.device);
  }
  auto alias = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(it->second.cpu), c10::DispatchKeySet(c10::DispatchKey::CPU),
      t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                     t.storage_offset());
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

const c10::Storage* AliasBuilder::device_storage_of(
    const c10::StorageImpl* cpu_storage) const {
  auto it = by_cpu_.find(cpu_storage);
  return it == by_cpu_.end() ? nullptr : it->second;
}

at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like,
                       c10::DispatchKeySet key_set) {
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(storage), key_set, like.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                    like.storage_offset());
  view._set_conj(like.is_conj());
  view._set_neg(like.is_neg());
  return view;
}

}  // namespace openreg
