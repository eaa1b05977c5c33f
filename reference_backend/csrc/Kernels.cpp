// Native PrivateUse1 kernels: the operators PyTorch cannot route through a
// CPU fallback because they create, reshape or move device memory itself.
#include "Allocator.h"
#include "DeviceKernel.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Quantized.h"
#include "Stream.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>

namespace openreg {

namespace {

constexpr auto kKey = c10::DispatchKey::PrivateUse1;

c10::DeviceIndex device_of(std::optional<c10::Device> device) {
  if (!device.has_value() || !device->has_index()) return current_device();
  check_openreg_device(*device, "device");
  check_device_index(device->index());
  return device->index();
}

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "OpenReg: pin_memory=True applies "
              "to host tensors only, not to tensors on an OpenReg device");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "OpenReg: only strided tensors are supported, got layout ",
              *layout);
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_of(device)));
  return at::detail::empty_generic(size, device_allocator(),
                                   c10::DispatchKeySet(kKey),
                                   c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "OpenReg: pin_memory=True applies "
              "to host tensors only, not to tensors on an OpenReg device");
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided,
              "OpenReg: only strided tensors are supported, got layout ",
              *layout);
  const c10::Device target(c10::DeviceType::PrivateUse1, device_of(device));
  const c10::DeviceGuard guard(target);
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(kKey),
                                           c10::dtype_or_default(dtype));
}

