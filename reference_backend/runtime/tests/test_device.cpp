// Devices: error names and messages, the device count and its configuration
// (OPENREG_DEVICE_COUNT / OPENREG_DEVICE_MEMORY), the per-thread current
// device, lazy initialization, device-wide synchronization, memory info,
// stream priorities, debug counters, and what fork() leaves usable.
#include "test_helpers.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <utility>

namespace openreg_test {
namespace {

using namespace std::chrono_literals;

orDebugCounters Counters() {
  orDebugCounters counters{};
  orGetDebugCounters(&counters);
  return counters;
}

// Sets (or, for nullptr, removes) the configuration variables. Only useful
// before the first runtime call of a process, i.e. in a fresh process.
void SetConfig(const char* device_count, const char* device_memory) {
  if (device_count) setenv("OPENREG_DEVICE_COUNT", device_count, 1);
  else unsetenv("OPENREG_DEVICE_COUNT");
  if (device_memory) setenv("OPENREG_DEVICE_MEMORY", device_memory, 1);
  else unsetenv("OPENREG_DEVICE_MEMORY");
}

// ------------------------------------------------------------ error names

TEST(ErrorNameTest, NamesEveryErrorCode) {
  const std::pair<orError_t, const char*> names[] = {
      {orSuccess, "orSuccess"},
      {orErrorInvalidValue, "orErrorInvalidValue"},
      {orErrorInvalidDevice, "orErrorInvalidDevice"},
      {orErrorMemoryAllocation, "orErrorMemoryAllocation"},
      {orErrorInvalidPointer, "orErrorInvalidPointer"},
      {orErrorNotReady, "orErrorNotReady"},
      {orErrorInvalidHandle, "orErrorInvalidHandle"},
      {orErrorDeviceMismatch, "orErrorDeviceMismatch"},
      {orErrorNoDevice, "orErrorNoDevice"},
      {orErrorInitialization, "orErrorInitialization"},
      {orErrorForkedProcess, "orErrorForkedProcess"},
      {orErrorKernelFailed, "orErrorKernelFailed"},
      {orErrorNotPermitted, "orErrorNotPermitted"},
      {orErrorDeviceLost, "orErrorDeviceLost"},
      {orErrorNotSupported, "orErrorNotSupported"},
  };
  for (const auto& [code, name] : names) EXPECT_STREQ(orGetErrorName(code), name);
}

TEST(ErrorNameTest, UnknownCodeStillGetsAName) {
  EXPECT_STREQ(orGetErrorName(static_cast<orError_t>(999)), "orErrorUnknown");
  EXPECT_STREQ(orGetErrorName(static_cast<orError_t>(-1)), "orErrorUnknown");
}

// ---------------------------------------------------- last error message

TEST(LastErrorMessageTest, IsEmptyInAFreshThread) {
  std::string seen = "not read";
  std::thread([&] { seen = orGetLastErrorMessage(); }).join();
  EXPECT_EQ(seen, "");
}

TEST(LastErrorMessageTest, IsPerThread) {
  EXPECT_FAILS(orSetDevice(-1), orErrorInvalidDevice, "orSetDevice");
  std::string other_thread;
  std::thread([&] {
    orGetDevice(nullptr);
    other_thread = orGetLastErrorMessage();
  }).join();
  EXPECT_NE(other_thread.find("orGetDevice"), std::string::npos) << other_thread;
  const std::string mine = orGetLastErrorMessage();
  EXPECT_NE(mine.find("orSetDevice"), std::string::npos) << mine;
}

TEST(LastErrorMessageTest, SurvivesLaterSuccessfulCalls) {
  EXPECT_FAILS(orSetDevice(-1), orErrorInvalidDevice, "orSetDevice");
  int count = 0;
  ASSERT_OK(orGetDeviceCount(&count));
  const std::string message = orGetLastErrorMessage();
  EXPECT_NE(message.find("orSetDevice"), std::string::npos) << message;
}

// ------------------------------------------------------------ device count

TEST(DeviceCountTest, MatchesTheEnvironmentOrTheDefault) {
  int count = -1;
  ASSERT_OK(orGetDeviceCount(&count));
  const char* configured = std::getenv("OPENREG_DEVICE_COUNT");
  EXPECT_EQ(count, configured ? std::atoi(configured) : OR_DEFAULT_DEVICE_COUNT);
}

TEST(DeviceCountTest, RejectsNullCount) {
  EXPECT_FAILS(orGetDeviceCount(nullptr), orErrorInvalidValue,
               "orGetDeviceCount", "count");
}

// ---------------------------------------------------------- current device

class CurrentDeviceTest : public RuntimeTest {};

TEST_F(CurrentDeviceTest, GetRejectsNull) {
  EXPECT_FAILS(orGetDevice(nullptr), orErrorInvalidValue, "orGetDevice", "device");
}

TEST_F(CurrentDeviceTest, SetSelectsEveryDevice) {
  for (int device = 0; device < DeviceCount(); ++device) {
    ASSERT_OK(orSetDevice(device));
    int current = -1;
    ASSERT_OK(orGetDevice(&current));
    EXPECT_EQ(current, device);
  }
}

TEST_F(CurrentDeviceTest, SetRejectsOutOfRangeAndKeepsTheCurrentDevice) {
  for (int start : {0, DeviceCount() - 1}) {
    ASSERT_OK(orSetDevice(start));
    for (int bad : InvalidDeviceIndexes()) {
      const uint64_t calls_before = Counters().set_device_calls;
      EXPECT_FAILS(orSetDevice(bad), orErrorInvalidDevice, "orSetDevice",
                   DeviceArg(bad), ValidDeviceRange());
      EXPECT_EQ(CurrentDevice(), start);
      EXPECT_EQ(Counters().set_device_calls, calls_before);
    }
  }
}

TEST_F(CurrentDeviceTest, StartsAtZeroInEveryNewThread) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  for (int round = 0; round < 3; ++round) {
    int seen = -1;
    std::thread([&] {
      orGetDevice(&seen);
      orSetDevice(1);  // changes only this thread's device
    }).join();
    EXPECT_EQ(seen, 0);
  }
  EXPECT_EQ(CurrentDevice(), 1);
  ASSERT_OK(orSetDevice(0));
  int seen = -1;
  std::thread([&] { orGetDevice(&seen); }).join();
  EXPECT_EQ(seen, 0);
}

TEST_F(CurrentDeviceTest, EachThreadKeepsItsOwnDevice) {
  REQUIRE_DEVICES(2);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const int mine = t % DeviceCount();
      orSetDevice(mine);
      for (int i = 0; i < 2000; ++i) {
        if (CurrentDevice() != mine) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(CurrentDeviceTest, EverySuccessfulSetDeviceCallIsCounted) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(0));
  const uint64_t before = Counters().set_device_calls;
  ASSERT_OK(orSetDevice(0));  // redundant calls count too
  EXPECT_EQ(Counters().set_device_calls, before + 1);
  ASSERT_OK(orSetDevice(1));
  EXPECT_EQ(Counters().set_device_calls, before + 2);
  EXPECT_NE(orSetDevice(99), orSuccess);  // failures do not
  EXPECT_EQ(Counters().set_device_calls, before + 2);
}

// ----------------------------------------------------------- initialization

TEST(DeviceInitTest, IsInitializedRejectsNullAndBadDevices) {
  EXPECT_FAILS(orDeviceIsInitialized(0, nullptr), orErrorInvalidValue,
               "orDeviceIsInitialized", "initialized");
  for (int bad : InvalidDeviceIndexes()) {
    int initialized = 42;
    EXPECT_FAILS(orDeviceIsInitialized(bad, &initialized), orErrorInvalidDevice,
                 "orDeviceIsInitialized", DeviceArg(bad), ValidDeviceRange());
  }
}

TEST(DeviceInitTest, InitRejectsBadDevices) {
  for (int bad : InvalidDeviceIndexes()) {
    const uint64_t inits_before = Counters().device_inits;
    EXPECT_FAILS(orDeviceInit(bad), orErrorInvalidDevice, "orDeviceInit",
                 DeviceArg(bad), ValidDeviceRange());
    EXPECT_EQ(Counters().device_inits, inits_before);
  }
}

TEST(DeviceInitTest, InitIsIdempotent) {
  ASSERT_OK(orDeviceInit(0));
  EXPECT_TRUE(IsInitialized(0));
  const uint64_t inits = Counters().device_inits;
  ASSERT_OK(orDeviceInit(0));
  EXPECT_TRUE(IsInitialized(0));
  EXPECT_EQ(Counters().device_inits, inits);
}

TEST(DeviceInitTest, ConcurrentFirstUseInitializesOnce) {
  // Whatever the other tests did, initializing every device from many threads
  // at once must leave each initialized exactly once.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int d = 0; d < DeviceCount(); ++d) orDeviceInit(d);
    });
  }
  for (auto& thread : threads) thread.join();
  const uint64_t inits = Counters().device_inits;
  for (int d = 0; d < DeviceCount(); ++d) {
    EXPECT_TRUE(IsInitialized(d));
    ASSERT_OK(orDeviceInit(d));
  }
  EXPECT_EQ(Counters().device_inits, inits);
}

