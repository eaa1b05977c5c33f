// The CPU fallback: any ATen operator without an OpenReg kernel runs as a
// device kernel that calls PyTorch's CPU kernel on aliases of the device
// tensors (see DeviceKernel.h), on the current stream of the tensors' device.
//
// * Random operators draw from the device's generator: a missing generator
//   argument becomes the device's default generator. At the launch, on the
//   host, each random kernel gets a CPU generator of its own whose state is
//   the next words of that generator's sequence (kernel_generator), so
//   random operators queue too, and launch order alone decides their
//   numbers.
// * Results that alias an input (views, in-place and out= results) alias the
//   device storage; fresh results are moved to the device.
// * out= arguments that must grow are grown on the device first (the needed
//   size comes from the operator's Meta kernel).
// * Mixing devices, or CPU tensors with device tensors (but 0-dim CPU
//   inputs), is an error naming both devices, as on CUDA. Operators without a CPU kernel
//   fail with an error naming the operator and the device.
// Operators whose Meta kernel tells the results' geometry return at once
// with their kernel queued on the stream (the asynchronous path, below; the
// default). The others, and every operator with asynchronous operators off
// (OPENREG_ASYNC_OPERATORS=0), take the synchronous path: it waits for its
// kernel, because it must know the results' shapes to build them.
#include "CpuAlias.h"
#include "DeviceKernel.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Generator.h"
#include "MetaKernels.h"
#include "OperatorPayload.h"
#include "Stream.h"
#include "Allocator.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ScopeExit.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_set>

namespace openreg {

namespace {

bool on_openreg(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) fn(t);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) fn(element.toTensor());
    }
  }
}

bool is_optional_generator(const c10::Argument& argument) {
  const auto& type = argument.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
      c10::TypeKind::GeneratorType;
}

bool writes(const c10::Argument& argument) {
  return argument.alias_info() && argument.alias_info()->isWrite();
}

// Operators whose CUDA kernels accept CPU index tensors next to device tensors.
bool accepts_cpu_indices(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put"};
  return ops.count(name.name) != 0;
}

std::string describe(const c10::Device& device) {
  std::ostringstream out;
  out << device;
  return out.str();
}

// Finds the one OpenReg device the operator runs on, and rejects mixtures.
c10::DeviceIndex find_device(const c10::FunctionSchema& schema,
                             c10::ArrayRef<c10::IValue> args) {
  c10::DeviceIndex device = -1;
  std::string cpu_argument;
  const bool cpu_indices_ok = accepts_cpu_indices(schema.operator_name());
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    // A CPU scalar may be an input next to device tensors (as on CUDA), never
    // a tensor the operator writes (an out= tensor).
    const bool written = writes(schema.arguments()[i]);
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (on_openreg(t)) {
        const auto index = t.device().index();
        TORCH_CHECK(device == -1 || device == index,
                    "Expected all tensors to be on the same device, but found at "
                    "least two devices, openreg:", static_cast<int>(device),
                    " and openreg:", static_cast<int>(index),
                    "! (when checking argument '", name, "' of ", schema.name(), ")");
        device = index;
      } else if (t.is_cpu()) {
        if ((t.dim() > 0 || written) && !cpu_indices_ok && cpu_argument.empty()) cpu_argument = name;
      } else {
        TORCH_CHECK(false, "OpenReg: ", schema.name(), " got argument '", name,
                    "' on ", describe(t.device()),
                    "; only OpenReg and CPU tensors can be mixed");
      }
    });
    if (args[i].isDevice() && device == -1) {
      const c10::Device d = args[i].toDevice();
      if (d.type() == c10::DeviceType::PrivateUse1) {
        device = d.has_index() ? d.index() : current_device();
      }
    }
  }
  TORCH_CHECK(device != -1, "OpenReg: ", schema.name(), " was dispatched to "
              "OpenReg without any OpenReg tensor or device argument");
  check_device_index(device, "device");
  TORCH_CHECK(cpu_argument.empty(),
              "Expected all tensors to be on the same device, but found at least "
              "two devices, openreg:", static_cast<int>(device), " and cpu! (when "
              "checking argument '", cpu_argument, "' of ", schema.name(), ")");
  return device;
}

// Builds the meta counterpart of an argument, for shape inference.
c10::IValue to_meta(const c10::IValue& value) {
  auto meta = [](const at::Tensor& t) -> at::Tensor {
    if (!on_openreg(t)) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  if (value.isTensor()) return meta(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) list.push_back(meta(t));
    return list;
  }
  if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::kMeta);
  }
  return value;
}

// Grows out= arguments on the device so that the CPU kernel finds them big
// enough (alias storages cannot grow). Returns whether any grew (false if
// Meta cannot tell).
bool grow_out_arguments(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto& arguments = op.schema().arguments();
  bool has_out = false;
  for (size_t i = 0; i < args.size(); ++i) {
    has_out |= writes(arguments[i]) && arguments[i].kwarg_only() && args[i].isTensor();
  }
  if (!has_out || !op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return false;
  torch::jit::Stack meta_stack;
  for (size_t i = 0; i < args.size(); ++i) {
    meta_stack.push_back(is_optional_generator(arguments[i]) ? c10::IValue() : to_meta(args[i]));
  }
  std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
  } catch (const c10::Error&) {
    return false;  // the CPU kernel will report the problem
  }
  bool grew = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!(writes(arguments[i]) && arguments[i].kwarg_only() && args[i].isTensor())) continue;
    const at::Tensor& out = args[i].toTensor();
    const at::Tensor& shaped = meta_args[i].toTensor();
    if (!on_openreg(out)) continue;
    const size_t needed = at::detail::computeStorageNbytes(
        shaped.sizes(), shaped.strides(), shaped.dtype().itemsize(), shaped.storage_offset());
    auto* storage = out.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (needed > storage->nbytes()) {
      resize_storage_bytes(storage, needed);
      grew = true;
    }
  }
  return grew;
}

// Host side, at a random kernel's launch: the generator its CPU kernel gets
// for a `Generator?` argument: a CPU generator of its own, whose state is the
// next words of the OpenReg generator's sequence (the device's default one
// for None), and how to give those words back (KernelGenerator::undo).
// Rejects generators of another device type, at the call.
KernelGenerator kernel_generator_for(const c10::IValue& value, c10::DeviceIndex device) {
  // The words are drawn here, at the launch: a graph's replays would not
  // draw from the device's generator.
  TORCH_CHECK(!is_capturing(current_stream(device)),
              "OpenReg: a random operator cannot be captured in a graph (device ", static_cast<int>(device),
              "): its numbers come from the device's generator when it is launched, which a replay does not do; "
              "run it outside the capture");
  if (value.isNone()) {
    return kernel_generator(default_generator(device));
  }
  const at::Generator generator = value.toGenerator();
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'openreg' device type for generator but found '",
              generator.device().type(), "'");
  return kernel_generator(generator);
}

