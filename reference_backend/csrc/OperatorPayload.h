// The compact description of one queued operator, as the driver sends it to
// a device's executor in process mode (OPENREG_EXECUTOR=process): the
// operator's name, each device tensor's metadata (which allocation, size in
// bytes, sizes, strides, offset, dtype, conjugation and negation bits), the
// other arguments' values, the state of a random kernel's generator, and
// which results go where. Both sides include this header: the driver
// (Fallback.cpp) encodes, the executor's operator kernel
// (ExecutorKernels.cpp, a module loaded into the executor) decodes.
//
// The description starts with PyTorch's process-wide settings (Settings).
// The format is a plain byte sequence written and read in one order (both
// processes run on one machine, so native byte order and widths). A reader
// that runs past the end throws: a malformed payload is an error, never a
// read outside the block.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace openreg::payload {

constexpr uint32_t kMagic = 0x4f505232;  // "OPR2"

// The kernel the executor runs (an exported orModuleKernelFn).
constexpr const char* kKernelName = "openreg_run_operator";
// Tests: writes the executor's Settings (below) to the device address in
// its parameters.
constexpr const char* kReportSettingsName = "openreg_report_settings";
// The module that holds it, installed next to libopenreg_torch.
constexpr const char* kModuleFile = "libopenreg_torch_kernels.so";

// One device tensor of the operator (an argument or a preallocated result).
struct TensorDesc {
  uint64_t identity = 0;  // the device storage, as an identity (storages without memory)
  uint64_t data = 0;      // device address of the storage (0 if it has no memory)
  uint64_t nbytes = 0;
  int64_t offset = 0;
  int32_t scalar_type = 0;
  bool conj = false;
  bool neg = false;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

// An element of a tensor argument.
enum class ElementTag : uint8_t { kUndefined = 0, kRef = 1, kCpuScalar = 2, kNone = 3 };

enum class ArgKind : uint8_t { kValue = 0, kTensor = 1, kTensorList = 2, kOptionalTensorList = 3, kGenerator = 4 };

// Tags of plain values: those the asynchronous path takes (Fallback.cpp's key_value).
enum class ValueTag : uint8_t {
  kNone = 0, kBool = 1, kInt = 2, kDouble = 3, kComplex = 4, kString = 5,
  kIntList = 6, kDoubleList = 7, kBoolList = 8, kCpuDevice = 9,
};

// PyTorch's process-wide settings that CPU kernels read (at::globalContext()):
// in thread mode the stream workers share the host's, so every description
// carries the host's values at the launch, and the executor takes them
// before it runs the operator. The intra-op thread count is not among them:
// OpenMP keeps it per thread, and thread mode's workers do not take the
// host's either.
struct Settings {
  uint8_t deterministic = 0;             // torch.use_deterministic_algorithms
  uint8_t deterministic_warn_only = 0;
  uint8_t deterministic_fill = 0;        // torch.utils.deterministic.fill_uninitialized_memory
  uint8_t mkldnn = 0;                    // torch.backends.mkldnn.enabled
  uint8_t deterministic_mkldnn = 0;      // torch.backends.mkldnn.deterministic
  uint8_t nnpack = 0;                    // torch.backends.nnpack.enabled
  uint8_t fp16_reduction_cpu = 0;        // torch.backends.cpu fp16 reductions
  uint8_t flash_sdp = 0;                 // torch.backends.cuda.enable_flash_sdp (the CPU's flash kernel too)
  uint8_t math_sdp = 0;                  // torch.backends.cuda.enable_math_sdp
  uint8_t reduced_math_sdp = 0;          // allow_fp16_bf16_reduction_math_sdp
  int8_t matmul_precision = 0;           // torch.set_float32_matmul_precision
  int8_t fp32_precision[5] = {};         // fp32_precision of kPrecisionKeys

  static constexpr std::pair<at::Float32Backend, at::Float32Op> kPrecisionKeys[5] = {
      {at::Float32Backend::GENERIC, at::Float32Op::ALL},
      {at::Float32Backend::MKLDNN, at::Float32Op::ALL},
      {at::Float32Backend::MKLDNN, at::Float32Op::CONV},
      {at::Float32Backend::MKLDNN, at::Float32Op::RNN},
      {at::Float32Backend::MKLDNN, at::Float32Op::MATMUL},
  };