// In a fresh process: which calls initialize which device.
[[noreturn]] void CheckLazyInitialization() {
  SetConfig("5", nullptr);
  ChildReport report;
  for (int d = 0; d < 5; ++d) {
    report.Expect(!IsInitialized(d), "device " + std::to_string(d) +
                                         " is uninitialized at start");
  }
  // None of these may initialize anything.
  int device = -1, least = 0, greatest = 0;
  size_t free_bytes = 0, total_bytes = 0;
  report.ExpectOk(orSetDevice(3), "orSetDevice(3)");
  report.ExpectOk(orGetDevice(&device), "orGetDevice");
  report.ExpectOk(orDeviceGetMemoryInfo(3, &free_bytes, &total_bytes),
                  "orDeviceGetMemoryInfo(3)");
  report.Expect(free_bytes == total_bytes, "an uninitialized device is all free");
  report.ExpectOk(orDeviceGetStreamPriorityRange(&least, &greatest),
                  "orDeviceGetStreamPriorityRange");
  report.Expect(!IsInitialized(3), "orSetDevice alone does not initialize");
  // A device that never ran anything has nothing to wait for.
  report.ExpectOk(orDeviceSynchronize(4), "orDeviceSynchronize(4) of an unused device");
  report.Expect(!IsInitialized(4), "orDeviceSynchronize does not initialize an unused device");
  report.Expect(Counters().device_inits == 0, "no device_inits yet");

  // Memory, streams and events initialize only the device they use.
  void* ptr = nullptr;
  report.ExpectOk(orMalloc(&ptr, 64), "orMalloc on device 3");
  report.Expect(IsInitialized(3), "orMalloc initialized device 3");
  report.Expect(Counters().device_inits == 1, "one device_init after orMalloc");
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  orStream_t stream = nullptr;
  report.ExpectOk(orStreamCreate(&stream), "orStreamCreate on device 0");
  report.Expect(IsInitialized(0), "orStreamCreate initialized device 0");
  orStream_t default_stream = nullptr;
  report.ExpectOk(orStreamGetDefault(1, &default_stream), "orStreamGetDefault(1)");
  report.Expect(IsInitialized(1), "orStreamGetDefault initialized device 1");
  report.ExpectOk(orSetDevice(2), "orSetDevice(2)");
  orEvent_t event = nullptr;
  report.ExpectOk(orEventCreate(&event), "orEventCreate on device 2");
  report.Expect(IsInitialized(2), "orEventCreate initialized device 2");
  report.Expect(!IsInitialized(4), "device 4 was never used");
  report.ExpectOk(orDeviceInit(4), "orDeviceInit(4)");
  report.Expect(IsInitialized(4), "orDeviceInit initialized device 4");
  report.ExpectOk(orDeviceInit(4), "orDeviceInit(4) again");
  report.Expect(Counters().device_inits == 5, "each device initialized once");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, DevicesInitializeOnFirstUseOfMemoryOrStreams) {
  EXPECT_IN_FRESH_PROCESS(CheckLazyInitialization());
}