c10::IValue as_ivalue(const at::Generator& generator) {
  return generator.defined() ? c10::IValue(generator) : c10::IValue();
}

// Worker side: replaces device tensors by aliases. (Generators were
// replaced on the host: kernel_generator_for.)
c10::IValue to_cpu(const c10::IValue& value, const c10::Argument& argument,
                   AliasBuilder& builder) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return on_openreg(t) ? builder.alias(t) : t;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) {
      list.push_back(on_openreg(t) ? builder.alias(t) : t);
    }
    return list;
  }
  if (value.isList() && !value.toListRef().empty() &&
      argument.type()->kind() == c10::TypeKind::ListType) {
    // Tensor?[] (e.g. index): a list of optional tensors.
    auto element = argument.type()->castRaw<c10::ListType>()->getElementType();
    if (element->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& v : value.toListRef()) {
        if (v.isNone()) {
          list.push_back(std::nullopt);
        } else {
          const at::Tensor& t = v.toTensor();
          list.push_back(on_openreg(t) ? builder.alias(t) : t);
        }
      }
      return list;
    }
  }
  if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::kCPU);
  }
  return value;
}

// Caller side: a CPU result becomes a device tensor (a view if it aliases a
// device storage, otherwise a copy on `device`).
at::Tensor to_device(const at::Tensor& t, const AliasBuilder& builder,
                     c10::DeviceIndex device, const c10::FunctionSchema& schema) {
  if (!t.defined()) return t;
  // Only strided tensors live on OpenReg devices: a sparse (or other opaque)
  // result of the CPU kernel means the operator is not supported here.
  TORCH_CHECK(t.layout() == c10::kStrided, "OpenReg: operator ", schema.name(),
              " is not supported on openreg:", static_cast<int>(device),
              ": its CPU kernel returned a tensor with layout ", t.layout(),
              ", but OpenReg supports strided tensors only");
  const c10::Storage* storage = builder.device_storage_of(t.storage().unsafeGetStorageImpl());
  if (storage) {
    return device_view(*storage, t, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1));
  }
  const auto options = t.options().device(c10::Device(c10::DeviceType::PrivateUse1, device));
  // A dense result keeps the layout the CPU kernel gave it.
  at::Tensor result = t.is_non_overlapping_and_dense()
      ? at::empty_strided(t.sizes(), t.strides(), options)
      : at::empty(t.sizes(), options);
  result.copy_(t);
  return result;
}

