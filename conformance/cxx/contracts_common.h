// Shared helpers of the C++ contract tests (GoogleTest cases compiled into
// privateuse1_conformance.conformance._cxx and run one at a time by
// conformance/test_cxx_contracts.py).
//
// Naming rule: the test suite name of every case is its contract ID with '-'
// replaced by '_' (TEST_F(GD_DEV_001, ...) checks GD-DEV-001). The pytest
// side derives the contract from the name, so a suite name that is not a
// registry ID fails collection.
//
// The backend is reached only through PyTorch's registries:
// c10::impl::getDeviceGuardImpl(PrivateUse1), the guard classes built on it,
// and at::detail::getPrivateUse1Hooks(). Nothing here knows a particular
// backend.
#pragma once

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace pu1c {

constexpr auto kType = c10::DeviceType::PrivateUse1;

inline const c10::impl::DeviceGuardImplInterface& impl() {
  // Throws c10::Error ("PyTorch is not linked with support for ...") when the
  // backend registered no guard: the case then fails with that message.
  return *c10::impl::getDeviceGuardImpl(kType);
}

// The backend's device type name as PyTorch prints it (e.g. "openreg").
inline std::string type_name() { return c10::DeviceTypeName(kType, /*lower_case=*/true); }

inline c10::Device dev(int index) {
  return c10::Device(kType, static_cast<c10::DeviceIndex>(index));
}

inline int count() { return static_cast<int>(impl().deviceCount()); }

// The devices the cases loop over and whose streams they track: every device
// up to 4, else the first three and the last (cases single the last device
// out, so it must always be tracked). Keeps cases fast with many devices.
inline std::vector<int> devices_used() {
  const int n = count();
  std::vector<int> used;
  for (int i = 0; i < std::min(n, 3); ++i) used.push_back(i);
  if (n > 3) used.push_back(n - 1);
  return used;
}

inline std::string str(const c10::Device& d) { return d.str(); }

inline std::string str(const c10::Stream& s) {
  std::ostringstream out;
  out << "stream " << s.id() << " of " << s.device();
  return out.str();
}

inline std::string str(const std::optional<c10::Device>& d) {
  return d ? d->str() : std::string("nullopt");
}

// The message of an exception without the C++ backtrace PyTorch appends.
inline std::string message_of(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

inline std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// The current device as the guard implementation reports it, which must be a
// device of the backend's type. (Whether the hooks agree is HK-DEV-001's
// business, checked in Python; a guard case never charges the hooks.)
inline ::testing::AssertionResult CurrentIs(int expected) {
  c10::Device current = impl().getDevice();
  if (current.type() != kType) {
    return ::testing::AssertionFailure()
           << "the guard implementation's getDevice() returned " << current
           << ", a device of another type (it must return a " << type_name() << " device)";
  }
  if (current.index() != expected) {
    return ::testing::AssertionFailure()
           << "the current device is " << current << " (guard getDevice()), expected "
           << dev(expected);
  }
  return ::testing::AssertionSuccess();
}

// Whether the current stream of device `index` is `expected`.
inline ::testing::AssertionResult StreamIs(int index, const c10::Stream& expected) {
  const c10::Stream current = impl().getStream(dev(index));
  if (current != expected) {
    return ::testing::AssertionFailure()
           << "the current stream of " << dev(index) << " is " << str(current) << ", expected "
           << str(expected);
  }
  return ::testing::AssertionSuccess();
}

// A stream of device `index` that is not its current stream (torch.Stream's
// way first: getNewStream, then the pool). Throws with an explanation if the
// backend cannot give one, so that stream cases fail with a clear reason.
inline c10::Stream other_stream(int index, std::optional<c10::Stream> avoid = std::nullopt) {
  const c10::Stream current = impl().getStream(dev(index));
  std::string why;
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::optional<c10::Stream> candidate;
    try {
      candidate = impl().getNewStream(dev(index), 0);
    } catch (const std::exception& e) {
      why = "getNewStream: " + message_of(e);
      try {
        candidate = impl().getStreamFromGlobalPool(dev(index), false);
      } catch (const std::exception& e2) {
        why += "; getStreamFromGlobalPool: " + message_of(e2);
      }
    }
    if (!candidate) break;
    if (candidate->device() != dev(index)) {
      throw std::runtime_error("asked for a new stream of " + str(dev(index)) + ", the backend returned " +
                               str(*candidate));
    }
    if (*candidate != current && (!avoid || *candidate != *avoid)) return *candidate;
    why = "getNewStream/getStreamFromGlobalPool keep returning the current stream " + str(current);
  }
  throw std::runtime_error("cannot obtain a stream of " + str(dev(index)) +
                           " other than its current stream, which the guard checks need (" + why + ")");
}

// The current stream of each device used, by device index.
class StreamSnapshot {
 public:
  void add(int device, const c10::Stream& stream) { streams_.emplace_back(device, stream); }
  const c10::Stream& operator[](int device) const {
    for (const auto& [index, stream] : streams_) {
      if (index == device) return stream;
    }
    throw std::logic_error("suite bug: the stream of device " + std::to_string(device) +
                           " was not recorded (devices_used() does not include it)");
  }
  auto begin() const { return streams_.begin(); }
  auto end() const { return streams_.end(); }

 private:
  std::vector<std::pair<int, c10::Stream>> streams_;
};

inline StreamSnapshot current_streams() {
  StreamSnapshot streams;
  for (int i : devices_used()) streams.add(i, impl().getStream(dev(i)));
  return streams;
}

// Whether every device's current stream is still what `expected` recorded.
inline ::testing::AssertionResult StreamsAre(const StreamSnapshot& expected) {
  for (const auto& [device, stream] : expected) {
    auto result = StreamIs(device, stream);
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

// Makes a non-default stream current on every device used and returns the
// current streams, so that "restored" cannot be confused with "reset to the
// default stream".
inline StreamSnapshot make_non_default_streams_current() {
  for (int i : devices_used()) impl().exchangeStream(other_stream(i));
  return current_streams();
}

// Thrown inside a guard's scope to check that unwinding restores state.
struct Escape : std::runtime_error {
  Escape() : std::runtime_error("escapes the guard's scope") {}
};

// Say what is being tried before a call whose throw would terminate the
// process (noexcept methods): the crash report keeps the output's tail.
inline void announce(const std::string& what) {
  std::fprintf(stderr, "[conformance] %s\n", what.c_str());
  std::fflush(stderr);
}

// Fixtures. Cases need a device unless their fixture says otherwise.
class WithDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    if (count() == 0) GTEST_SKIP() << "the backend reports no devices";
  }
};

class AnyDeviceCount : public ::testing::Test {};

}  // namespace pu1c

// Skips the case (with the reason) unless the backend has `k` devices.
#define PU1C_REQUIRE_DEVICES(k)                                                          \
  if (::pu1c::count() < (k))                                                             \
  GTEST_SKIP() << "needs " << (k) << " devices, the backend has " << ::pu1c::count()