// ------------------------------------------------------ device synchronize

class DeviceSynchronizeTest : public RuntimeTest {};

TEST_F(DeviceSynchronizeTest, RejectsBadDevices) {
  for (int bad : InvalidDeviceIndexes()) {
    EXPECT_FAILS(orDeviceSynchronize(bad), orErrorInvalidDevice,
                 "orDeviceSynchronize", DeviceArg(bad), ValidDeviceRange());
  }
}

TEST_F(DeviceSynchronizeTest, WaitsForEveryStreamOfThatDeviceNotTheCurrentOne) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  orStream_t side_stream = nullptr;
  ASSERT_OK(orStreamCreate(&side_stream));
  orStream_t default_stream = nullptr;
  ASSERT_OK(orStreamGetDefault(1, &default_stream));
  Gate gate;
  std::atomic<bool> side_done{false}, default_done{false};
  for (auto [stream, done] : {std::pair{side_stream, &side_done},
                              std::pair{default_stream, &default_done}}) {
    ASSERT_OK(gate.Block(stream));
    ASSERT_OK(LaunchFn(stream, [done = done] {
      done->store(true);
      return orSuccess;
    }));
  }
  ASSERT_OK(orSetDevice(0));
  // Opening later makes a synchronize that does not wait return too early.
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.Open();
  });
  EXPECT_OK(orDeviceSynchronize(1));
  EXPECT_TRUE(side_done.load());
  EXPECT_TRUE(default_done.load());
  EXPECT_EQ(CurrentDevice(), 0);
  opener.join();
  EXPECT_OK(orStreamDestroy(side_stream));
}

TEST_F(DeviceSynchronizeTest, IgnoresWorkOfOtherDevices) {
  REQUIRE_DEVICES(2);
  Gate gate;
  ASSERT_OK(gate.Block(nullptr));  // device 0's default stream stays busy
  auto sync = std::async(std::launch::async, [] { return orDeviceSynchronize(1); });
  const bool finished = sync.wait_for(5s) == std::future_status::ready;
  gate.Open();
  EXPECT_TRUE(finished) << "orDeviceSynchronize(1) waited for device 0";
  EXPECT_EQ(sync.get(), orSuccess);
  EXPECT_OK(orDeviceSynchronize(0));
}

TEST_F(DeviceSynchronizeTest, ReportsAKernelFailureOnceWithTheDevice) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  ASSERT_OK(LaunchFn(stream, [] {
    orKernelSetError("matrix exploded");
    return orErrorInvalidValue;
  }));
  ASSERT_OK(orSetDevice(0));
  EXPECT_FAILS(orDeviceSynchronize(1), orErrorKernelFailed, "orDeviceSynchronize",
               "device=1", "matrix exploded");
  EXPECT_OK(orDeviceSynchronize(1));  // reported once, then cleared
  EXPECT_OK(orStreamDestroy(stream));
}

// -------------------------------------------------------------- memory info

TEST(MemoryInfoTest, RejectsNullOutputsAndBadDevices) {
  size_t free_bytes = 1, total_bytes = 1;
  EXPECT_FAILS(orDeviceGetMemoryInfo(0, nullptr, &total_bytes),
               orErrorInvalidValue, "orDeviceGetMemoryInfo", "free_bytes");
  EXPECT_FAILS(orDeviceGetMemoryInfo(0, &free_bytes, nullptr),
               orErrorInvalidValue, "orDeviceGetMemoryInfo", "total_bytes");
  for (int bad : InvalidDeviceIndexes()) {
    EXPECT_FAILS(orDeviceGetMemoryInfo(bad, &free_bytes, &total_bytes),
                 orErrorInvalidDevice, "orDeviceGetMemoryInfo", DeviceArg(bad),
                 ValidDeviceRange());
  }
}