// The argument that return `r` is (an in-place or out= result: the caller's
// own tensor is returned), or nullopt for a return of its own.
std::optional<size_t> returned_argument(const c10::FunctionSchema& schema, size_t r) {
  const auto& ret = schema.returns()[r].alias_info();
  if (!ret || !ret->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& info = schema.arguments()[i].alias_info();
    if (info && info->isWrite() && info->beforeSets() == ret->beforeSets()) return i;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- asynchronous path
//
// With asynchronous operators on (the default; OPENREG_ASYNC_OPERATORS=0
// turns them off), most operators return at once, as on a real
// accelerator: the host learns the results' geometry from the operator's
// Meta kernel (PyTorch's C++ one where libtorch has it, else the registered
// one, mostly Python: MetaKernels.h), allocates fresh results on the
// device, builds views of the inputs' storages for results that alias
// them, and queues the CPU kernel on the current stream, where it writes
// the preallocated results. The host never waits.
//
// The answers are kept by the operator and its arguments' metadata (the
// key), and the first call with a key runs synchronously: then the CPU
// kernel raises, at the call, every error it checks on the host, also those
// the Meta kernel does not check (gelu's approximate= string, convolution's
// bias dtype), and the answer is kept only if that call succeeded with the
// results' geometry Meta told. Later calls with the key pass the same
// checks, so they queue.
//
// Everything else takes the synchronous path below: operators with no Meta
// kernel or whose Meta kernel fails (the CPU kernel raises its own error, at
// the call), results whose size depends on the data (nonzero,
// masked_select, unique: Meta cannot tell), results that are not tensors
// (item, equal), written arguments whose geometry
// Meta changes (an out= to resize), and CPU tensors of more than 0
// dimensions. Structured operators (add, mm, ...) reach the fallback as
// their out= variant, with the result already allocated at its size.
//
// An error the CPU kernel raises on the worker (an index out of range, a
// singular matrix) is the stream's sticky error, raised by the next
// synchronization, as a device-side error is on CUDA.

bool is_tensor_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

bool is_tensor_list_type(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::ListType &&
      type->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
}

// Whether the schema allows the asynchronous path at all.
bool schema_may_run_async(const c10::FunctionSchema& schema) {
  for (const c10::Argument& ret : schema.returns()) {
    if (!is_tensor_type(ret.type()) && !is_tensor_list_type(ret.type())) return false;
  }
  return true;
}

// An argument of a queued kernel: a plain value, or device tensors held as
// TensorRefs (an index into the kernel's refs), or copies of CPU scalars.
struct QueuedArg {
  enum class Kind { kValue, kTensor, kTensorList, kOptionalTensorList, kGenerator } kind = Kind::kValue;
  c10::IValue value;              // kValue (a CPU 0-dim tensor is copied); kGenerator: the kernel's own
  std::vector<int> refs;          // per element: index into refs, or -1
  std::vector<at::Tensor> cpu;    // per element, where refs is -1: a CPU tensor (copied), undefined, or None
  std::vector<bool> none;         // kOptionalTensorList: which elements are None
};

struct QueuedOutput {
  size_t ret;                     // which return
  std::optional<size_t> element;  // which element of a list return
  int ref;                        // the preallocated result (fresh) or the aliased input (view)
  bool view;
};

// Process mode: a kernel of the executor's module (ExecutorKernels.cpp),
// installed next to this library; the module is loaded at first use.
orFunction_t executor_module_kernel(const char* name) {
  static const orModule_t module = [] {
    Dl_info info{};
    TORCH_CHECK(dladdr(reinterpret_cast<void*>(&executor_module_kernel), &info) != 0 && info.dli_fname != nullptr,
                "OpenReg: cannot locate libopenreg_torch to find ", payload::kModuleFile);
    std::string path = info.dli_fname;
    path = path.substr(0, path.rfind('/') + 1) + payload::kModuleFile;
    orModule_t loaded = nullptr;
    OPENREG_CHECK(orModuleLoad(&loaded, path.c_str()));
    return loaded;
  }();
  orFunction_t fn = nullptr;
  OPENREG_CHECK(orModuleGetFunction(&fn, module, name));
  return fn;
}

// The kernel that runs a described operator.
orFunction_t operator_kernel() {
  static const orFunction_t function = executor_module_kernel(payload::kKernelName);
  return function;
}

// Process mode: the queued operator's description for the executor
// (OperatorPayload.h), or nothing when it has something the format does
// not carry or exceeds a kernel's parameter block (it then runs as a host
// kernel, launch_kernel: still queued in stream order, over the runtime's
// staged copies of the device memory).
std::optional<std::vector<char>> encode_operator(const c10::FunctionSchema& schema,
                                                 const std::vector<TensorRef>& refs,
                                                 const std::vector<QueuedArg>& queued,
                                                 const std::vector<QueuedOutput>& outputs) {
  // Only PyTorch's own operators: the executor holds libtorch_cpu's kernels,
  // not those of Python or of extensions loaded here.
  if (schema.name().rfind("aten::", 0) != 0) return std::nullopt;
  payload::Writer w;
  w.put<uint32_t>(payload::kMagic);
  w.put(payload::Settings::capture());
  w.put_string(schema.name());
  w.put_string(schema.overload_name());
  w.put<uint32_t>(static_cast<uint32_t>(refs.size()));
  for (const TensorRef& ref : refs) {
    payload::TensorDesc d;
    d.identity = reinterpret_cast<uint64_t>(ref.storage_identity);
    d.data = reinterpret_cast<uint64_t>(ref.storage_data);
    d.nbytes = ref.storage_nbytes;
    d.offset = ref.storage_offset;
    d.scalar_type = static_cast<int32_t>(ref.dtype.toScalarType());
    d.conj = ref.conj;
    d.neg = ref.neg;
    d.sizes = ref.sizes;
    d.strides = ref.strides;
    w.put_tensor(d);
  }
  w.put<uint32_t>(static_cast<uint32_t>(queued.size()));
  for (const QueuedArg& q : queued) {
    switch (q.kind) {
      case QueuedArg::Kind::kValue:
        w.put(payload::ArgKind::kValue);
        if (!w.put_value(q.value)) return std::nullopt;
        continue;
      case QueuedArg::Kind::kGenerator: {
        w.put(payload::ArgKind::kGenerator);
        w.put<uint8_t>(!q.value.isNone());
        if (!q.value.isNone()) {
          const at::Tensor state = q.value.toGenerator().get_state();
          w.put_bytes(state.const_data_ptr(), state.nbytes());
        }
        continue;
      }
      case QueuedArg::Kind::kTensor:
        w.put(payload::ArgKind::kTensor);
        break;
      case QueuedArg::Kind::kTensorList:
        w.put(payload::ArgKind::kTensorList);
        break;
      case QueuedArg::Kind::kOptionalTensorList:
        w.put(payload::ArgKind::kOptionalTensorList);
        break;
    }
    w.put<uint32_t>(static_cast<uint32_t>(q.refs.size()));
    for (size_t k = 0; k < q.refs.size(); ++k) {
      if (q.refs[k] >= 0) {
        w.put(payload::ElementTag::kRef);
        w.put<int32_t>(q.refs[k]);
      } else if (q.cpu[k].defined()) {
        const at::Tensor& t = q.cpu[k];
        // (A uint64 value above int64's range has no Scalar the format carries.)
        if (t.scalar_type() == at::kUInt64) return std::nullopt;
        w.put(payload::ElementTag::kCpuScalar);
        w.put<int32_t>(static_cast<int32_t>(t.scalar_type()));
        w.put<uint8_t>(t.unsafeGetTensorImpl()->is_wrapped_number());
        if (!w.put_scalar(t.item())) return std::nullopt;
      } else if (q.kind == QueuedArg::Kind::kOptionalTensorList && q.none[k]) {
        w.put(payload::ElementTag::kNone);
      } else {
        w.put(payload::ElementTag::kUndefined);
      }
    }
  }
  w.put<uint32_t>(static_cast<uint32_t>(outputs.size()));
  for (const QueuedOutput& o : outputs) {
    w.put<uint32_t>(static_cast<uint32_t>(o.ret));
    w.put<int32_t>(o.element ? static_cast<int32_t>(*o.element) : -1);
    w.put<int32_t>(o.ref);
    w.put<uint8_t>(o.view);
  }
  if (w.bytes().size() > OR_MAX_KERNEL_PARAMS) return std::nullopt;
  return w.bytes();
}

// Whether the asynchronous path is on: unless OPENREG_ASYNC_OPERATORS=0 when
// the library loads, or set_async_operators(false).
// How many operators the asynchronous path queued (tests and benchmarks).
std::atomic<uint64_t> async_launches{0};

std::atomic<bool> async_operators_on{[] {
  const char* value = std::getenv("OPENREG_ASYNC_OPERATORS");
  return value == nullptr || std::string(value) != "0";
}()};

// What the Meta kernel said about one result (or a mutated argument).
struct Geometry {
  caffe2::TypeMeta dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  bool conj = false;
  bool neg = false;
  int view_of = -1;  // the ref whose storage it views, or -1 for a fresh tensor
  bool defined = true;
};

struct ReturnPlan {
  enum class Kind { kArgument, kTensor, kTensorList, kNone } kind = Kind::kNone;
  size_t argument = 0;              // kArgument: which (mutated) argument is returned
  std::vector<Geometry> tensors;    // kTensor: one; kTensorList: each element
};

// The Meta kernel's answer for one operator and its arguments' metadata:
// synchronous (it failed, or asked for something the asynchronous path does
// not do), or the plan of the results.
struct MetaAnswer {
  bool synchronous = false;
  std::vector<ReturnPlan> returns;
};

// An answer waiting for the first call with its key to run synchronously,
// and the geometry of the arguments it writes before that call.
struct PendingAnswer {
  std::vector<int64_t> key;
  std::shared_ptr<MetaAnswer> answer;
  std::vector<std::pair<size_t, Geometry>> written;
};

Geometry geometry_of_tensor(const at::Tensor& t) {
  Geometry g;
  g.dtype = t.dtype();
  g.sizes = t.sizes().vec();
  g.strides = t.strides().vec();
  g.storage_offset = t.storage_offset();
  g.conj = t.is_conj();
  g.neg = t.is_neg();
  return g;
}

bool same_geometry(const Geometry& g, const at::Tensor& t) {
  return g.dtype == t.dtype() && t.sizes().equals(g.sizes) && t.strides().equals(g.strides) &&
      g.storage_offset == t.storage_offset() && g.conj == t.is_conj() && g.neg == t.is_neg();
}

class DiscardWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

// A C++ Meta kernel costs a few microseconds, a registered (Python) one 10 us
// to 15 ms; programs repeat their shapes. The answers are kept, keyed by the
// operator and everything the Meta and CPU kernels' host-side checks can
// look at: each tensor's dtype, geometry, storage size, which arguments
// share a storage or are one tensor, CPU scalars' values, the other
// arguments' values, and whether deterministic algorithms are on.
struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ULL;
    return static_cast<size_t>(h);
  }
};

