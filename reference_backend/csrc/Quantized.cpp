// Quantized tensors (per-tensor affine) on OpenReg.
//
// A quantized tensor is a QTensorImpl: its storage holds the integers
// (int8, uint8 or int32) and its quantizer the scale and zero point; its
// dispatch key is QuantizedPrivateUse1 (ATen's new_qtensor allocates it with
// the PrivateUse1 allocator). PyTorch has no CPU fallback for these keys, so
// a backend registers what its quantized tensors need:
//
// - PrivateUse1: quantize_per_tensor (a float device tensor in, a quantized
//   one out) and _empty_affine_quantized (the factory that .to(), clone(),
//   empty_like() and torch.load use for quantized tensors);
// - QuantizedPrivateUse1: empty_quantized (a new tensor like a quantized
//   one, on any device), clone, the quantizer's accessors, int_repr, dequantize,
//   the views, set_ (torch.load) and _copy_from (copies to, from and
//   between quantized tensors: the bytes of the integers; ATen's copy_ has
//   already given the destination the source's quantizer).
//
// The arithmetic runs on the device, over an integer tensor that aliases
// the quantized tensor's storage (int_view).
#include "Quantized.h"

#include <ATen/ATen.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <utility>

namespace openreg {

namespace {

// The integer range of a quantized dtype.
std::pair<int64_t, int64_t> quantized_range(at::ScalarType dtype) {
  switch (dtype) {
    case at::kQInt8:
      return {-128, 127};
    case at::kQUInt8:
      return {0, 255};
    case at::kQInt32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default:
      TORCH_CHECK(false, "openreg: quantized dtype must be torch.qint8, torch.quint8 or torch.qint32, got ", dtype);
  }
}

}  // namespace

at::ScalarType quantized_int_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kQInt8:
      return at::kChar;
    case at::kQUInt8:
      return at::kByte;
    case at::kQInt32:
      return at::kInt;
    default:
      TORCH_CHECK(false, "openreg: quantized dtype must be torch.qint8, torch.quint8 or torch.qint32, got ", dtype);
  }
}

at::Tensor int_view(const at::Tensor& q) {
  at::Tensor view = at::empty({0}, q.options().dtype(quantized_int_type(q.scalar_type())));
  view.set_(q.storage(), q.storage_offset(), q.sizes(), q.strides());
  return view;
}

namespace {

at::Tensor quantize_per_tensor(const at::Tensor& self, double scale, int64_t zero_point, at::ScalarType dtype) {
  TORCH_CHECK(at::isQIntType(dtype) && dtype != at::kQUInt4x2 && dtype != at::kQUInt2x4,
              "quantize_per_tensor on openreg: dtype must be torch.qint8, torch.quint8 or torch.qint32, got ", dtype);
  TORCH_CHECK(at::isFloatingType(self.scalar_type()),
              "quantize_per_tensor on openreg: self must be a floating tensor, got ", self.scalar_type());
  TORCH_CHECK(scale > 0.0 && std::isfinite(scale),
              "quantize_per_tensor on openreg: scale must be a positive finite number, got ", scale);
  const auto [qmin, qmax] = quantized_range(dtype);
  TORCH_CHECK(zero_point >= qmin && zero_point <= qmax, "quantize_per_tensor on openreg: zero_point must be in [",
              qmin, ", ", qmax, "] for ", dtype, ", got ", zero_point);
  const c10::DeviceGuard guard(self.device());
  at::Tensor q = at::_empty_affine_quantized(self.sizes(), self.options().dtype(dtype), scale, zero_point);
  if (q.numel() == 0) return q;
  // CPU's rule (ATen's quantize_val): zero_point + round-half-even(x * (1/scale)),
  // in float, clamped to the dtype's range.
  const float inverse = 1.0f / static_cast<float>(scale);
  at::Tensor scaled = self.to(at::kFloat) * inverse;
  scaled = scaled.round();
  at::Tensor ints;
  if (dtype == at::kQInt32) {
    // The int32 range does not fit float32 exactly: clamp in float64.
    ints = scaled.to(at::kDouble).add_(zero_point).clamp_(qmin, qmax).to(at::kInt);
  } else {
    ints = scaled.add_(zero_point).clamp_(qmin, qmax).to(quantized_int_type(dtype));
  }
  int_view(q).copy_(ints);
  return q;
}

at::Tensor empty_affine_quantized(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                                  std::optional<at::Layout> layout, std::optional<at::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<at::MemoryFormat> memory_format) {
  const at::ScalarType type = dtype.value_or(at::kQInt8);
  quantized_range(type);  // rejects a dtype that is not one of the three
  // ATen's new_qtensor allocates on the current device: make it the one asked for.
  const c10::OptionalDeviceGuard guard(device);
  return at::native::empty_affine_quantized(size, type, layout, device, pin_memory, scale, zero_point,
                                            memory_format);
}

at::Tensor empty_quantized(at::IntArrayRef size, const at::Tensor& qtensor, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device.has_value() ? device : std::optional<at::Device>(qtensor.device()));
  return at::native::empty_quantized(size, qtensor, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor int_repr(const at::Tensor& self) {
  return int_view(self).clone(at::MemoryFormat::Preserve);
}

at::Tensor dequantize(const at::Tensor& self) {
  TORCH_CHECK(self.qscheme() == at::kPerTensorAffine,
              "dequantize on openreg: only per-tensor affine quantized tensors are supported, got ",
              toString(self.qscheme()));
  const double scale = self.q_scale();
  const int64_t zero_point = self.q_zero_point();
  // CPU's rule (ATen's dequantize_val): (q - zero_point) * scale, in float.
  return (int_view(self).to(at::kFloat) - zero_point).mul_(static_cast<float>(scale));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("quantize_per_tensor", TORCH_FN(quantize_per_tensor));
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
}

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("_empty_affine_quantized", TORCH_FN(empty_affine_quantized));
  m.impl("empty_quantized", TORCH_FN(empty_quantized));
  m.impl("clone", TORCH_FN(at::native::quantized_clone));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
  m.impl("int_repr", TORCH_FN(int_repr));
  m.impl("dequantize.self", TORCH_FN(dequantize));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_qtensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_quantized_));
  m.impl("_copy_from", TORCH_FN(copy_from));
}

}  // namespace openreg