TEST(MemoryInfoTest, TotalIsTheConfiguredSizeAndFreeNeverExceedsIt) {
  for (int device = 0; device < DeviceCount(); ++device) {
    size_t free_bytes = 0, total_bytes = 0;
    ASSERT_OK(orDeviceGetMemoryInfo(device, &free_bytes, &total_bytes));
    if (!std::getenv("OPENREG_DEVICE_MEMORY")) {
      EXPECT_EQ(total_bytes, OR_DEFAULT_DEVICE_MEMORY);
    }
    EXPECT_LE(free_bytes, total_bytes);
  }
}

// ------------------------------------------------------ priority range

TEST(StreamPriorityRangeTest, LeastIsZeroAndGreatestIsMinusOne) {
  int least = 7, greatest = 7;
  ASSERT_OK(orDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT_EQ(least, 0);
  EXPECT_EQ(greatest, -1);
}

TEST(StreamPriorityRangeTest, RejectsNullOutputs) {
  int value = 0;
  EXPECT_FAILS(orDeviceGetStreamPriorityRange(nullptr, &value), orErrorInvalidValue,
               "orDeviceGetStreamPriorityRange", "least");
  EXPECT_FAILS(orDeviceGetStreamPriorityRange(&value, nullptr), orErrorInvalidValue,
               "orDeviceGetStreamPriorityRange", "greatest");
}

// ------------------------------------------------------------ debug counters

TEST(DebugCountersTest, RejectsNull) {
  // Stamp with another call's message first: orGetDebugCounters is the stamp.
  orGetDevice(nullptr);
  EXPECT_EQ(orGetDebugCounters(nullptr), orErrorInvalidValue);
  const std::string message = orGetLastErrorMessage();
  EXPECT_NE(message.find("orGetDebugCounters"), std::string::npos) << message;
  EXPECT_NE(message.find("counters"), std::string::npos) << message;
}

TEST(DebugCountersTest, CountMallocsFreesAndKernels) {
  const orDebugCounters before = Counters();
  void* empty = nullptr;
  ASSERT_OK(orMalloc(&empty, 0));  // size 0 is not counted
  void* ptr = nullptr;
  ASSERT_OK(orMalloc(&ptr, 128));
  EXPECT_EQ(Counters().mallocs, before.mallocs + 1);
  ASSERT_OK(orFree(nullptr));  // null is not counted
  ASSERT_OK(orFree(ptr));
  EXPECT_EQ(Counters().frees, before.frees + 1);
  EXPECT_EQ(orFree(ptr), orErrorInvalidPointer);  // failures are not counted
  EXPECT_EQ(Counters().frees, before.frees + 1);
  ASSERT_OK(LaunchFn(nullptr, [] { return orSuccess; }));
  ASSERT_OK(LaunchFn(nullptr, [] { return orSuccess; }));
  EXPECT_EQ(Counters().kernels_launched, before.kernels_launched + 2);
  ASSERT_OK(orStreamSynchronize(nullptr));
}

// ------------------------------------------------------------ configuration

[[noreturn]] void CheckEnvironmentIsReadOnce() {
  SetConfig("3", nullptr);
  ChildReport report;
  int count = 0;
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");
  report.Expect(count == 3, "count is 3, got " + std::to_string(count));
  SetConfig("5", "1M");
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount again");
  report.Expect(count == 3, "a later change is ignored, got " + std::to_string(count));
  size_t free_bytes = 0, total_bytes = 0;
  report.ExpectOk(orDeviceGetMemoryInfo(0, &free_bytes, &total_bytes), "memory info");
  report.Expect(total_bytes == OR_DEFAULT_DEVICE_MEMORY, "memory keeps the default");
  // A fork()ed child inherits the parsed configuration, not the environment.
  std::string child = RunInForkedChild([](ChildReport& child_report) {
    int child_count = 0;
    orGetDeviceCount(&child_count);
    child_report.Expect(child_count == 3, "forked child sees the parent's count");
  });
  report.Expect(child.empty(), child);
  report.Finish();
}

TEST_F(FreshProcessDeathTest, EnvironmentIsReadOncePerProcess) {
  EXPECT_IN_FRESH_PROCESS(CheckEnvironmentIsReadOnce());
}

[[noreturn]] void CheckZeroDevices() {
  SetConfig("0", nullptr);
  ChildReport report;
  int count = -1;
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");
  report.Expect(count == 0, "count is 0");
  int device = 42;
  report.ExpectFails(orGetDevice(&device), orErrorNoDevice,
                     {"orGetDevice", "no OpenReg devices"}, "orGetDevice");
  report.ExpectFails(orSetDevice(0), orErrorNoDevice,
                     {"orSetDevice", "device=0", "no OpenReg devices"}, "orSetDevice");
  void* ptr = &device;
  report.ExpectFails(orMalloc(&ptr, 16), orErrorNoDevice,
                     {"orMalloc", "no OpenReg devices"}, "orMalloc");
  report.Expect(ptr == nullptr, "orMalloc cleared ptr");
  orStream_t stream = nullptr;
  report.ExpectFails(orStreamCreate(&stream), orErrorNoDevice,
                     {"orStreamCreate:", "no OpenReg devices"}, "orStreamCreate");
  orEvent_t event = nullptr;
  report.ExpectFails(orEventCreate(&event), orErrorNoDevice,
                     {"orEventCreate:", "no OpenReg devices"}, "orEventCreate");
  report.ExpectFails(orLaunchKernel(nullptr, [](void*) { return orSuccess; }, nullptr),
                     orErrorNoDevice, {"orLaunchKernel", "no OpenReg devices"},
                     "orLaunchKernel on the default stream");
  report.ExpectFails(orDeviceSynchronize(0), orErrorNoDevice,
                     {"orDeviceSynchronize", "no OpenReg devices"},
                     "orDeviceSynchronize");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ZeroDevicesAreAllowedButUnusable) {
  EXPECT_IN_FRESH_PROCESS(CheckZeroDevices());
}

[[noreturn]] void CheckDeviceCount(int expected, const char* text) {
  SetConfig(text, nullptr);
  ChildReport report;
  int count = -1;
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");
  report.Expect(count == expected, "count is " + std::to_string(count));
  const int last = expected - 1;
  report.ExpectOk(orSetDevice(last), "orSetDevice(last)");
  void* ptr = nullptr;
  report.ExpectOk(orMalloc(&ptr, 256), "orMalloc on the last device");
  orPointerAttributes attributes{};
  report.ExpectOk(orPointerGetAttributes(&attributes, ptr), "attributes");
  report.Expect(attributes.device == last, "memory belongs to the last device");
  const std::string range = "[0, " + std::to_string(expected) + ")";
  report.ExpectFails(orSetDevice(expected), orErrorInvalidDevice,
                     {"orSetDevice", range}, "orSetDevice(count)");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, FourDevices) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceCount(4, "4"));
}

