// Autocast for OpenReg: PyTorch's standard cast policy (the same operator
// lists CUDA uses, shipped in ATen/autocast_mode.h), registered for the
// AutocastPrivateUse1 key. The lower-precision dtype is the one chosen in
// torch.autocast("openreg", dtype=...): float16 (default) or bfloat16, the
// dtypes torch.openreg.get_amp_supported_dtype() advertises. Operators
// without a policy fall through (see Fallback.cpp).
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>


namespace {

using at::Tensor;
using c10::IntArrayRef;
using c10::Scalar;
using c10::ScalarType;

#define OPENREG_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define OPENREG_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define OPENREG_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define OPENREG_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(OPENREG_LOWER_PRECISION_FP)
  AT_FORALL_FP32(OPENREG_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENREG_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(OPENREG_PROMOTE)
}

}  // namespace