  // This process's settings.
  static Settings capture() {
    const at::Context& c = at::globalContext();
    Settings s;
    s.deterministic = c.deterministicAlgorithms();
    s.deterministic_warn_only = c.deterministicAlgorithmsWarnOnly();
    s.deterministic_fill = c.deterministicFillUninitializedMemory();
    s.mkldnn = c.userEnabledMkldnn();
    s.deterministic_mkldnn = c.deterministicMkldnn();
    s.nnpack = c.userEnabledNNPACK();
    s.fp16_reduction_cpu = c.allowFP16ReductionCPU();
    s.flash_sdp = c.userEnabledFlashSDP();
    s.math_sdp = c.userEnabledMathSDP();
    s.reduced_math_sdp = c.allowFP16BF16ReductionMathSDP();
    s.matmul_precision = static_cast<int8_t>(c.float32MatmulPrecision());
    for (int i = 0; i < 5; ++i) {
      s.fp32_precision[i] = static_cast<int8_t>(c.float32Precision(kPrecisionKeys[i].first, kPrecisionKeys[i].second));
    }
    return s;
  }

  // Makes them this process's (only what differs is set: the executor's
  // kernels read them concurrently, and most operators change nothing).
  void apply() const {
    at::Context& c = at::globalContext();
    if (c.deterministicAlgorithms() != bool(deterministic) ||
        c.deterministicAlgorithmsWarnOnly() != bool(deterministic_warn_only)) {
      c.setDeterministicAlgorithms(deterministic, deterministic_warn_only);
    }
    if (c.deterministicFillUninitializedMemory() != bool(deterministic_fill)) {
      c.setDeterministicFillUninitializedMemory(deterministic_fill);
    }
    if (c.userEnabledMkldnn() != bool(mkldnn)) c.setUserEnabledMkldnn(mkldnn);
    if (c.deterministicMkldnn() != bool(deterministic_mkldnn)) c.setDeterministicMkldnn(deterministic_mkldnn);
    if (c.userEnabledNNPACK() != bool(nnpack)) c.setUserEnabledNNPACK(nnpack);
    if (c.allowFP16ReductionCPU() != bool(fp16_reduction_cpu)) c.setAllowFP16ReductionCPU(fp16_reduction_cpu);
    if (c.userEnabledFlashSDP() != bool(flash_sdp)) c.setSDPUseFlash(flash_sdp);
    if (c.userEnabledMathSDP() != bool(math_sdp)) c.setSDPUseMath(math_sdp);
    if (c.allowFP16BF16ReductionMathSDP() != bool(reduced_math_sdp)) {
      c.setAllowFP16BF16ReductionMathSDP(reduced_math_sdp);
    }
    if (static_cast<int8_t>(c.float32MatmulPrecision()) != matmul_precision) {
      static const char* const kNames[] = {"highest", "high", "medium"};
      TORCH_CHECK(matmul_precision >= 0 && matmul_precision < 3,
                  "OpenReg: malformed operator payload (matmul precision)");
      c.setFloat32MatmulPrecision(kNames[matmul_precision]);
    }
    // After the matmul precision, which sets some of these too.
    for (int i = 0; i < 5; ++i) {
      const auto [backend, op] = kPrecisionKeys[i];
      const auto wanted = static_cast<at::Float32Precision>(fp32_precision[i]);
      if (c.float32Precision(backend, op) != wanted) c.setFloat32Precision(backend, op, wanted);
    }
  }