// Ensures the storage of `self` holds at least `nbytes`, growing it on the
// device (never through host memory).
void ensure_storage_bytes(const at::Tensor& self, size_t nbytes) {
  c10::StorageImpl* storage = self.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (nbytes > storage->nbytes()) resize_storage_bytes(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  auto* impl = self.unsafeGetTensorImpl();
  // As on CPU and CUDA, a tensor that already has the size keeps its strides
  // (softmax(x, out=non_contiguous) resizes its out= to the size it has).
  if (!impl->sizes().equals(size)) {
    const int64_t itemsize = static_cast<int64_t>(self.dtype().itemsize());
    const size_t needed = at::detail::computeStorageNbytesContiguous(
        size, itemsize, self.storage_offset());
    ensure_storage_bytes(self, needed);
    impl->set_sizes_contiguous(size);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "OpenReg: resize_ does not accept memory_format=preserve_format");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "OpenReg: set_: the storage must be on an OpenReg device, got ",
              source.device());
  // As at::native::checkSetStorage: set_ never moves a tensor to another device.
  TORCH_CHECK(source.device() == self.storage().device(),
              "Attempted to set the storage of a tensor on device \"", self.storage().device(),
              "\" to a storage on different device \"", source.device(),
              "\". This is no longer allowed; the devices must match.");
  TORCH_CHECK(offset >= 0, "OpenReg: set_: storage_offset must be >= 0, got ", offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  const c10::DeviceGuard guard(self.device());
  const auto itemsize = self.dtype().itemsize();
  const size_t needed = stride.empty()
      ? at::detail::computeStorageNbytesContiguous(size, itemsize, offset)
      : at::detail::computeStorageNbytes(size, stride, itemsize, offset);
  ensure_storage_bytes(self, needed);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  } else {
    impl->set_sizes_and_strides(size, stride, offset);
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto itemsize = static_cast<int64_t>(self.dtype().itemsize());
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source,
                                      c10::SymInt offset, c10::SymIntArrayRef size,
                                      c10::SymIntArrayRef stride) {
  return set_storage(self, std::move(source), offset.expect_int(),
                     C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                     source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  // The empty storage stays on self's device.
  const c10::DeviceGuard guard(self.device());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(),
                     /*resizable=*/true);
  return set_storage(self, empty, 0, {0}, {});
}

// ------------------------------------------------------------------ copies

// A tensor whose bytes can be moved as they are: contiguous, and no
// negation or conjugation bit to apply on the way.
bool plain_layout(const at::Tensor& t) {
  return t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

// Errors are raised where the copy is made, in the calling thread, never by
// the kernel (which runs later and would surface its error at some unrelated
// synchronization): copies are validated on the host before anything is
// enqueued, as CUDA does.
//
// Shapes and memory overlap: exactly what CPU copy_ checks, through the same
// TensorIterator configuration, built over the device tensors' metadata.
// Nothing of their memory is read.
void validate_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (src.is_same(dst)) return;
  const bool same_data = src.is_alias_of(dst) && src.storage_offset() == dst.storage_offset() &&
      src.strides().equals(dst.strides()) && src.sizes().equals(dst.sizes()) &&
      src.scalar_type() == dst.scalar_type() && src.is_conj() == dst.is_conj() &&
      src.is_neg() == dst.is_neg();
  if (same_data) return;  // CPU copy_ returns early for these too
  at::TensorIteratorConfig()
      .add_output(dst)
      .add_const_input(src)
      .resize_outputs(false)
      .check_all_same_dtype(false)
      .check_all_same_device(false)
      .build();
}

// Element conversions: the kernel runs CPU copy_ between the two dtypes, so
// the pair is tried once on the CPU (a strided copy of a few zero bytes, the
// kernel's own path) and the answer kept. The CPU's error is the one raised.
void validate_conversion(c10::ScalarType from, c10::ScalarType to) {
  constexpr int kTypes = static_cast<int>(c10::ScalarType::NumOptions);
  static std::atomic<int8_t> known[kTypes][kTypes] = {};  // 0 unknown, 1 ok, -1 fails
  auto& slot = known[static_cast<int>(from)][static_cast<int>(to)];
  if (slot.load(std::memory_order_relaxed) == 1) return;
  auto zeros = [](c10::ScalarType type) {
    const int64_t itemsize = static_cast<int64_t>(c10::elementSize(type));
    return at::zeros({2, 2 * itemsize}, at::kByte).view(type);
  };
  try {
    const c10::impl::ExcludeDispatchKeyGuard no_autograd(
        c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    zeros(to).t().copy_(zeros(from));
  } catch (const c10::Error& e) {
    slot.store(-1, std::memory_order_relaxed);
    TORCH_CHECK(false, "OpenReg: copy_ from ", from, " to ", to, " on the device is not supported: ",
                e.what_without_backtrace());
  }
  slot.store(1, std::memory_order_relaxed);
}

// Same-device copy with conversion/striding: a kernel running CPU copy_.
void copy_on_device(const at::Tensor& src, const at::Tensor& dst, const c10::Stream& stream) {
  validate_conversion(src.scalar_type(), dst.scalar_type());
  if (process_mode()) {
    launch_copy_in_executor(stream, src, dst);
    return;
  }
  launch_kernel(stream, [src = TensorRef(src), dst = TensorRef(dst)] {
    AliasBuilder builder;
    builder.alias(dst).copy_(builder.alias(src));
  }, /*wait=*/false);
}

void copy_device_to_device(const at::Tensor& src, const at::Tensor& dst) {
  const auto dst_index = dst.device().index();
  const auto src_index = src.device().index();
  const c10::Stream dst_stream = current_stream(dst_index);
  if (src_index == dst_index) {
    if (plain_layout(src) && plain_layout(dst) && src.dtype() == dst.dtype() &&
        src.sizes().equals(dst.sizes())) {
      OPENREG_CHECK(orMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), dst.nbytes(),
                                  orMemcpyDeviceToDevice, native_stream(dst_stream)));
    } else {
      copy_on_device(src, dst, dst_stream);
    }
    return;
  }
  // Across devices: make a plain copy of src on its own device, move it with
  // a peer copy ordered after src's stream, then convert on dst's device.
  at::Tensor staged_src;
  {
    const c10::DeviceGuard guard(src.device());
    staged_src = at::empty(dst.sizes(), src.options().dtype(dst.dtype()));
    copy_device_to_device(src.expand_as(dst), staged_src);
  }
  const c10::Stream src_stream = current_stream(src_index);
  orEvent_t ready = nullptr;
  {
    const c10::DeviceGuard guard(src.device());
    OPENREG_CHECK(orEventCreateWithFlags(&ready, orEventDisableTiming));
    OPENREG_CHECK(orEventRecord(ready, native_stream(src_stream)));
  }
  const orError_t waited = orStreamWaitEvent(native_stream(dst_stream), ready);
  orEventDestroy(ready);
  OPENREG_CHECK(waited);
  at::Tensor target = dst;
  if (!plain_layout(dst)) {
    const c10::DeviceGuard guard(dst.device());
    target = at::empty(dst.sizes(), dst.options());
  }
  OPENREG_CHECK(orMemcpyAsync(target.data_ptr(), staged_src.const_data_ptr(),
                              target.nbytes(), orMemcpyDeviceToDevice,
                              native_stream(dst_stream)));
  // The staging buffer is a block of src's device read by dst's stream: it
  // must not be reused before that stream's copy has run.
  record_stream(staged_src.storage().data_ptr(), dst_stream);
  if (!target.is_same(dst)) copy_on_device(target, dst, dst_stream);
}

void copy_host_to_device(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const c10::Stream stream = current_stream(dst.device().index());
  const orStream_t native = native_stream(stream);
  // Convert and lay out on the host, where that is cheap, then move bytes.
  at::Tensor host = src.to(dst.dtype()).expand_as(dst).contiguous().resolve_conj().resolve_neg();
  at::Tensor target = dst;
  if (!plain_layout(dst)) {
    const c10::DeviceGuard guard(dst.device());
    target = at::empty(dst.sizes(), dst.options());
  }
  const size_t nbytes = host.nbytes();
  // Asynchronous only when the bytes are read straight from the caller's
  // pinned memory (no conversion made a temporary).
  const bool pinned_source = host.storage().is_alias_of(src.storage()) &&
      is_pinned_pointer(host.const_data_ptr());
  if (target.is_same(dst) && !(non_blocking && pinned_source)) {
    // One call: on an idle stream the calling thread copies (no hand-over to
    // the stream's worker and back).
    OPENREG_CHECK(orMemcpySync(target.data_ptr(), host.const_data_ptr(), nbytes, orMemcpyHostToDevice, native));
    return;
  }
  OPENREG_CHECK(orMemcpyAsync(target.data_ptr(), host.const_data_ptr(), nbytes, orMemcpyHostToDevice, native));
  if (!target.is_same(dst)) copy_on_device(target, dst, stream);
  if (non_blocking && pinned_source) {
    // The caller may not touch src until the stream is done; the allocator
    // keeps the pinned block alive until then.
    record_host_use(host.storage().mutable_data(), host.storage().data_ptr().get_context(), stream);
    return;
  }
  OPENREG_CHECK(orStreamSynchronize(native));  // pageable memory: like CUDA
}

