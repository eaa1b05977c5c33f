// CPU tensors over device memory, as both places that run PyTorch's CPU
// kernels for OpenReg build them: the stream workers and host functions of
// this process (DeviceKernel.cpp, Fallback.cpp) and the executor's operator
// kernel in process mode (ExecutorKernels.cpp, which links nothing of
// OpenReg but this header-only code and libtorch_cpu).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include <string_view>

namespace openreg::cpu_alias {

// A CPU storage of `nbytes` over `accessible` (memory the kernel may reach;
// null for a storage without memory). It owns nothing and cannot grow: a
// kernel that needs to resize it raises "not resizable".
inline c10::Storage storage(void* accessible, size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(accessible, c10::Device(c10::kCPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

// A CPU tensor over `storage` with a device tensor's geometry and bits. Not
// a TensorImpl::VIEW: the CPU kernel sees a plain tensor, with no autograd.
inline at::Tensor tensor(const c10::Storage& storage, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                         c10::IntArrayRef strides, int64_t offset, bool conj, bool neg) {
  auto alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                        c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  alias._set_conj(conj);
  alias._set_neg(neg);
  return alias;
}

// Puts one result of a queued CPU kernel where the caller holds it. The
// driver preallocated `target` from the Meta kernel's answer: a result
// Meta said views an input (`view`) must view it in the CPU kernel's
// result too; a fresh one is copied into the preallocated tensor.
inline void finish_output(std::string_view operator_name, const at::Tensor& produced, const at::Tensor& target,
                          bool view) {
  if (view) {
    TORCH_CHECK(produced.defined() &&
                    produced.storage().unsafeGetStorageImpl() == target.storage().unsafeGetStorageImpl(),
                "OpenReg: the Meta kernel of ", operator_name, " returns a view of an input, but its CPU "
                "kernel returns a new tensor");
    return;
  }
  target.copy_(produced);
}

}  // namespace openreg::cpu_alias
