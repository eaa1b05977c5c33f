// libopenreg_torch_kernels: the module kernel that runs a PyTorch operator
// inside a device's executor process (OPENREG_EXECUTOR=process).
//
// The driver (Fallback.cpp's asynchronous path) has already asked the Meta
// kernel for the results' geometry, allocated them on the device and
// returned them to the caller; it queues this kernel on the stream with the
// operator's description (OperatorPayload.h). Here, in the executor, device
// memory is ordinary memory: the kernel builds CPU tensors over it (one CPU
// storage per device allocation, so views keep aliasing each other), runs
// the operator's CPU kernel, and copies fresh results into the preallocated
// ones. An error becomes the stream's sticky error, as on a stream worker in
// thread mode; a crash takes only the executor (the device is lost).
//
// The module needs only runtime.h's module interface and libtorch_cpu: it
// never calls the runtime (device memory is reached through the context).

#include "CpuAlias.h"
#include "OperatorPayload.h"

#include <openreg/runtime.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <mutex>
#include <unordered_map>

namespace {

using openreg::payload::ArgKind;
using openreg::payload::ElementTag;
using openreg::payload::Reader;
using openreg::payload::TensorDesc;

c10::OperatorHandle find_operator(const std::string& name, const std::string& overload) {
  static std::mutex mutex;
  static auto* known = new std::unordered_map<std::string, c10::OperatorHandle>();
  const std::string key = name + "." + overload;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = known->find(key);
  if (it == known->end()) {
    it = known->emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str()))
             .first;
  }
  return it->second;
}

class Aliases {
 public:
  Aliases(const orKernelContext* context, std::vector<TensorDesc> refs)
      : context_(context), refs_(std::move(refs)), tensors_(refs_.size()) {}

  at::Tensor get(int32_t ref) {
    TORCH_CHECK(ref >= 0 && static_cast<size_t>(ref) < refs_.size(),
                "OpenReg: malformed operator payload (tensor ", ref, ")");
    if (tensors_[ref].defined()) return tensors_[ref];
    const TensorDesc& d = refs_[ref];
    const auto dtype = c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(d.scalar_type));
    tensors_[ref] = openreg::cpu_alias::tensor(storage_for(d), dtype, d.sizes, d.strides, d.offset, d.conj, d.neg);
    return tensors_[ref];
  }

 private:
  const c10::Storage& storage_for(const TensorDesc& d) {
    const uint64_t key = d.data != 0 ? d.data : d.identity;
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    void* accessible = nullptr;
    if (d.data != 0 && d.nbytes > 0) {
      const orError_t status =
          context_->map_pointer(reinterpret_cast<const void*>(d.data), d.nbytes, &accessible);
      TORCH_CHECK(status == orSuccess, "OpenReg: the operator's tensor at 0x", std::hex, d.data, std::dec,
                  " (", d.nbytes, " bytes) is not memory of device ", context_->device);
    }
    return storages_.emplace(key, openreg::cpu_alias::storage(accessible, d.nbytes)).first->second;
  }

  const orKernelContext* context_;
  std::vector<TensorDesc> refs_;
  std::vector<at::Tensor> tensors_;
  std::unordered_map<uint64_t, c10::Storage> storages_;
};

at::Tensor read_element(Reader& r, Aliases& aliases, bool* none) {
  *none = false;
  switch (r.get<ElementTag>()) {
    case ElementTag::kUndefined:
      return at::Tensor();
    case ElementTag::kNone:
      *none = true;
      return at::Tensor();
    case ElementTag::kRef:
      return aliases.get(r.get<int32_t>());
    case ElementTag::kCpuScalar: {
      const auto type = static_cast<c10::ScalarType>(r.get<int32_t>());
      const bool wrapped = r.get<uint8_t>() != 0;
      const c10::IValue value = r.get_value();
      at::Tensor t = at::scalar_tensor(value.toScalar(), at::TensorOptions().dtype(type));
      t.unsafeGetTensorImpl()->set_wrapped_number(wrapped);
      return t;
    }
  }
  TORCH_CHECK(false, "OpenReg: malformed operator payload (unknown element tag)");
}

