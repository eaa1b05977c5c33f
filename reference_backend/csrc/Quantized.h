// Quantized tensors on OpenReg (Quantized.cpp): the pieces the copies in
// Kernels.cpp share with the quantized kernels.
#pragma once

#include <ATen/core/Tensor.h>

namespace openreg {

// The integer dtype that stores a quantized dtype (qint8 -> int8, quint8 ->
// uint8, qint32 -> int32); raises for any other dtype.
at::ScalarType quantized_int_type(at::ScalarType dtype);

// A dense integer tensor over a quantized tensor's storage (same sizes,
// strides and offset), on the same device: the integers, without the quantizer.
at::Tensor int_view(const at::Tensor& q);

// OpenReg's _copy_from (Kernels.cpp), also registered for QuantizedPrivateUse1.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

}  // namespace openreg