TEST_F(FreshProcessDeathTest, MaximumOf127DevicesIsAccepted) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceCount(OR_MAX_DEVICE_COUNT, "127"));
}

struct BadSetting {
  const char* name;   // test name suffix
  const char* value;  // the environment value
};

std::string SettingName(const testing::TestParamInfo<BadSetting>& info) {
  return info.param.name;
}

void PrintTo(const BadSetting& setting, std::ostream* out) {
  *out << "'" << setting.value << "'";
}

// Every device call fails, naming the call, the variable and the valid range.
[[noreturn]] void CheckConfigRejected(const char* variable, const char* value,
                                      const char* valid_range) {
  if (std::string(variable) == "OPENREG_DEVICE_COUNT") SetConfig(value, nullptr);
  else SetConfig(nullptr, value);
  ChildReport report;
  const std::string quoted = std::string("'") + value + "'";
  int count = -1;
  report.ExpectFails(orGetDeviceCount(&count), orErrorInitialization,
                     {"orGetDeviceCount", variable, quoted, valid_range},
                     "orGetDeviceCount");
  report.Expect(count == 0, "no devices are reported");
  int device = -1;
  report.ExpectFails(orGetDevice(&device), orErrorInitialization,
                     {"orGetDevice", variable, valid_range}, "orGetDevice");
  report.ExpectFails(orSetDevice(0), orErrorInitialization,
                     {"orSetDevice", variable, valid_range}, "orSetDevice");
  void* ptr = nullptr;
  report.ExpectFails(orMalloc(&ptr, 16), orErrorInitialization,
                     {"orMalloc", variable, valid_range}, "orMalloc");
  orStream_t stream = nullptr;
  report.ExpectFails(orStreamCreate(&stream), orErrorInitialization,
                     {"orStreamCreate", variable}, "orStreamCreate");
  size_t free_bytes = 0, total_bytes = 0;
  report.ExpectFails(orDeviceGetMemoryInfo(0, &free_bytes, &total_bytes),
                     orErrorInitialization, {"orDeviceGetMemoryInfo", variable},
                     "orDeviceGetMemoryInfo");
  report.Finish();
}

class InvalidDeviceCountDeathTest
    : public FreshProcessDeathTest,
      public testing::WithParamInterface<BadSetting> {};

TEST_P(InvalidDeviceCountDeathTest, IsRejectedWithTheValidRange) {
  EXPECT_IN_FRESH_PROCESS(
      CheckConfigRejected("OPENREG_DEVICE_COUNT", GetParam().value, "[0, 127]"));
}

INSTANTIATE_TEST_SUITE_P(Values, InvalidDeviceCountDeathTest,
                         testing::Values(BadSetting{"TooMany", "128"},
                                         BadSetting{"Negative", "-1"},
                                         BadSetting{"NotANumber", "abc"},
                                         BadSetting{"Empty", ""},
                                         BadSetting{"TrailingJunk", "2x"},
                                         BadSetting{"LeadingBlank", " 2"},
                                         BadSetting{"PlusSign", "+2"}),
                         SettingName);

class InvalidDeviceMemoryDeathTest
    : public FreshProcessDeathTest,
      public testing::WithParamInterface<BadSetting> {};

TEST_P(InvalidDeviceMemoryDeathTest, IsRejectedWithTheValidRange) {
  EXPECT_IN_FRESH_PROCESS(CheckConfigRejected(
      "OPENREG_DEVICE_MEMORY", GetParam().value, "[65536, 1099511627776]"));
}

INSTANTIATE_TEST_SUITE_P(Values, InvalidDeviceMemoryDeathTest,
                         testing::Values(BadSetting{"TooSmall", "12"},
                                         BadSetting{"NotANumber", "lots"},
                                         BadSetting{"Negative", "-5"},
                                         BadSetting{"UnknownSuffix", "4X"},
                                         BadSetting{"TooLarge", "2T"}),
                         SettingName);

