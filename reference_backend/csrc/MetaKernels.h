#pragma once
// PyTorch's C++ Meta kernels, boxed, by operator (MetaKernels.cpp, generated
// at build time by gen_meta_kernels.py from ATen/ops/*_meta_dispatch.h).
//
// PyTorch 2.13 registers Python Meta kernels over most operators' C++ ones
// (torch/_meta_registrations.py); the C++ ones remain in libtorch as
// at::meta::<op>. For structured operators they are the checks and shape
// computation the CPU kernel itself runs first, at a few microseconds a call
// instead of 10 us to 15 ms. The asynchronous path of the CPU fallback asks
// them first (docs/reference-backend/streams-and-events.md).

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/operator_name.h>

#include <cstddef>

namespace openreg {

// The C++ Meta kernel of `name` (call it with callBoxed on the operator's
// handle and the Meta dispatch key), or nullptr when libtorch has none.
const c10::KernelFunction* cxx_meta_kernel(const c10::OperatorName& name);

// How many operators have one (for tests and docs).
size_t cxx_meta_kernel_count();

}  // namespace openreg