class MetaCache {
 public:
  std::shared_ptr<const MetaAnswer> find(const std::vector<int64_t>& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = answers_.find(key);
    return it == answers_.end() ? nullptr : it->second;
  }
  void insert(std::vector<int64_t> key, std::shared_ptr<const MetaAnswer> answer) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (answers_.size() >= kCapacity) answers_.clear();  // bounded; programs refill what they use
    answers_.emplace(std::move(key), std::move(answer));
  }

 private:
  static constexpr size_t kCapacity = 8192;
  std::mutex mutex_;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const MetaAnswer>, KeyHash> answers_;
};

MetaCache& meta_cache() {
  static MetaCache* cache = new MetaCache();  // never destroyed: kernels may run at exit
  return *cache;
}

int64_t bits_of(double value) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Appends a non-tensor argument's value to the key; false for values the
// asynchronous path does not take.
bool key_value(const c10::IValue& value, std::vector<int64_t>& key) {
  if (value.isNone()) {
    key.push_back(3);
  } else if (value.isBool()) {
    key.insert(key.end(), {6, value.toBool()});
  } else if (value.isInt()) {
    key.insert(key.end(), {4, value.toInt()});
  } else if (value.isDouble()) {
    key.insert(key.end(), {5, bits_of(value.toDouble())});
  } else if (value.isComplexDouble()) {
    const auto c = value.toComplexDouble();
    key.insert(key.end(), {12, bits_of(c.real()), bits_of(c.imag())});
  } else if (value.isString()) {
    key.insert(key.end(), {7, static_cast<int64_t>(std::hash<std::string>()(value.toStringRef()))});
  } else if (value.isIntList()) {
    const auto list = value.toIntList();
    key.insert(key.end(), {8, static_cast<int64_t>(list.size())});
    for (int64_t v : list) key.push_back(v);
  } else if (value.isDoubleList()) {
    const auto list = value.toDoubleList();
    key.insert(key.end(), {9, static_cast<int64_t>(list.size())});
    for (double v : list) key.push_back(bits_of(v));
  } else if (value.isBoolList()) {
    const auto list = value.toBoolList();
    key.insert(key.end(), {10, static_cast<int64_t>(list.size())});
    for (bool v : list) key.push_back(v);
  } else if (value.isDevice()) {
    key.insert(key.end(), {11, static_cast<int64_t>(value.toDevice().type()), value.toDevice().index()});
  } else {
    return false;
  }
  return true;
}

at::Tensor device_tensor_with(const c10::Storage& storage, const Geometry& g) {
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), g.dtype);
  view.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.storage_offset);
  view._set_conj(g.conj);
  view._set_neg(g.neg);
  return view;
}