[[noreturn]] void CheckDeviceMemory(const char* text, size_t expected_bytes) {
  SetConfig(nullptr, text);
  ChildReport report;
  int count = 0;
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");
  report.Expect(count == OR_DEFAULT_DEVICE_COUNT, "default device count");
  size_t free_bytes = 0, total_bytes = 0;
  report.ExpectOk(orDeviceGetMemoryInfo(0, &free_bytes, &total_bytes), "memory info");
  report.Expect(total_bytes == expected_bytes,
                "total is " + std::to_string(total_bytes));
  // More than the device has fails; exactly all of it works.
  void* ptr = nullptr;
  report.ExpectFails(orMalloc(&ptr, expected_bytes + 1), orErrorMemoryAllocation,
                     {"orMalloc", "OPENREG_DEVICE_MEMORY"}, "orMalloc(size + 1)");
  report.ExpectOk(orMalloc(&ptr, expected_bytes), "orMalloc(everything)");
  void* more = nullptr;
  report.ExpectFails(orMalloc(&more, 1), orErrorMemoryAllocation,
                     {"orMalloc", "out of memory"}, "orMalloc when full");
  report.ExpectOk(orFree(ptr), "orFree");
  report.ExpectOk(orMalloc(&more, 1), "orMalloc after orFree");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, DeviceMemoryWithSuffixLimitsAllocations) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceMemory("1M", 1 << 20));
}

TEST_F(FreshProcessDeathTest, DeviceMemoryMinimumInBytesIsAccepted) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceMemory("65536", 65536));
}

// ----------------------------------------------------------------- fork()

TEST(ForkTest, ChildOfAnInitializedProcessCannotUseDevices) {
  void* parent_memory = nullptr;
  ASSERT_OK(orMalloc(&parent_memory, 64));  // initializes device 0
  const int parent_count = DeviceCount();
  // An event whose work is still queued when the process forks.
  orStream_t busy = nullptr;
  ASSERT_OK(orStreamCreate(&busy));
  Gate gate;
  ASSERT_OK(gate.Block(busy));
  orEvent_t pending_event = nullptr;
  ASSERT_OK(orEventCreate(&pending_event));
  ASSERT_OK(orEventRecord(pending_event, busy));
  const std::string failures = RunInForkedChild([&](ChildReport& report) {
    int count = -1;
    report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");
    report.Expect(count == parent_count, "the child sees the device count");
    void* ptr = nullptr;
    report.ExpectFails(orMalloc(&ptr, 64), orErrorForkedProcess,
                       {"orMalloc", "spawn"}, "orMalloc");
    orStream_t stream = nullptr;
    report.ExpectFails(orStreamCreate(&stream), orErrorForkedProcess,
                       {"orStreamCreate", "spawn"}, "orStreamCreate");
    report.ExpectFails(orDeviceSynchronize(0), orErrorForkedProcess,
                       {"orDeviceSynchronize", "spawn"}, "orDeviceSynchronize");
    report.ExpectFails(orStreamSynchronize(nullptr), orErrorForkedProcess,
                       {"orStreamSynchronize", "spawn"}, "orStreamSynchronize");
    // The parent's event was pending at fork time; its worker is gone here.
    report.ExpectFails(orEventSynchronize(pending_event), orErrorForkedProcess,
                       {"orEventSynchronize", "spawn"}, "orEventSynchronize");
    report.ExpectFails(orEventQuery(pending_event), orErrorForkedProcess,
                       {"orEventQuery", "spawn"}, "orEventQuery");
    std::vector<unsigned char> host(8);
    // The parent's allocations are off limits too.
    report.ExpectFails(orMemcpy(parent_memory, host.data(), 8, orMemcpyHostToDevice),
                       orErrorForkedProcess, {"orMemcpy", "spawn"}, "orMemcpy");
    report.ExpectFails(orFree(parent_memory), orErrorForkedProcess,
                       {"orFree", "spawn"}, "orFree");
    void* pinned = nullptr;
    report.ExpectFails(orMallocHost(&pinned, 64), orErrorForkedProcess,
                       {"orMallocHost", "spawn"}, "orMallocHost");
    report.ExpectOk(orMemcpy(host.data(), host.data() + 4, 4, orMemcpyHostToHost),
                    "host-to-host copies need no device");
    int initialized = -1;
    report.ExpectOk(orDeviceIsInitialized(0, &initialized), "orDeviceIsInitialized");
    report.Expect(initialized == 0, "no device is initialized in the child");
  });
  EXPECT_EQ(failures, "");
  gate.Open();
  EXPECT_OK(orEventSynchronize(pending_event));
  EXPECT_OK(orEventDestroy(pending_event));
  EXPECT_OK(orStreamDestroy(busy));
  // The parent is unaffected.
  const std::vector<unsigned char> data = Pattern(64, 8);
  ASSERT_OK(orMemcpy(parent_memory, data.data(), 64, orMemcpyHostToDevice));
  EXPECT_EQ(ReadDevice(parent_memory, 64), data);
  EXPECT_OK(orFree(parent_memory));
}

