// The compact description of one queued operator, as the driver sends it to
// a device's executor in process mode (OPENREG_EXECUTOR=process): the
// operator's name, each device tensor's metadata (which allocation, size in
// bytes, sizes, strides, offset, dtype, conjugation and negation bits), the
// other arguments' values, the state of a random kernel's generator, and
// which results go where. Both sides include this header: the driver
// (Fallback.cpp) encodes, the executor's operator kernel
// (ExecutorKernels.cpp, a module loaded into the executor) decodes.
//
// The format is a plain byte sequence written and read in one order (both
// processes run on one machine, so native byte order and widths). A reader
// that runs past the end throws: a malformed payload is an error, never a
// read outside the block.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace openreg::payload {

constexpr uint32_t kMagic = 0x4f505231;  // "OPR1"

// The kernel the executor runs (an exported orModuleKernelFn).
constexpr const char* kKernelName = "openreg_run_operator";
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