// Host side of the asynchronous path: returns false (nothing done) when the
// operator must take the synchronous path. The queued kernel owns no device
// tensors (TensorRefs only); the CPU scalars it owns are plain C++ tensors,
// freed on the worker without Python or the device allocator.
bool try_launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                      PendingAnswer& pending) {
  const auto& schema = op.schema();
  if (!async_operators_on.load(std::memory_order_relaxed)) return false;
  if (!schema_may_run_async(schema) || !op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return false;
  }
  const size_t num_args = schema.arguments().size();
  auto args = torch::jit::last(*stack, num_args);

  // The kernel's arguments (device tensors as TensorRefs) and the cache key.
  std::vector<TensorRef> refs;
  std::vector<at::Tensor> ref_tensors;  // host side only: the tensor of each ref
  std::unordered_map<const c10::TensorImpl*, int> ref_of_tensor;
  std::unordered_map<const c10::StorageImpl*, int> group_of_storage;  // device storage -> its first ref
  // The global state a CPU kernel's checks read: deterministic algorithms
  // make some raise at the call.
  const auto& context = at::globalContext();
  std::vector<int64_t> key{reinterpret_cast<int64_t>(&schema),
                           static_cast<int64_t>(c10::hash<c10::OperatorName>()(schema.operator_name())),
                           context.deterministicAlgorithms() * 2 + context.deterministicAlgorithmsWarnOnly()};
  std::vector<QueuedArg> queued(num_args);
  bool supported = true;
  for (size_t i = 0; i < num_args && supported; ++i) {
    const c10::IValue& value = args[i];
    QueuedArg& q = queued[i];
    auto add_tensor = [&](const at::Tensor& t) {
      if (!t.defined()) {
        q.refs.push_back(-1);
        q.cpu.emplace_back();
        key.push_back(0);
        return;
      }
      if (on_openreg(t)) {
        auto known = ref_of_tensor.find(t.unsafeGetTensorImpl());
        int ref = -1;
        if (known == ref_of_tensor.end()) {
          ref = static_cast<int>(refs.size());
          refs.emplace_back(t);
          ref_tensors.push_back(t);
          ref_of_tensor.emplace(t.unsafeGetTensorImpl(), ref);
        } else {
          ref = known->second;
        }
        const int group = group_of_storage.emplace(t.storage().unsafeGetStorageImpl(), ref).first->second;
        q.refs.push_back(ref);
        q.cpu.emplace_back();
        // The key holds its whole layout (offset, sizes, strides): answers never meet across layouts.
        key.insert(key.end(), {1, ref, group, static_cast<int64_t>(t.storage().nbytes()),
                               static_cast<int64_t>(t.scalar_type()), t.dim(), t.storage_offset(),
                               t.is_conj(), t.is_neg()});
        key.insert(key.end(), t.sizes().begin(), t.sizes().end());
        key.insert(key.end(), t.strides().begin(), t.strides().end());
        return;
      }
      // A CPU scalar next to device tensors: copied now, since the caller may
      // change it before the kernel runs; its value is part of the key.
      if (!t.is_cpu() || t.dim() > 0 || t.layout() != c10::kStrided) {
        supported = false;
        return;
      }
      q.refs.push_back(-1);
      q.cpu.push_back(t.clone());
      int64_t raw[2] = {0, 0};
      std::memcpy(raw, q.cpu.back().const_data_ptr(), std::min<size_t>(sizeof raw, t.element_size()));
      key.insert(key.end(), {2, static_cast<int64_t>(t.scalar_type()), raw[0], raw[1],
                             t.unsafeGetTensorImpl()->is_wrapped_number()});
    };
    if (is_optional_generator(schema.arguments()[i])) {
      // Its kernel's generator is made at the launch below, once nothing
      // can send the call to the synchronous path any more (which draws
      // its own): each call draws once. Which generator does not matter to
      // the Meta kernel; one of another device type is for the synchronous
      // path to reject.
      if (!value.isNone() && !(value.isGenerator() &&
                               value.toGenerator().device().type() == c10::DeviceType::PrivateUse1)) {
        return false;
      }
      q.kind = QueuedArg::Kind::kGenerator;
      key.push_back(15);
    } else if (value.isTensor()) {
      q.kind = QueuedArg::Kind::kTensor;
      add_tensor(value.toTensor());
    } else if (value.isTensorList()) {
      q.kind = QueuedArg::Kind::kTensorList;
      key.insert(key.end(), {13, static_cast<int64_t>(value.toTensorList().size())});
      for (const at::Tensor& t : value.toTensorList()) add_tensor(t);
    } else if (value.isList() && schema.arguments()[i].type()->kind() == c10::TypeKind::ListType &&
               schema.arguments()[i].type()->castRaw<c10::ListType>()->getElementType()->kind() ==
                   c10::TypeKind::OptionalType) {
      // Tensor?[] (index): a list of optional tensors.
      q.kind = QueuedArg::Kind::kOptionalTensorList;
      key.insert(key.end(), {14, static_cast<int64_t>(value.toListRef().size())});
      for (const c10::IValue& v : value.toListRef()) {
        q.none.push_back(v.isNone());
        if (v.isNone()) {
          q.refs.push_back(-1);
          q.cpu.emplace_back();
          key.push_back(3);
        } else {
          add_tensor(v.toTensor());
        }
      }
    } else if (key_value(value, key)) {
      q.value = value;
      if (value.isDevice()) q.value = c10::IValue(c10::Device(c10::kCPU));
    } else {
      supported = false;
    }
  }
  if (!supported) return false;

  std::shared_ptr<const MetaAnswer> answer = meta_cache().find(key);
  if (!answer) {
    // Ask the Meta kernel, on meta counterparts of the device tensors: one
    // meta storage per device storage (of its size), so that views, offsets
    // and overlaps look to it as they are.
    std::unordered_map<const c10::StorageImpl*, c10::Storage> meta_of_storage;
    std::unordered_map<const c10::StorageImpl*, int> ref_of_meta_storage;
    auto meta_of = [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined() || !on_openreg(t)) return t;
      auto* device_storage = t.storage().unsafeGetStorageImpl();
      auto found = meta_of_storage.find(device_storage);
      if (found == meta_of_storage.end()) {
        c10::Storage meta(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                          c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta),
                          /*resizable=*/true);
        found = meta_of_storage.emplace(device_storage, std::move(meta)).first;
        ref_of_meta_storage.emplace(found->second.unsafeGetStorageImpl(), group_of_storage.at(device_storage));
      }
      at::Tensor m = at::empty({0}, t.options().device(c10::kMeta));
      m.unsafeGetTensorImpl()->set_storage_keep_dtype(found->second);
      m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
      m._set_conj(t.is_conj());
      m._set_neg(t.is_neg());
      return m;
    };
    torch::jit::Stack meta_stack;
    for (size_t i = 0; i < num_args; ++i) {
      const c10::IValue& value = args[i];
      if (queued[i].kind == QueuedArg::Kind::kGenerator) {
        meta_stack.push_back(c10::IValue());
      } else if (value.isTensor()) {
        meta_stack.push_back(meta_of(value.toTensor()));
      } else if (value.isTensorList()) {
        c10::List<at::Tensor> list;
        for (const at::Tensor& t : value.toTensorList()) list.push_back(meta_of(t));
        meta_stack.push_back(std::move(list));
      } else if (queued[i].kind == QueuedArg::Kind::kOptionalTensorList) {
        c10::List<std::optional<at::Tensor>> list;
        for (const c10::IValue& v : value.toListRef()) {
          if (v.isNone()) {
            list.push_back(std::nullopt);
          } else {
            list.push_back(meta_of(v.toTensor()));
          }
        }
        meta_stack.push_back(std::move(list));
      } else if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
        meta_stack.push_back(c10::Device(c10::kMeta));
      } else {
        meta_stack.push_back(value);
      }
    }
    std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
    auto computed = std::make_shared<MetaAnswer>();
    try {
      // PyTorch's C++ Meta kernel where libtorch has one (for structured
      // operators: the checks the CPU kernel runs first), else the
      // registered one (mostly Python: MetaKernels.h). Its warnings are
      // not the caller's: this call runs synchronously next, and the CPU
      // kernel gives its own.
      DiscardWarnings discard;
      const c10::WarningUtils::WarningHandlerGuard quiet(&discard);
      const c10::KernelFunction* cxx = cxx_meta_kernel(op.operator_name());
      if (cxx != nullptr) {
        cxx->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
      } else {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
      }
    } catch (const std::exception&) {
      computed->synchronous = true;  // the CPU kernel raises its own error, at the call
    }
    // Mutated arguments: any change of a written argument's geometry (an
    // out= the Meta kernel resized) takes the synchronous path, where the CPU
    // kernel decides: it keeps the strides of an out= of the right size, and
    // lays some results out its own way (geqrf: column-major).
    for (size_t i = 0; i < num_args && !computed->synchronous; ++i) {
      if (!writes(schema.arguments()[i]) || !args[i].isTensor() || !args[i].toTensor().defined()) continue;
      const at::Tensor& before = args[i].toTensor();
      const at::Tensor& after = meta_args[i].toTensor();
      computed->synchronous = !(after.sizes().equals(before.sizes()) && after.strides().equals(before.strides()) &&
                                after.storage_offset() == before.storage_offset() &&
                                after.is_conj() == before.is_conj() && after.is_neg() == before.is_neg());
    }
    // The results: mutated arguments themselves, views of input storages, or
    // fresh tensors.
    auto geometry_of = [&](const at::Tensor& m, Geometry& g) -> bool {
      if (!m.defined()) {
        g.defined = false;
        return true;
      }
      if (m.layout() != c10::kStrided) return false;
      g = geometry_of_tensor(m);
      auto aliased = ref_of_meta_storage.find(m.storage().unsafeGetStorageImpl());
      if (aliased != ref_of_meta_storage.end()) {
        g.view_of = aliased->second;
        return true;
      }
      return m.storage_offset() == 0 && !m.is_conj() && !m.is_neg() && m.is_non_overlapping_and_dense();
    };
    const auto& returns = schema.returns();
    for (size_t r = 0; r < returns.size() && !computed->synchronous; ++r) {
      ReturnPlan plan;
      if (const auto argument = returned_argument(schema, r)) {
        plan.kind = ReturnPlan::Kind::kArgument;
        plan.argument = *argument;
      } else {
        const c10::IValue& value = meta_stack[r];
        if (value.isTensor()) {
          plan.kind = ReturnPlan::Kind::kTensor;
          plan.tensors.emplace_back();
          computed->synchronous = !geometry_of(value.toTensor(), plan.tensors.back());
        } else if (value.isTensorList()) {
          plan.kind = ReturnPlan::Kind::kTensorList;
          for (const at::Tensor& m : value.toTensorList()) {
            plan.tensors.emplace_back();
            if (!geometry_of(m, plan.tensors.back())) computed->synchronous = true;
          }
        } else if (value.isNone()) {
          plan.kind = ReturnPlan::Kind::kNone;
        } else {
          computed->synchronous = true;
        }
      }
      computed->returns.push_back(std::move(plan));
    }
    if (computed->synchronous) {
      meta_cache().insert(std::move(key), computed);
    } else {
      // The first call with this key runs synchronously: its CPU kernel
      // raises, at the call, any error the Meta kernel does not check
      // (gelu's approximate= string, convolution's bias dtype), and the
      // answer is kept only once it ran (cpu_fallback, confirm_answer).
      pending.key = std::move(key);
      pending.answer = std::move(computed);
      for (size_t i = 0; i < num_args; ++i) {
        if (writes(schema.arguments()[i]) && args[i].isTensor() && args[i].toTensor().defined()) {
          pending.written.emplace_back(i, geometry_of_tensor(args[i].toTensor()));
        }
      }
    }
    return false;
  }
  if (answer->synchronous) return false;

  // The results, as the answer says.
  torch::jit::Stack outputs;
  std::vector<QueuedOutput> queued_outputs;
  const auto options = c10::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, device));
  auto make_result = [&](const Geometry& g, size_t r, std::optional<size_t> element) -> at::Tensor {
    if (!g.defined) return at::Tensor();
    if (g.view_of >= 0) {
      queued_outputs.push_back({r, element, g.view_of, true});
      return device_tensor_with(ref_tensors[g.view_of].storage(), g);
    }
    at::Tensor result = at::empty_strided(g.sizes, g.strides, options.dtype(g.dtype));
    const int ref = static_cast<int>(refs.size());
    refs.emplace_back(result);
    queued_outputs.push_back({r, element, ref, false});
    return result;
  };
  for (size_t r = 0; r < answer->returns.size(); ++r) {
    const ReturnPlan& plan = answer->returns[r];
    switch (plan.kind) {
      case ReturnPlan::Kind::kArgument:
        outputs.push_back(args[plan.argument]);
        break;
      case ReturnPlan::Kind::kTensor:
        outputs.push_back(make_result(plan.tensors[0], r, std::nullopt));
        break;
      case ReturnPlan::Kind::kTensorList: {
        c10::List<at::Tensor> list;
        for (size_t k = 0; k < plan.tensors.size(); ++k) list.push_back(make_result(plan.tensors[k], r, k));
        outputs.push_back(std::move(list));
        break;
      }
      case ReturnPlan::Kind::kNone:
        outputs.push_back(c10::IValue());
        break;
    }
  }

  // Worker side: aliases over the device memory, the CPU kernel, and its
  // fresh results copied into the preallocated ones.
  // Queued on the current stream of the device.
  const c10::Stream stream = current_stream(device);
  for (size_t i = 0; i < num_args; ++i) {
    if (queued[i].kind == QueuedArg::Kind::kGenerator) {
      queued[i].value = as_ivalue(kernel_generator_for(args[i], device).kernel);
    }
  }
  async_launches.fetch_add(1, std::memory_order_relaxed);
  // Process mode: the executor runs the operator, from its description.
  if (process_mode()) {
    if (auto described = encode_operator(schema, refs, queued, queued_outputs)) {
      OPENREG_CHECK(orLaunchModuleKernel(native_stream(stream), operator_kernel(), described->data(),
                                         described->size()));
      torch::jit::drop(*stack, num_args);
      for (auto& v : outputs) stack->push_back(std::move(v));
      return true;
    }
  }
  launch_kernel(stream, [handle = op, refs = std::move(refs), queued = std::move(queued),
                                         queued_outputs = std::move(queued_outputs)] {
    const auto& schema = handle.schema();
    AliasBuilder builder;
    std::vector<at::Tensor> aliases(refs.size());
    auto alias = [&](int ref) -> at::Tensor {
      if (!aliases[ref].defined()) aliases[ref] = builder.alias(refs[ref]);
      return aliases[ref];
    };
    auto element = [&](const QueuedArg& q, size_t k) -> at::Tensor {
      return q.refs[k] >= 0 ? alias(q.refs[k]) : q.cpu[k];
    };
    torch::jit::Stack cpu_stack;
    for (const QueuedArg& q : queued) {
      switch (q.kind) {
        case QueuedArg::Kind::kValue:
        case QueuedArg::Kind::kGenerator:
          cpu_stack.push_back(q.value);
          break;
        case QueuedArg::Kind::kTensor:
          cpu_stack.push_back(element(q, 0));
          break;
        case QueuedArg::Kind::kTensorList: {
          c10::List<at::Tensor> list;
          for (size_t k = 0; k < q.refs.size(); ++k) list.push_back(element(q, k));
          cpu_stack.push_back(std::move(list));
          break;
        }
        case QueuedArg::Kind::kOptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          for (size_t k = 0; k < q.refs.size(); ++k) {
            if (q.none[k]) {
              list.push_back(std::nullopt);
            } else {
              list.push_back(element(q, k));
            }
          }
          cpu_stack.push_back(std::move(list));
          break;
        }
      }
    }
    handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cpu_stack);
    for (const QueuedOutput& out : queued_outputs) {
      const c10::IValue& value = cpu_stack[out.ret];
      const at::Tensor produced = out.element ? value.toTensorList().get(*out.element) : value.toTensor();
      cpu_alias::finish_output(schema.name(), produced, alias(out.ref), out.view);
    }
  }, /*wait=*/false);

  torch::jit::drop(*stack, num_args);
  for (auto& v : outputs) stack->push_back(std::move(v));
  return true;
}

