#include "DeviceKernel.h"

#include "CpuAlias.h"
#include "Exception.h"
#include "Stream.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <exception>
#include <memory>
#include <optional>
#include <thread>

namespace openreg {

namespace {

struct KernelTask {
  std::function<void()> body;
  bool wait;
  std::exception_ptr error;  // wait mode: handed back to the caller
};

// What a stream's worker thread starts with: PyTorch's thread-local state
// (grad and inference mode, autocast, dispatch modes, the profiler's
// RecordFunction callbacks, ...) and warning handler as on a new thread.
// Captured once, on a thread of our own.
struct FreshThreadState {
  at::ThreadLocalState state;
  c10::WarningHandler* warnings;
};
const FreshThreadState& fresh_thread_state() {
  static const FreshThreadState* fresh = [] {
    const FreshThreadState* captured = nullptr;
    std::thread([&] {
      captured = new FreshThreadState{at::ThreadLocalState(), c10::WarningUtils::get_warning_handler()};
    }).join();
    return captured;
  }();
  return *fresh;
}

orError_t run_task(void* arg) {
  auto* task = static_cast<KernelTask*>(arg);
  orError_t status = orSuccess;
  try {
    // A waited-for kernel may run on the caller's thread (orLaunchKernelSync,
    // when the stream is idle). It runs under a new thread's state, as on
    // the stream's worker: the caller's autocast or dispatch modes must not
    // reach the CPU kernel, and its warnings go where a worker's go, so a
    // kernel behaves the same on either thread.
    std::optional<at::ThreadLocalStateGuard> fresh_state;
    std::optional<c10::WarningUtils::WarningHandlerGuard> fresh_warnings;
    if (task->wait) {
      fresh_state.emplace(fresh_thread_state().state);
      fresh_warnings.emplace(fresh_thread_state().warnings);
    }
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
  return status;
}

void release_task(void* arg) { delete static_cast<KernelTask*>(arg); }

}  // namespace

bool process_mode() {
  static const bool on = [] {
    int process = 0;
    return orGetExecutionMode(&process) == orSuccess && process != 0;
  }();
  return on;
}

TensorRef::TensorRef(const at::Tensor& t)
    : storage_identity(t.storage().unsafeGetStorageImpl()),
      storage_data(t.storage().mutable_data()),
      storage_nbytes(t.storage().nbytes()),
      sizes(t.sizes().vec()),
      strides(t.strides().vec()),
      storage_offset(t.storage_offset()),
      dtype(t.dtype()),
      conj(t.is_conj()),
      neg(t.is_neg()) {
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
}

void launch_kernel(const c10::Stream& stream, std::function<void()> body, bool wait) {
  const orStream_t native = native_stream(stream);
  if (wait) {
    KernelTask task{std::move(body), true, nullptr};
    OPENREG_CHECK(orLaunchKernelSync(native, &run_task, &task));
    if (task.error) std::rethrow_exception(task.error);
    return;
  }
  // The runtime owns an asynchronous task: it frees it once nothing can run
  // it anymore (after it ran, or with the graph that captured it).
  auto* task = new KernelTask{std::move(body), false, nullptr};
  const orError_t status = orLaunchKernelOwned(native, &run_task, task, &release_task);
  if (status != orSuccess) delete task;
  OPENREG_CHECK(status);
}

const c10::Storage& AliasBuilder::cpu_storage_for(const void* identity, void* device_data, size_t nbytes) {
  // Storages are told apart by their device address, or, for storages
  // without memory (all of them at address null), by the device storage
  // itself: two empty out= tensors must not look like aliases of each other
  // to the CPU kernel (linalg_qr's out= kernel checks whether Q aliases R).
  const void* key = device_data != nullptr ? device_data : identity;
  auto it = cpu_by_device_data_.find(key);
  if (it != cpu_by_device_data_.end()) return it->second;
  void* accessible = nullptr;
  if (device_data != nullptr && nbytes > 0) {
    // In process mode the runtime stages the memory for the kernel (a host
    // copy, written back when the kernel ends; runtime.h).
    OPENREG_CHECK(orKernelMapPointer(device_data, nbytes, &accessible));
  }
  return cpu_by_device_data_.emplace(key, cpu_alias::storage(accessible, nbytes)).first->second;
}

at::Tensor AliasBuilder::alias(const TensorRef& ref) {
  return cpu_alias::tensor(cpu_storage_for(ref.storage_identity, ref.storage_data, ref.storage_nbytes), ref.dtype,
                           ref.sizes, ref.strides, ref.storage_offset, ref.conj, ref.neg);
}

at::Tensor AliasBuilder::alias(const at::Tensor& t) {
  if (!t.defined()) return t;
  TORCH_INTERNAL_ASSERT(t.device().type() == c10::DeviceType::PrivateUse1);
  const auto known = cpu_by_tensor_.find(t.unsafeGetTensorImpl());
  if (known != cpu_by_tensor_.end()) return known->second;
  const c10::Storage& storage = t.storage();
  const c10::Storage& cpu = cpu_storage_for(
      storage.unsafeGetStorageImpl(),
      storage.mutable_data(), storage.nbytes());
  device_by_cpu_.emplace(cpu.unsafeGetStorageImpl(), storage);
  at::Tensor alias = cpu_alias::tensor(cpu, t.dtype(), t.sizes(), t.strides(), t.storage_offset(), t.is_conj(),
                                       t.is_neg());
  cpu_by_tensor_.emplace(t.unsafeGetTensorImpl(), alias);
  return alias;
}

const c10::Storage* AliasBuilder::device_storage_of(const c10::StorageImpl* cpu_storage) const {
  auto it = device_by_cpu_.find(cpu_storage);
  return it == device_by_cpu_.end() ? nullptr : &it->second;
}

at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like,
                       c10::DispatchKeySet key_set) {
  // Not the TensorImpl::VIEW constructor: it would leave out the autograd
  // keys and make an inference tensor without a version counter. Autograd
  // records the view relation above us, in ADInplaceOrView.
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), key_set, like.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                    like.storage_offset());
  view._set_conj(like.is_conj());
  view._set_neg(like.is_neg());
  return view;
}

}  // namespace openreg