[[noreturn]] void CheckForkBeforeInitialization() {
  SetConfig(nullptr, nullptr);
  ChildReport report;
  int count = 0;
  report.ExpectOk(orGetDeviceCount(&count), "orGetDeviceCount");  // config only
  const std::string child = RunInForkedChild([](ChildReport& child_report) {
    void* ptr = nullptr;
    child_report.ExpectOk(orMalloc(&ptr, 64), "orMalloc in the child");
    orStream_t stream = nullptr;
    child_report.ExpectOk(orStreamCreate(&stream), "orStreamCreate in the child");
    const std::vector<unsigned char> sent = Pattern(64, 9);
    std::vector<unsigned char> received(64, 0);
    child_report.ExpectOk(orMemcpyAsync(ptr, sent.data(), 64, orMemcpyHostToDevice,
                                        stream), "H2D");
    child_report.ExpectOk(orMemcpyAsync(received.data(), ptr, 64,
                                        orMemcpyDeviceToHost, stream), "D2H");
    child_report.ExpectOk(orStreamSynchronize(stream), "orStreamSynchronize");
    child_report.Expect(received == sent, "the round trip keeps the data");
    child_report.Expect(IsInitialized(0), "the child initialized device 0");
  });
  report.Expect(child.empty(), "child: " + child);
  // The parent, too, can still initialize its devices.
  void* ptr = nullptr;
  report.ExpectOk(orMalloc(&ptr, 64), "orMalloc in the parent");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ChildForkedBeforeInitializationCanUseDevices) {
  EXPECT_IN_FRESH_PROCESS(CheckForkBeforeInitialization());
}

}  // namespace
}  // namespace openreg_test

// ------------------------------------------------------------ device loss
// Each in a fresh process: a lost device stays lost until the process ends.