// Keeps the Meta kernel's answer once the first call with its key ran
// synchronously without error. Its fresh results must have the geometry
// the CPU kernel gave them, and the arguments it writes must have kept
// theirs, as Meta said; where not (a Meta kernel that lays a result out
// otherwise; linalg_lu_solve's out= kernel, which flips its out='s conjugate
// bit), the key stays synchronous, so that results are the CPU's.
void confirm_answer(PendingAnswer pending, c10::ArrayRef<c10::IValue> args, const torch::jit::Stack& outputs) {
  auto matches = [](const Geometry& g, const at::Tensor& t) {
    if (!g.defined || !t.defined()) return g.defined == t.defined();
    if (g.view_of >= 0) return true;  // checked on the worker at each asynchronous call
    return g.dtype == t.dtype() && t.sizes().equals(g.sizes) && t.strides().equals(g.strides);
  };
  bool same = outputs.size() == pending.answer->returns.size();
  for (const auto& [i, before] : pending.written) {
    same = same && same_geometry(before, args[i].toTensor());
  }
  for (size_t r = 0; r < outputs.size() && same; ++r) {
    const ReturnPlan& plan = pending.answer->returns[r];
    if (plan.kind == ReturnPlan::Kind::kTensor) {
      same = outputs[r].isTensor() && matches(plan.tensors[0], outputs[r].toTensor());
    } else if (plan.kind == ReturnPlan::Kind::kTensorList) {
      same = outputs[r].isTensorList() && outputs[r].toTensorList().size() == plan.tensors.size();
      for (size_t k = 0; k < plan.tensors.size() && same; ++k) {
        same = matches(plan.tensors[k], outputs[r].toTensorList().get(k));
      }
    }
  }
  if (!same) {
    pending.answer->synchronous = true;
    pending.answer->returns.clear();
  }
  meta_cache().insert(std::move(pending.key), std::move(pending.answer));
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  auto args = torch::jit::last(*stack, num_args);
  const c10::DeviceIndex device = find_device(schema, args);
  TORCH_CHECK(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU),
              "OpenReg: operator ", schema.name(), " is not supported on openreg:",
              static_cast<int>(device), ": it has neither an OpenReg kernel nor "
              "a CPU kernel to fall back on");
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  PendingAnswer pending;
  if (try_launch_async(op, stack, device, pending)) return;

  // The random kernel's generators, made once here, on the host, in launch
  // order; each run of the kernel (a second one after an out= grew) starts
  // from a copy of their state. A call that raises gives the words back:
  // bad input changes no generator's state.
  std::vector<KernelGenerator> generators(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    if (is_optional_generator(schema.arguments()[i])) {
      generators[i] = kernel_generator_for(args[i], device);
    }
  }
  bool raised = true;
  const auto give_back = c10::make_scope_exit([&] {
    if (!raised) return;
    for (auto it = generators.rbegin(); it != generators.rend(); ++it) {
      if (it->undo) it->undo();
    }
  });

  AliasBuilder builder;
  std::vector<c10::IValue> cpu_args;
  torch::jit::Stack results;
  // out= arguments the CPU kernel writes into fresh host tensors, copied to
  // the device afterwards: those that must grow when Meta cannot tell how
  // much (masked_select: the size depends on the data).
  std::vector<bool> host_out(num_args, false);
  auto run = [&] {
    launch_kernel(current_stream(device), [&] {
      for (size_t i = 0; i < num_args; ++i) {
        cpu_args.push_back(host_out[i]
            ? c10::IValue(at::empty({0}, args[i].toTensor().options().device(c10::kCPU)))
            : is_optional_generator(schema.arguments()[i])
            ? (generators[i].kernel.defined() ? c10::IValue(generators[i].kernel.clone()) : c10::IValue())
            : to_cpu(args[i], schema.arguments()[i], builder));
      }
      results = cpu_args;
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &results);
    }, /*wait=*/true);
  };
  try {
    run();
  } catch (const c10::Error& e) {
    // An out= tensor that must grow: alias storages cannot, so grow it on the
    // device (Meta tells the size) and run again. Only then, because Meta
    // kernels can be Python and slow to import. (The message without the
    // backtrace: what() symbolizes the C++ stack, about 10 ms, for an error
    // that composite operators such as abs reach on every call.)
    if (std::string(e.what_without_backtrace()).find("not resizable") == std::string::npos) throw;
    if (!grow_out_arguments(op, args)) {
      bool any = false;
      for (size_t i = 0; i < num_args; ++i) {
        const c10::Argument& argument = schema.arguments()[i];
        if (writes(argument) && argument.kwarg_only() && args[i].isTensor() && on_openreg(args[i].toTensor())) {
          host_out[i] = any = true;
        }
      }
      if (!any) throw;
    }
    builder = AliasBuilder();
    cpu_args.clear();
    results.clear();
    run();
  }
  raised = false;  // the kernel ran: its numbers are drawn
  for (size_t i = 0; i < num_args; ++i) {
    if (!host_out[i]) continue;
    const at::Tensor& device_tensor = args[i].toTensor();
    const at::Tensor& host = cpu_args[i].toTensor();
    // The out= tensor gets the CPU kernel's geometry, strides included, as
    // a CPU out= tensor gets it: kernels lay results out as they need
    // (geqrf makes an empty out= column-major). Only its sizes are a
    // contract (test_out compares no strides of a resized out=), but a
    // device that matches the CPU here surprises nobody.
    const size_t needed = at::detail::computeStorageNbytes(
        host.sizes(), host.strides(), host.dtype().itemsize(), device_tensor.storage_offset());
    auto* storage = device_tensor.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (needed > storage->nbytes()) resize_storage_bytes(storage, needed);
    device_tensor.unsafeGetTensorImpl()->set_sizes_and_strides(
        host.sizes(), host.strides(), device_tensor.storage_offset());
    device_tensor.copy_(host);
  }

  // Kernels may reshape mutable arguments (e.g. resize an out= tensor) ...
  for (size_t i = 0; i < num_args; ++i) {
    if (!writes(schema.arguments()[i]) || !args[i].isTensor() || host_out[i]) continue;
    const at::Tensor& device_tensor = args[i].toTensor();
    const at::Tensor& alias = cpu_args[i].toTensor();
    if (!on_openreg(device_tensor)) continue;
    TORCH_CHECK(builder.device_storage_of(alias.storage().unsafeGetStorageImpl()),
                "OpenReg: ", schema.name(), " replaced the storage of argument '",
                schema.arguments()[i].name(), "', which the CPU fallback cannot mirror");
    if (!alias.sizes().equals(device_tensor.sizes()) ||
        !alias.strides().equals(device_tensor.strides()) ||
        alias.storage_offset() != device_tensor.storage_offset()) {
      device_tensor.unsafeGetTensorImpl()->set_sizes_and_strides(
          alias.sizes(), alias.strides(), alias.storage_offset());
    }
    // ... or flip its conjugation or negation bit (linalg_lu_solve's out=
    // kernel, with left=False, returns X^H as a conjugate view of what it
    // wrote).
    if (alias.is_conj() != device_tensor.is_conj()) {
      device_tensor._set_conj(alias.is_conj());
    }
    if (alias.is_neg() != device_tensor.is_neg()) device_tensor._set_neg(alias.is_neg());
  }

  torch::jit::Stack outputs;
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    c10::IValue& value = results[r];
    if (const auto argument = returned_argument(schema, r)) {
      outputs.push_back(args[*argument]);  // the same TensorImpl as the caller's
      continue;
    }
    if (value.isTensor()) {
      outputs.push_back(to_device(value.toTensor(), builder, device, schema));
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : value.toTensorList()) list.push_back(to_device(t, builder, device, schema));
      outputs.push_back(std::move(list));
    } else {
      outputs.push_back(std::move(value));
    }
  }
  if (pending.answer) confirm_answer(std::move(pending), args, outputs);
  torch::jit::drop(*stack, num_args);
  for (auto& v : outputs) stack->push_back(std::move(v));
}

}  // namespace

