// C++ contracts of the device guard: c10::DeviceGuard, c10::OptionalDeviceGuard
// and the Device-taking methods of the backend's DeviceGuardImplInterface
// (GD-DEV-001 .. GD-DEV-005, GD-CNT-001), plus the probes that
// test_cxx_contracts.py counts device switches around (GD-DEV-002).
#include "contracts_common.h"
#include "contracts_probes.h"

#include <atomic>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <thread>

namespace pu1c {
namespace {

using GD_DEV_001 = WithDevices;
using GD_DEV_003 = WithDevices;
using GD_DEV_004 = WithDevices;
using GD_DEV_005 = WithDevices;
using GD_CNT_001 = AnyDeviceCount;

// ------------------------------------------------------------ GD-DEV-001

TEST_F(GD_DEV_001, SwitchesOnConstructionRestoresOnDestruction) {
  // decides GD-DEV-001.1
  PU1C_REQUIRE_DEVICES(2);
  const auto used = devices_used();
  for (int origin : used) {
    for (int target : used) {
      impl().setDevice(dev(origin));
      ASSERT_TRUE(CurrentIs(origin)) << "after setDevice(" << dev(origin) << ")";
      {
        c10::DeviceGuard guard(dev(target));
        EXPECT_TRUE(CurrentIs(target)) << "inside DeviceGuard(" << dev(target) << "), entered on "
                                       << dev(origin);
        EXPECT_EQ(guard.original_device(), dev(origin))
            << "DeviceGuard(" << dev(target) << ").original_device() is not the device current "
            << "before it: the guard implementation's exchangeDevice() must return the PREVIOUS device";
        EXPECT_EQ(guard.current_device(), dev(target));
      }
      EXPECT_TRUE(CurrentIs(origin)) << "after DeviceGuard(" << dev(target) << ") entered on "
                                     << dev(origin) << " was destroyed: uncheckedSetDevice() "
                                     << "must restore the original device";
    }
  }
}

TEST_F(GD_DEV_001, RestoresWhenAnExceptionUnwinds) {
  // decides GD-DEV-001.2
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  try {
    c10::DeviceGuard guard(dev(last));
    ASSERT_TRUE(CurrentIs(last)) << "inside DeviceGuard(" << dev(last) << ")";
    throw Escape();
  } catch (const Escape&) {
  }
  EXPECT_TRUE(CurrentIs(0)) << "after an exception unwound a DeviceGuard(" << dev(last)
                            << ") entered on " << dev(0);

  // An error raised by the backend itself while a guard is active: a failed
  // setDevice must not leave a state the guard's restore cannot undo.
  impl().setDevice(dev(last));
  try {
    c10::DeviceGuard guard(dev(0));
    impl().setDevice(dev(count()));  // out of range: required to throw (DM contracts)
    throw Escape();
  } catch (const std::exception&) {
  }
  EXPECT_TRUE(CurrentIs(last)) << "after a backend error (setDevice(" << dev(count())
                               << ")) unwound a DeviceGuard(" << dev(0) << ") entered on " << dev(last);

  // A guard whose construction fails never switched anything.
  impl().setDevice(dev(last));
  bool threw = false;
  try {
    c10::DeviceGuard guard(dev(count()));
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_TRUE(threw) << "DeviceGuard(" << dev(count()) << ") with " << count()
                     << " devices was accepted: exchangeDevice() must validate the index";
  EXPECT_TRUE(CurrentIs(last)) << "after the failed construction of DeviceGuard(" << dev(count())
                               << ") on " << dev(last)
                               << ": exchangeDevice() must validate before switching";
}

TEST_F(GD_DEV_001, SetIndexAndResetDeviceMoveTheGuardAndRestoreTheOriginal) {
  // decides GD-DEV-001.3
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  {
    c10::DeviceGuard guard(dev(0));
    guard.set_index(last);
    EXPECT_TRUE(CurrentIs(last)) << "after DeviceGuard::set_index(" << last << ")";
    EXPECT_EQ(guard.current_device(), dev(last));
    EXPECT_EQ(guard.original_device(), dev(0)) << "set_index changed original_device()";
    guard.reset_device(dev(0));
    EXPECT_TRUE(CurrentIs(0)) << "after DeviceGuard::reset_device(" << dev(0) << ")";
    guard.reset_device(dev(last));
    EXPECT_TRUE(CurrentIs(last)) << "after DeviceGuard::reset_device(" << dev(last) << ")";
    guard.set_index(-1);
    EXPECT_TRUE(CurrentIs(last)) << "DeviceGuard::set_index(-1) must do nothing";
  }
  EXPECT_TRUE(CurrentIs(0)) << "after a DeviceGuard entered on " << dev(0)
                            << " and moved with set_index/reset_device was destroyed";

  impl().setDevice(dev(last));
  {
    c10::DeviceGuard guard(dev(0));
    guard.set_index(last);
    guard.set_index(0);
  }
  EXPECT_TRUE(CurrentIs(last)) << "after a DeviceGuard entered on " << dev(last)
                               << ", moved to " << dev(last) << " and back to " << dev(0)
                               << ", was destroyed";
}

TEST_F(GD_DEV_001, NestedGuardsRestoreInLifoOrder) {
  // decides GD-DEV-001.4
  PU1C_REQUIRE_DEVICES(2);
  const auto used = devices_used();
  // 0 -> 1 -> 0 -> 1 (-> 2 -> last with more devices), then unwinding in reverse.
  std::vector<int> path = {used[1], 0, used[1]};
  for (size_t i = 2; i < used.size(); ++i) path.push_back(used[i]);
  impl().setDevice(dev(0));
  std::function<void(size_t)> enter = [&](size_t depth) {
    if (depth == path.size()) return;
    const int before = static_cast<int>(impl().getDevice().index());
    {
      c10::DeviceGuard guard(dev(path[depth]));
      EXPECT_TRUE(CurrentIs(path[depth])) << "inside nested DeviceGuard #" << depth + 1 << " ("
                                          << dev(path[depth]) << ")";
      enter(depth + 1);
      EXPECT_TRUE(CurrentIs(path[depth])) << "back in nested DeviceGuard #" << depth + 1 << " ("
                                          << dev(path[depth]) << ") after the inner guards ended";
    }
    EXPECT_TRUE(CurrentIs(before)) << "after nested DeviceGuard #" << depth + 1 << " ("
                                   << dev(path[depth]) << ") ended";
  };
  enter(0);
  EXPECT_TRUE(CurrentIs(0)) << "after all nested guards ended";
}

// ------------------------------------------------------------ GD-DEV-003

TEST_F(GD_DEV_003, IndexMinusOneSwitchesNothing) {
  // decides GD-DEV-003.1
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(last));
  {
    c10::DeviceGuard guard(dev(-1));
    EXPECT_TRUE(CurrentIs(last)) << "inside DeviceGuard(" << dev(-1) << ")";
    EXPECT_EQ(guard.original_device(), dev(last))
        << "DeviceGuard(-1).original_device() must be the current device (guard getDevice())";
    EXPECT_EQ(guard.current_device(), dev(last));
    guard.set_index(-1);
    EXPECT_TRUE(CurrentIs(last)) << "DeviceGuard::set_index(-1) must do nothing";
    impl().setDevice(dev(0));
  }
  EXPECT_TRUE(CurrentIs(last)) << "a DeviceGuard(-1) entered on " << dev(last)
                               << " must restore it on destruction";
  {
    c10::OptionalDeviceGuard guard(dev(-1));
    EXPECT_TRUE(CurrentIs(last)) << "inside OptionalDeviceGuard(" << dev(-1) << ")";
    EXPECT_EQ(guard.original_device(), std::make_optional(dev(last)));
  }
  EXPECT_TRUE(CurrentIs(last)) << "after OptionalDeviceGuard(" << dev(-1) << ")";
}

template <typename MakeGuard>
void expect_uninitialized_does_nothing(const char* name, MakeGuard make_guard) {
  const int last = count() - 1;
  impl().setDevice(dev(last));
  {
    auto guard = make_guard();
    EXPECT_TRUE(CurrentIs(last)) << "inside " << name;
    EXPECT_FALSE(guard->original_device().has_value())
        << name << ".original_device() is " << str(guard->original_device());
    EXPECT_FALSE(guard->current_device().has_value())
        << name << ".current_device() is " << str(guard->current_device());
    impl().setDevice(dev(0));
  }
  EXPECT_TRUE(CurrentIs(0)) << "an uninitialized " << name
                            << " must not restore anything: the device set inside it stays";
}

TEST_F(GD_DEV_003, UninitializedOptionalDeviceGuardDoesNothing) {
  // decides GD-DEV-003.2
  PU1C_REQUIRE_DEVICES(2);
  expect_uninitialized_does_nothing(
      "OptionalDeviceGuard()", [] { return std::make_unique<c10::OptionalDeviceGuard>(); });
  expect_uninitialized_does_nothing("OptionalDeviceGuard(std::nullopt)", [] {
    return std::make_unique<c10::OptionalDeviceGuard>(std::optional<c10::Device>());
  });
}

TEST_F(GD_DEV_003, OptionalDeviceGuardResetRestoresTheDeviceAtInitialization) {
  // decides GD-DEV-003.3
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  {
    c10::OptionalDeviceGuard guard(dev(last));
    EXPECT_TRUE(CurrentIs(last)) << "inside OptionalDeviceGuard(" << dev(last) << ")";
    EXPECT_EQ(guard.original_device(), std::make_optional(dev(0)));
    EXPECT_EQ(guard.current_device(), std::make_optional(dev(last)));
  }
  EXPECT_TRUE(CurrentIs(0)) << "after OptionalDeviceGuard(" << dev(last) << ") entered on " << dev(0)
                            << " was destroyed";
  // reset() lives on the inline guard that c10::OptionalDeviceGuard wraps
  // (and that backends' own optional guards, like OptionalCUDAGuard, use).
  {
    c10::impl::InlineOptionalDeviceGuard<c10::impl::VirtualGuardImpl> guard(dev(last));
    EXPECT_TRUE(CurrentIs(last)) << "inside an optional device guard for " << dev(last);
    guard.reset();
    EXPECT_TRUE(CurrentIs(0)) << "reset() of an optional device guard entered on " << dev(0)
                              << " must restore it";
    EXPECT_FALSE(guard.original_device().has_value()) << "reset() must uninitialize the guard";
    impl().setDevice(dev(last));
  }
  EXPECT_TRUE(CurrentIs(last)) << "an optional device guard that was reset() must not restore again";

  // Initialized late: restores the device current at initialization.
  impl().setDevice(dev(last));
  {
    c10::OptionalDeviceGuard guard;
    impl().setDevice(dev(0));
    guard.reset_device(dev(last));
    EXPECT_TRUE(CurrentIs(last)) << "after OptionalDeviceGuard::reset_device(" << dev(last) << ")";
    EXPECT_EQ(guard.original_device(), std::make_optional(dev(0)))
        << "a late-initialized OptionalDeviceGuard's original device is the one current at "
        << "initialization";
  }
  EXPECT_TRUE(CurrentIs(0)) << "a late-initialized OptionalDeviceGuard must restore the device "
                            << "current at initialization";
}

// ------------------------------------------------------------ GD-DEV-004

struct Attempt {
  enum Kind { kReturned, kThrew, kThrewNonStd } kind;
  std::string message;
};

template <typename F>
Attempt attempt(F&& call) {
  try {
    call();
    return {Attempt::kReturned, {}};
  } catch (const std::exception& e) {
    return {Attempt::kThrew, message_of(e)};
  } catch (...) {
    return {Attempt::kThrewNonStd, {}};
  }
}

// Checks one method against one foreign argument: it must throw a
// std::exception (c10::Error), whatever its wording (CUDA's guard asserts
// the type without naming it), and change nothing.
template <typename Bad>
void expect_rejected(const std::string& call, Bad&& bad) {
  const int before = static_cast<int>(impl().getDevice().index());
  const auto streams = current_streams();
  const Attempt result = attempt(bad);
  switch (result.kind) {
    case Attempt::kReturned:
      ADD_FAILURE() << call << " returned instead of raising: the guard implementation must check "
                    << "the device type (TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, ...))";
      break;
    case Attempt::kThrewNonStd:
      ADD_FAILURE() << call << " threw something that is not a std::exception: raise c10::Error "
                    << "(TORCH_CHECK) so that PyTorch can report it";
      break;
    case Attempt::kThrew:
      break;
  }
  EXPECT_TRUE(CurrentIs(before)) << "after " << call << " (rejected or not)";
  EXPECT_TRUE(StreamsAre(streams)) << "after " << call << " (rejected or not)";
  // Undo whatever a failing method changed, so that the next check starts clean.
  impl().setDevice(dev(before));
  for (const auto& [device, stream] : streams) impl().exchangeStream(stream);
}

std::vector<c10::Device> foreign_devices() {
  return {c10::Device(c10::DeviceType::CPU, 0), c10::Device(c10::DeviceType::CUDA, 0)};
}

// The methods that switch the device check its type. (The stream getters,
// getStream, getDefaultStream, getStreamFromGlobalPool and getNewStream, may
// be lenient: CUDA's only use the index.)
TEST_F(GD_DEV_004, DeviceSwitchingMethodsRejectAnotherDeviceType) {
  // decides GD-DEV-004.1
  // Start away from index 0 where possible: a method that ignores the type
  // and switches to index 0 is then visible.
  const int start = count() - 1;
  impl().setDevice(dev(start));
  using Method = std::pair<const char*, std::function<void(c10::Device)>>;
  const std::vector<Method> methods = {
      {"exchangeDevice", [](c10::Device d) { impl().exchangeDevice(d); }},
      {"setDevice", [](c10::Device d) { impl().setDevice(d); }},
  };
  for (const auto& foreign : foreign_devices()) {
    for (const auto& [name, method] : methods) {
      expect_rejected(std::string(name) + "(" + str(foreign) + ")", [&] { method(foreign); });
    }
    // Through the guard classes: a DeviceGuard given the backend's guard
    // implementation explicitly and a device of another type.
    expect_rejected("c10::DeviceGuard(" + str(foreign) + ", <the backend's guard impl>)",
                    [&] { c10::DeviceGuard guard(foreign, &impl()); });
  }
}

TEST_F(GD_DEV_004, StreamTakingMethodsRejectAStreamOfAnotherType) {
  // decides GD-DEV-004.2
  const int start = count() - 1;
  impl().setDevice(dev(start));
  const c10::Stream valid = impl().getStream(dev(start));
  using Method = std::pair<const char*, std::function<void(c10::Stream)>>;
  const std::vector<Method> methods = {
      {"exchangeStream", [](c10::Stream s) { impl().exchangeStream(s); }},
      {"queryStream", [](c10::Stream s) { impl().queryStream(s); }},
      {"synchronizeStream", [](c10::Stream s) { impl().synchronizeStream(s); }},
  };
  for (const auto& foreign : foreign_devices()) {
    const c10::Stream stream(c10::Stream::DEFAULT, foreign);
    for (const auto& [name, method] : methods) {
      expect_rejected(std::string(name) + "(" + str(stream) + ")", [&] { method(stream); });
    }
  }
  (void)valid;
}

// ------------------------------------------------------------ GD-DEV-005

std::vector<int> invalid_indices() {
  const int n = count();
  std::vector<int> bad = {n, n + 1, 100, 127, -2, -5, -128};
  bad.erase(std::remove_if(bad.begin(), bad.end(), [](int i) { return i > 127; }), bad.end());
  return bad;
}

TEST_F(GD_DEV_005, NeverThrowsForAnInvalidIndexAndChangesNothing) {
  // decides GD-DEV-005.1
  // First device calls of this process (each case runs in a fresh one) and
  // of a new thread: the uninitialized paths too.
  for (int bad : invalid_indices()) {
    announce("GD-DEV-005: uncheckedSetDevice(" + str(dev(bad)) +
             ") first thing in the process; it is noexcept: a throw terminates the process");
    impl().uncheckedSetDevice(dev(bad));
  }
  std::thread([&] {
    for (int bad : invalid_indices()) {
      announce("GD-DEV-005: uncheckedSetDevice(" + str(dev(bad)) + ") first thing in a new thread");
      impl().uncheckedSetDevice(dev(bad));
    }
    EXPECT_TRUE(CurrentIs(0)) << "a new thread starts on device 0, but after uncheckedSetDevice "
                              << "with invalid indices as its first device calls it is elsewhere";
  }).join();

  const int last = count() - 1;
  impl().setDevice(dev(last));
  for (int bad : invalid_indices()) {
    announce("GD-DEV-005: uncheckedSetDevice(" + str(dev(bad)) + ") with " + std::to_string(count()) +
             " devices; it is noexcept: a throw terminates the process");
    impl().uncheckedSetDevice(dev(bad));
    EXPECT_TRUE(CurrentIs(last)) << "after uncheckedSetDevice(" << dev(bad)
                                 << ") (invalid index): it must change nothing";
  }
  announce("GD-DEV-005: uncheckedSetDevice(" + str(dev(-1)) + ")");
  impl().uncheckedSetDevice(dev(-1));
  EXPECT_TRUE(CurrentIs(last)) << "after uncheckedSetDevice(" << dev(-1) << ")";
}

// What it then does is not fixed (CUDA's uses the index whatever the type):
// only that it does not throw.
TEST_F(GD_DEV_005, NeverThrowsForAnotherDeviceType) {
  // decides GD-DEV-005.2
  const int last = count() - 1;
  impl().setDevice(dev(last));
  for (const auto& foreign : foreign_devices()) {
    announce("GD-DEV-005: uncheckedSetDevice(" + str(foreign) +
             "); it is noexcept: a throw terminates the process");
    impl().uncheckedSetDevice(foreign);
  }
}

// Guards restore devices with uncheckedSetDevice: one that does nothing
// would pass the cases above. (With one device there is nothing to see.)
TEST_F(GD_DEV_005, SwitchesForAValidIndex) {
  // decides GD-DEV-005.3
  PU1C_REQUIRE_DEVICES(1);
  const auto used = devices_used();
  const int last = used.back();
  impl().setDevice(dev(0));
  for (int i : std::vector<int>{last, 0, used[1 % used.size()], last}) {
    impl().uncheckedSetDevice(dev(i));
    EXPECT_TRUE(CurrentIs(i)) << "uncheckedSetDevice(" << dev(i)
                              << ") did not switch: guards restore devices with it";
  }
}

// ------------------------------------------------------------ GD-CNT-001

// (Whether the hooks agree is HK-DEV-001's, the module DM-COUNT-001's.)
TEST_F(GD_CNT_001, DeviceCountNeverThrowsAndStaysTheSame) {
  // decides GD-CNT-001.1 GD-CNT-001.2
  announce("GD-CNT-001: deviceCount() on a fresh process; it is noexcept: a throw terminates");
  const int first = count();
  EXPECT_GE(first, 0) << "the guard's deviceCount() returned a negative count";
  for (int i = 0; i < 1000; ++i) {
    const int again = count();
    if (again != first) {
      ADD_FAILURE() << "deviceCount() returned " << first << " and then, on call " << i + 2 << ", "
                    << again << ": it must return the same count every time";
      break;
    }
  }
  // Concurrent first calls from several threads (lazy initialization races).
  constexpr int kThreads = 4;
  std::latch start(kThreads);
  std::atomic<int> disagreements{0};
  std::atomic<int> seen{-1};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (int i = 0; i < 500; ++i) {
        const int c = count();
        if (c != first) {
          seen = c;
          ++disagreements;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(disagreements.load(), 0) << "deviceCount() called from " << kThreads
                                     << " threads returned " << seen.load() << " instead of "
                                     << first << " (" << disagreements.load() << " times)";
  if (first > 0) {
    // Using the device does not change the count either.
    impl().setDevice(dev(first - 1));
    EXPECT_EQ(count(), first) << "deviceCount() changed after setDevice(" << dev(first - 1) << ")";
  }
}

}  // namespace

// ------------------------------------------- GD-DEV-002 probes (counted in Python)

void guard_current_device(const std::string& kind, int repeats) {
  const c10::Device here = impl().getDevice();
  for (int i = 0; i < repeats; ++i) {
    if (kind == "DeviceGuard") {
      c10::DeviceGuard guard(here);
    } else if (kind == "nested DeviceGuard") {
      c10::DeviceGuard outer(here);
      c10::DeviceGuard inner(here);
    } else if (kind == "OptionalDeviceGuard") {
      c10::OptionalDeviceGuard guard(here);
      c10::OptionalDeviceGuard late;
      late.reset_device(here);
    } else if (kind == "StreamGuard") {
      c10::StreamGuard guard(impl().getStream(here));
    } else {
      throw std::invalid_argument("unknown guard kind '" + kind + "'");
    }
  }
}

void guard_other_device(int index) { c10::DeviceGuard guard(dev(index)); }

}  // namespace pu1c