namespace openreg_test {
namespace {

int IsLost(int device) {
  int lost = -1;
  orDeviceIsLost(device, &lost);
  return lost;
}

// Device 1 is lost while a kernel of its runs (held by a gate) with more work
// queued behind it, a thread waits for it, and a stream of device 0 waits for
// one of its events.
[[noreturn]] void CheckDeviceLossInTheMiddleOfQueuedWork() {
  SetConfig("2", "64M");
  ChildReport report;
  auto expect_lost = [&](orError_t result, const char* call) {
    report.ExpectFails(result, orErrorDeviceLost, {call, "device 1", "was lost", "the test's cause"},
                       std::string(call) + " on the lost device");
  };
  report.ExpectOk(orSetDevice(1), "orSetDevice(1)");
  void* buffer = nullptr;
  report.ExpectOk(orMalloc(&buffer, 4096), "orMalloc on device 1");
  orStream_t stream = nullptr;
  report.ExpectOk(orStreamCreate(&stream), "orStreamCreate on device 1");
  orEvent_t event = nullptr;
  report.ExpectOk(orEventCreate(&event), "orEventCreate on device 1");
  Gate gate;
  report.ExpectOk(gate.Block(stream), "a gate on device 1");
  std::atomic<bool> queued_ran{false};
  report.ExpectOk(LaunchFn(stream, [&] { queued_ran = true; return orSuccess; }),
                  "a kernel queued behind the gate");
  report.ExpectOk(orEventRecord(event, stream), "orEventRecord behind the gate");
  // Device 0 waits for device 1's event.
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  orStream_t consumer = nullptr;
  report.ExpectOk(orStreamCreate(&consumer), "orStreamCreate on device 0");
  report.ExpectOk(orStreamWaitEvent(consumer, event), "device 0 waits for device 1's event");
  std::atomic<bool> consumer_ran{false};
  report.ExpectOk(LaunchFn(consumer, [&] { consumer_ran = true; return orSuccess; }),
                  "a kernel of device 0 behind the wait");
  auto waiter = std::async(std::launch::async, [&] { return CaptureCall([&] { return orStreamSynchronize(stream); }); });
  report.Expect(IsLost(1) == 0 && IsLost(0) == 0, "no device is lost before the fault");

  report.ExpectOk(orDeviceInjectFault(1, "the test's cause"), "orDeviceInjectFault(1)");
  report.Expect(IsLost(1) == 1 && IsLost(0) == 0, "orDeviceIsLost tells device 1 only");
  // The waiter wakes although the gate still holds the running kernel.
  const bool woke = waiter.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  report.Expect(woke, "a thread waiting for the lost device's stream woke (the kernel still runs)");
  if (woke) {
    report.Expect(static_cast<bool>(FailedWith(waiter.get(), orErrorDeviceLost, {"orStreamSynchronize", "device 1", "the test's cause"})),
                  "the waiter's orStreamSynchronize failed with orErrorDeviceLost naming the device and cause");
  }
  // Device 0 goes on: its wait for the lost device's event ends.
  report.ExpectOk(orStreamSynchronize(consumer), "orStreamSynchronize of device 0's stream");
  report.Expect(consumer_ran.load(), "device 0's kernel behind the wait ran");

  // Every call on device 1 fails, naming the device and the cause.
  int zero = 0;
  report.ExpectOk(orSetDevice(1), "orSetDevice(1) on a lost device");
  void* more = nullptr;
  expect_lost(orMalloc(&more, 64), "orMalloc");
  expect_lost(orStreamQuery(stream), "orStreamQuery");
  expect_lost(orStreamSynchronize(stream), "orStreamSynchronize");
  expect_lost(orStreamSynchronize(nullptr), "orStreamSynchronize");
  expect_lost(LaunchFn(stream, [] { return orSuccess; }), "orLaunchKernel");
  expect_lost(orLaunchKernelSync(stream, [](void*) { return orSuccess; }, nullptr), "orLaunchKernelSync");
  expect_lost(orMemcpy(&zero, buffer, sizeof zero, orMemcpyDeviceToHost), "orMemcpy");
  expect_lost(orMemsetAsync(buffer, 0, 16, nullptr), "orMemsetAsync");
  expect_lost(orEventQuery(event), "orEventQuery");
  expect_lost(orEventSynchronize(event), "orEventSynchronize");
  expect_lost(orEventRecord(event, stream), "orEventRecord");
  expect_lost(orStreamWaitEvent(consumer, event), "orStreamWaitEvent");
  expect_lost(orDeviceSynchronize(1), "orDeviceSynchronize");
  size_t free_bytes = 0, total_bytes = 0;
  expect_lost(orDeviceGetMemoryInfo(1, &free_bytes, &total_bytes), "orDeviceGetMemoryInfo");
  orStream_t another = nullptr;
  expect_lost(orStreamCreate(&another), "orStreamCreate");
  orEvent_t another_event = nullptr;
  expect_lost(orEventCreate(&another_event), "orEventCreate");
  orStream_t default_stream = nullptr;
  expect_lost(orStreamGetDefault(1, &default_stream), "orStreamGetDefault");
  // A second fault keeps the first cause.
  report.ExpectOk(orDeviceInjectFault(1, "another cause"), "orDeviceInjectFault(1) again");
  expect_lost(orDeviceSynchronize(1), "orDeviceSynchronize");

  // Handles can still be described and released.
  int device = -1, priority = 1;
  report.ExpectOk(orStreamGetDevice(stream, &device), "orStreamGetDevice");
  report.Expect(device == 1, "orStreamGetDevice says 1");
  report.ExpectOk(orStreamGetPriority(stream, &priority), "orStreamGetPriority");
  report.ExpectOk(orEventGetDevice(event, &device), "orEventGetDevice");
  orPointerAttributes attributes{};
  report.ExpectOk(orPointerGetAttributes(&attributes, buffer), "orPointerGetAttributes");
  report.ExpectOk(orFree(buffer), "orFree of the lost device's memory");
  report.ExpectOk(orEventDestroy(event), "orEventDestroy");
  gate.Open();  // the running kernel ends; what was queued behind it retires unrun
  report.ExpectOk(orStreamDestroy(stream), "orStreamDestroy");
  report.Expect(!queued_ran.load(), "work queued on the lost device never ran");

  // Device 0 works.
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  void* alive = nullptr;
  report.ExpectOk(orMalloc(&alive, 4096), "orMalloc on device 0");
  const int value = 42;
  int back = 0;
  report.ExpectOk(orMemcpy(alive, &value, sizeof value, orMemcpyHostToDevice), "orMemcpy H2D on device 0");
  report.ExpectOk(orMemcpy(&back, alive, sizeof back, orMemcpyDeviceToHost), "orMemcpy D2H on device 0");
  report.Expect(back == 42, "device 0's memory holds what was written");
  report.ExpectOk(orDeviceGetMemoryInfo(0, &free_bytes, &total_bytes), "orDeviceGetMemoryInfo(0)");
  report.ExpectOk(orDeviceSynchronize(0), "orDeviceSynchronize(0)");
  report.ExpectOk(orStreamDestroy(consumer), "orStreamDestroy on device 0");
  report.ExpectOk(orFree(alive), "orFree on device 0");
  report.Finish();
}

[[noreturn]] void CheckDeviceLossOfAnUnusedDevice() {
  SetConfig("2", "64M");
  ChildReport report;
  report.ExpectOk(orDeviceInjectFault(1, nullptr), "orDeviceInjectFault of an uninitialized device");
  report.ExpectFails(orDeviceInit(1), orErrorDeviceLost,
                     {"orDeviceInit", "device 1", "a fault injected by orDeviceInjectFault"},
                     "orDeviceInit of the lost device");
  report.ExpectFails(orDeviceInjectFault(2, nullptr), orErrorInvalidDevice,
                     {"orDeviceInjectFault", "device=2", "[0, 2)"}, "orDeviceInjectFault(2)");
  int lost = 0;
  report.ExpectFails(orDeviceIsLost(5, &lost), orErrorInvalidDevice, {"orDeviceIsLost", "device=5"},
                     "orDeviceIsLost(5)");
  report.ExpectFails(orDeviceIsLost(0, nullptr), orErrorInvalidValue, {"orDeviceIsLost", "lost"},
                     "orDeviceIsLost with a null result");
  report.Expect(IsLost(0) == 0, "device 0 is not lost");
  report.ExpectOk(orDeviceInit(0), "orDeviceInit(0)");
  // Kernels may not lose devices.
  orStream_t stream = nullptr;
  report.ExpectOk(orStreamGetDefault(0, &stream), "orStreamGetDefault(0)");
  report.ExpectFails(orLaunchKernelSync(stream, [](void*) { return orDeviceInjectFault(0, "from a kernel"); }, nullptr),
                     orErrorKernelFailed, {"kernels may not lose devices"}, "orDeviceInjectFault from a kernel");
  report.Expect(IsLost(0) == 0, "device 0 is still not lost");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, DeviceLossInTheMiddleOfQueuedWorkFailsOnlyThatDevice) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceLossInTheMiddleOfQueuedWork());
}

TEST_F(FreshProcessDeathTest, DeviceLossOfAnUnusedDeviceAndBadArguments) {
  EXPECT_IN_FRESH_PROCESS(CheckDeviceLossOfAnUnusedDevice());
}

}  // namespace
}  // namespace openreg_test