void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const c10::Stream stream = current_stream(src.device().index());
  const orStream_t native = native_stream(stream);
  at::Tensor source = src;
  if (!plain_layout(src)) {
    const c10::DeviceGuard guard(src.device());
    source = at::empty(src.sizes(), src.options());
    copy_on_device(src, source, stream);
  }
  const bool direct = plain_layout(dst) && dst.dtype() == src.dtype() &&
      dst.sizes().equals(src.sizes());
  at::Tensor host = direct ? dst : at::empty(src.sizes(), src.options().device(c10::kCPU));
  const size_t nbytes = source.nbytes();
  if (direct && non_blocking && is_pinned_pointer(host.const_data_ptr())) {
    OPENREG_CHECK(orMemcpyAsync(host.data_ptr(), source.const_data_ptr(), nbytes, orMemcpyDeviceToHost, native));
    record_host_use(host.storage().mutable_data(), host.storage().data_ptr().get_context(), stream);
    return;
  }
  OPENREG_CHECK(orMemcpySync(host.data_ptr(), source.const_data_ptr(), nbytes, orMemcpyDeviceToHost, native));
  if (!direct) dst.copy_(host);
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "OpenReg: copy_: undefined tensor");
  if (self.is_quantized() || dst.is_quantized()) {
    // ATen's copy_ has given dst src's quantizer: only the integers move.
    TORCH_CHECK(self.is_quantized() && dst.is_quantized() && self.scalar_type() == dst.scalar_type(),
                "OpenReg: copy_ between a ", self.scalar_type(), " and a ", dst.scalar_type(),
                " tensor: a quantized tensor copies only to and from quantized tensors of its dtype "
                "(quantize or dequantize first)");
    copy_from(int_view(self), int_view(dst), non_blocking);
    return dst;
  }
  const bool src_device = self.device().type() == c10::DeviceType::PrivateUse1;
  const bool dst_device = dst.device().type() == c10::DeviceType::PrivateUse1;
  TORCH_CHECK((src_device || self.is_cpu()) && (dst_device || dst.is_cpu()),
              "OpenReg: copies are supported between OpenReg devices and the CPU, "
              "not from ", self.device(), " to ", dst.device());
  validate_copy(self, dst);
  if (dst.numel() == 0) return dst;
  if (src_device && dst_device) {
    copy_device_to_device(self, dst);
  } else if (dst_device) {
    copy_host_to_device(self, dst, non_blocking);
  } else {
    copy_device_to_host(self, dst, non_blocking);
  }
  return dst;
}

namespace {

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "OpenReg: a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  const at::Tensor element = self.reshape({});
  copy_device_to_host(element, host, /*non_blocking=*/false);
  return host.item();
}

// PyTorch routes F.dropout on PrivateUse1 to native_dropout, which has no
// generator argument: through the CPU fallback it would draw from the CPU
// generator. Build the mask with bernoulli_ on the device instead, so that it
// draws from the device's default generator. Semantics as the CPU kernel.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options().dtype(c10::kBool))};
  }
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(c10::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

void record_stream_op(at::Tensor& self, c10::Stream stream) {
  record_stream(self.storage().data_ptr(), stream);
}

// ------------------------------------------------------- shallow copies

// `cpu_tensor.data = device_tensor` (and Module.to, which swaps parameters'
// data) asks whether the two TensorImpls may be shallow-copied into each
// other. TensorImpl's own answer only knows PyTorch's in-tree dense
// backends, and c10/core/TensorImpl.h leaves the answer for PrivateUse1 to
// the backend: dense strided OpenReg and CPU tensors are compatible, as
// dense CUDA and CPU tensors are; anything else keeps PyTorch's answer.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](c10::DispatchKeySet keys) {
    constexpr auto backends = c10::DispatchKeySet(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
    return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(backends);
  };
  const c10::DispatchKeySet self_keys = self.key_set();
  const c10::DispatchKeySet from_keys = from.key_set();
  if (dense(self_keys) && dense(from_keys)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from_keys);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("record_stream", TORCH_FN(record_stream_op));
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

// Negative and conjugate views. PyTorch's Negative and Conjugate fallbacks
// materialize such a tensor before any operator they do not know runs: with
// clone(), i.e. copy_, which for an OpenReg tensor calls _copy_from, which
// they do not know either, so it would materialize its argument again, with
// clone(), forever (a stack overflow). OpenReg's copies apply the bits
// themselves (plain_layout above: the kernel runs CPU copy_ on aliases that
// keep the bits), so the two operators pass both fallbacks by.
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace openreg