void run_operator(const orKernelContext* context, const void* params, size_t size) {
  Reader r(params, size);
  TORCH_CHECK(r.get<uint32_t>() == openreg::payload::kMagic, "OpenReg: malformed operator payload (magic)");
  const auto settings = r.get<openreg::payload::Settings>();
  const std::string name = r.get_string();
  const std::string overload = r.get_string();
  const c10::OperatorHandle op = find_operator(name, overload);
  std::vector<TensorDesc> refs(r.get<uint32_t>());
  for (TensorDesc& d : refs) d = r.get_tensor();
  Aliases aliases(context, std::move(refs));

  torch::jit::Stack stack;
  const auto num_args = r.get<uint32_t>();
  TORCH_CHECK(num_args == op.schema().arguments().size(), "OpenReg: malformed operator payload (", name,
              " takes ", op.schema().arguments().size(), " arguments, not ", num_args, ")");
  for (uint32_t i = 0; i < num_args; ++i) {
    switch (r.get<ArgKind>()) {
      case ArgKind::kValue:
        stack.push_back(r.get_value());
        break;
      case ArgKind::kGenerator: {
        if (r.get<uint8_t>() == 0) {
          stack.emplace_back();
          break;
        }
        const auto n = r.get<uint64_t>();
        const char* state = r.take(n);
        at::Tensor bytes = at::empty({static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kByte));
        std::memcpy(bytes.data_ptr(), state, n);
        at::Generator generator = at::make_generator<at::CPUGeneratorImpl>();
        generator.set_state(bytes);
        stack.emplace_back(generator);
        break;
      }
      case ArgKind::kTensor: {
        TORCH_CHECK(r.get<uint32_t>() == 1, "OpenReg: malformed operator payload (tensor argument)");
        bool none = false;
        stack.emplace_back(read_element(r, aliases, &none));
        break;
      }
      case ArgKind::kTensorList: {
        c10::List<at::Tensor> list;
        const auto n = r.get<uint32_t>();
        bool none = false;
        for (uint32_t k = 0; k < n; ++k) list.push_back(read_element(r, aliases, &none));
        stack.emplace_back(std::move(list));
        break;
      }
      case ArgKind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        const auto n = r.get<uint32_t>();
        for (uint32_t k = 0; k < n; ++k) {
          bool none = false;
          at::Tensor t = read_element(r, aliases, &none);
          if (none) {
            list.push_back(std::nullopt);
          } else {
            list.push_back(std::move(t));
          }
        }
        stack.emplace_back(std::move(list));
        break;
      }
      default:
        TORCH_CHECK(false, "OpenReg: malformed operator payload (argument kind)");
    }
  }

  struct Output {
    uint32_t ret;
    int32_t element;
    int32_t ref;
    bool view;
  };
  std::vector<Output> outputs(r.get<uint32_t>());
  for (Output& o : outputs) {
    o.ret = r.get<uint32_t>();
    o.element = r.get<int32_t>();
    o.ref = r.get<int32_t>();
    o.view = r.get<uint8_t>() != 0;
  }
  TORCH_CHECK(r.done(), "OpenReg: malformed operator payload (trailing bytes)");

  // The host's settings at the launch, as a stream worker in thread mode reads them.
  settings.apply();
  // Aliases are plain CPU tensors: skip autograd and view tracking.
  const c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  for (const Output& o : outputs) {
    TORCH_CHECK(o.ret < stack.size(), "OpenReg: malformed operator payload (result ", o.ret, ")");
    const c10::IValue& value = stack[o.ret];
    const at::Tensor produced = o.element >= 0 ? value.toTensorList().get(o.element) : value.toTensor();
    openreg::cpu_alias::finish_output(name, produced, aliases.get(o.ref), o.view);
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) orError_t openreg_run_operator(
    const orKernelContext* context, const void* params, size_t params_size) {
  try {
    run_operator(context, params, params_size);
    return orSuccess;
  } catch (const c10::Error& e) {
    context->set_error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    context->set_error(e.what());
  }
  return orErrorKernelFailed;
}

extern "C" __attribute__((visibility("default"))) orError_t openreg_report_settings(
    const orKernelContext* context, const void* params, size_t params_size) {
  uint64_t address = 0;
  if (params_size != sizeof(address)) {
    context->set_error("openreg_report_settings: the parameters are one device address");
    return orErrorInvalidValue;
  }
  std::memcpy(&address, params, sizeof(address));
  const auto settings = openreg::payload::Settings::capture();
  void* accessible = nullptr;
  if (orError_t e = context->map_pointer(reinterpret_cast<const void*>(address), sizeof(settings), &accessible)) {
    context->set_error("openreg_report_settings: the address is not memory of the kernel's device");
    return e;
  }
  std::memcpy(accessible, &settings, sizeof(settings));
  return orSuccess;
}