std::vector<std::pair<std::string, int>> executor_settings(c10::DeviceIndex device) {
  static const orFunction_t report = executor_module_kernel(payload::kReportSettingsName);
  const c10::Stream stream = current_stream(device);
  const at::Tensor buffer = at::empty({static_cast<int64_t>(sizeof(payload::Settings))},
                                      at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::DeviceType::PrivateUse1, device)));
  const uint64_t address = reinterpret_cast<uint64_t>(buffer.data_ptr());
  OPENREG_CHECK(orLaunchModuleKernel(native_stream(stream), report, &address, sizeof(address)));
  payload::Settings settings;
  OPENREG_CHECK(orMemcpySync(&settings, buffer.data_ptr(), sizeof(settings), orMemcpyDeviceToHost,
                             native_stream(stream)));
  return settings.fields();
}

std::vector<std::pair<std::string, int>> host_settings() { return payload::Settings::capture().fields(); }

void launch_copy_in_executor(const c10::Stream& stream, const at::Tensor& src, const at::Tensor& dst) {
  TORCH_INTERNAL_ASSERT(process_mode());
  static const c10::OperatorHandle copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  std::vector<TensorRef> refs{TensorRef(dst), TensorRef(src)};
  std::vector<QueuedArg> queued(3);
  for (int i = 0; i < 2; ++i) {
    queued[i].kind = QueuedArg::Kind::kTensor;
    queued[i].refs.push_back(i);
    queued[i].cpu.emplace_back();
  }
  queued[2].value = c10::IValue(false);  // non_blocking
  const auto described = encode_operator(copy.schema(), refs, queued, {});
  TORCH_INTERNAL_ASSERT(described.has_value());
  OPENREG_CHECK(orLaunchModuleKernel(native_stream(stream), operator_kernel(), described->data(),
                                     described->size()));
}