  // Name and value of each field (tests compare the two processes').
  std::vector<std::pair<std::string, int>> fields() const {
    std::vector<std::pair<std::string, int>> f = {
        {"deterministic", deterministic}, {"deterministic_warn_only", deterministic_warn_only},
        {"deterministic_fill", deterministic_fill}, {"mkldnn", mkldnn},
        {"deterministic_mkldnn", deterministic_mkldnn}, {"nnpack", nnpack},
        {"fp16_reduction_cpu", fp16_reduction_cpu}, {"flash_sdp", flash_sdp}, {"math_sdp", math_sdp},
        {"reduced_math_sdp", reduced_math_sdp}, {"matmul_precision", matmul_precision},
    };
    for (int i = 0; i < 5; ++i) {
      f.emplace_back("fp32_precision_" + std::to_string(i), fp32_precision[i]);
    }
    return f;
  }
};
static_assert(std::is_trivially_copyable_v<Settings>);

class Writer {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, size_t n) {
    put<uint64_t>(n);
    const auto* p = static_cast<const char*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  void put_string(const std::string& s) { put_bytes(s.data(), s.size()); }
  void put_ints(c10::IntArrayRef v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int64_t x : v) put<int64_t>(x);
  }
  void put_tensor(const TensorDesc& t) {
    put(t.identity);
    put(t.data);
    put(t.nbytes);
    put(t.offset);
    put(t.scalar_type);
    put<uint8_t>(t.conj);
    put<uint8_t>(t.neg);
    put_ints(t.sizes);
    put_ints(t.strides);
  }
  // False for a value this format does not carry.
  bool put_value(const c10::IValue& v) {
    if (v.isNone()) {
      put(ValueTag::kNone);
    } else if (v.isBool()) {
      put(ValueTag::kBool);
      put<uint8_t>(v.toBool());
    } else if (v.isInt()) {
      put(ValueTag::kInt);
      put<int64_t>(v.toInt());
    } else if (v.isDouble()) {
      put(ValueTag::kDouble);
      put<double>(v.toDouble());
    } else if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      put(ValueTag::kComplex);
      put<double>(c.real());
      put<double>(c.imag());
    } else if (v.isString()) {
      put(ValueTag::kString);
      put_string(v.toStringRef());
    } else if (v.isIntList()) {
      put(ValueTag::kIntList);
      put_ints(v.toIntVector());
    } else if (v.isDoubleList()) {
      put(ValueTag::kDoubleList);
      const auto list = v.toDoubleVector();
      put<uint32_t>(static_cast<uint32_t>(list.size()));
      for (double x : list) put<double>(x);
    } else if (v.isBoolList()) {
      put(ValueTag::kBoolList);
      const auto list = v.toBoolList();
      put<uint32_t>(static_cast<uint32_t>(list.size()));
      for (bool x : list) put<uint8_t>(x);
    } else if (v.isDevice() && v.toDevice().is_cpu()) {
      put(ValueTag::kCpuDevice);
    } else {
      return false;
    }
    return true;
  }
  // A scalar's value (a CPU 0-dim tensor's item()).
  bool put_scalar(const c10::Scalar& s) {
    if (s.isBoolean()) return put_value(c10::IValue(s.toBool()));
    if (s.isIntegral(/*includeBool=*/false)) return put_value(c10::IValue(s.toLong()));
    if (s.isFloatingPoint()) return put_value(c10::IValue(s.toDouble()));
    if (s.isComplex()) return put_value(c10::IValue(s.toComplexDouble()));
    return false;
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  Reader(const void* data, size_t size) : p_(static_cast<const char*>(data)), end_(p_ + size) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, p_, sizeof(T));
    p_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto n = get<uint64_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<int64_t> get_ints() {
    const auto n = get<uint32_t>();
    need(static_cast<size_t>(n) * sizeof(int64_t));
    std::vector<int64_t> v(n);
    for (auto& x : v) x = get<int64_t>();
    return v;
  }
  TensorDesc get_tensor() {
    TensorDesc t;
    t.identity = get<uint64_t>();
    t.data = get<uint64_t>();
    t.nbytes = get<uint64_t>();
    t.offset = get<int64_t>();
    t.scalar_type = get<int32_t>();
    t.conj = get<uint8_t>() != 0;
    t.neg = get<uint8_t>() != 0;
    t.sizes = get_ints();
    t.strides = get_ints();
    TORCH_CHECK(t.sizes.size() == t.strides.size(), "OpenReg: malformed operator payload (sizes and strides)");
    return t;
  }
  c10::IValue get_value() {
    switch (get<ValueTag>()) {
      case ValueTag::kNone: return c10::IValue();
      case ValueTag::kBool: return c10::IValue(get<uint8_t>() != 0);
      case ValueTag::kInt: return c10::IValue(get<int64_t>());
      case ValueTag::kDouble: return c10::IValue(get<double>());
      case ValueTag::kComplex: {
        const double re = get<double>();
        const double im = get<double>();
        return c10::IValue(c10::complex<double>(re, im));
      }
      case ValueTag::kString: return c10::IValue(get_string());
      case ValueTag::kIntList: {
        const std::vector<int64_t> ints = get_ints();
        return c10::IValue(c10::List<int64_t>(c10::ArrayRef<int64_t>(ints)));
      }
      case ValueTag::kDoubleList: {
        c10::List<double> list;
        const auto n = get<uint32_t>();
        for (uint32_t i = 0; i < n; ++i) list.push_back(get<double>());
        return c10::IValue(std::move(list));
      }
      case ValueTag::kBoolList: {
        c10::List<bool> list;
        const auto n = get<uint32_t>();
        for (uint32_t i = 0; i < n; ++i) list.push_back(get<uint8_t>() != 0);
        return c10::IValue(std::move(list));
      }
      case ValueTag::kCpuDevice: return c10::IValue(c10::Device(c10::kCPU));
    }
    TORCH_CHECK(false, "OpenReg: malformed operator payload (unknown value tag)");
  }
  const char* take(size_t n) {
    need(n);
    const char* at = p_;
    p_ += n;
    return at;
  }
  bool done() const { return p_ == end_; }

 private:
  void need(size_t n) const {
    TORCH_CHECK(static_cast<size_t>(end_ - p_) >= n, "OpenReg: malformed operator payload (truncated)");
  }
  const char* p_;
  const char* end_;
};

}  // namespace openreg::payload