bool async_operators() {
  return async_operators_on.load();
}

void set_async_operators(bool on) {
  async_operators_on.store(on);
}

uint64_t async_operator_launches() {
  return async_launches.load();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// Operators whose composite kernels would win over the fallback for
// PrivateUse1 but do not work (or work badly) there: route them to the
// fallback explicitly, so that PyTorch's CPU kernels run on the aliases.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const auto fallback = [] {
    return torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>();
  };
  // convolution selects ConvBackend::Overrideable for PrivateUse1, whose
  // kernels (convolution_overrideable and its backward) only raise
  // NotImplementedError.
  m.impl("convolution", fallback());
  m.impl("convolution_backward", fallback());
  // Structured losses: the generic functional kernel resizes a 0-dim output
  // through the out= kernel, which warns about resizing a non-empty output.
  m.impl("mse_loss", fallback());
  m.impl("smooth_l1_loss", fallback());
  // Composite kernels that reach a DispatchStub or a device check with no
  // PrivateUse1 entry (conj_physical_, mode), fail on empty inputs (linalg_qr
  // asserts on a (5, 0) input), resize outputs the fallback hands them
  // (linalg_lstsq), or compute in the input's precision where the CPU
  // kernel does not (native_layer_norm's statistics of an empty float16
  // input): the operators area found each (docs/operators.md).
  m.impl("conj_physical_", fallback());
  m.impl("mode.values", fallback());
  m.impl("linalg_qr", fallback());
  m.impl("linalg_lstsq", fallback());
  m.impl("native_layer_norm", fallback());
  // native_group_norm's composite kernel views its input, which raises for
  // a column-major one in torch 2.14 (the CPU kernel takes any layout).
  m.impl("native_group_norm", fallback());
  // In place on the CPU alias of the device memory, rather than the
  // composite's out-of-place computation and copy back.
  m.impl("addcmul_", fallback());
}

// Autocast for OpenReg runs PyTorch's generic policy; operators without a
// policy fall through.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace openreg
