// Streams and kernels: creation, priorities, default streams, destruction,
// query/synchronize, launch order, kernels mapping device memory, sticky kernel
// failures, cross-stream ordering with orStreamWaitEvent, and a stress test of
// many threads using the runtime at once.
#include "test_helpers.h"

#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace openreg_test {
namespace {

using namespace std::chrono_literals;

orStream_t NewStream(int priority = 0) {
  orStream_t stream = nullptr;
  const orError_t result = orStreamCreateWithPriority(&stream, priority);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return stream;
}

orStream_t DestroyedStream() {
  orStream_t stream = NewStream();
  const orError_t result = orStreamDestroy(stream);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return stream;
}

// An address that was never a stream: the runtime must not dereference it.
orStream_t UnknownStream() {
  static int not_a_stream = 0;
  return reinterpret_cast<orStream_t>(&not_a_stream);
}

// Writes `value` into device memory from a kernel on `stream`.
orError_t StoreFromKernel(orStream_t stream, void* device_ptr, int value) {
  return LaunchFn(stream, [device_ptr, value] {
    void* alias = nullptr;
    if (orError_t e = orKernelMapPointer(device_ptr, sizeof(int), &alias)) return e;
    *static_cast<int*>(alias) = value;
    return orSuccess;
  });
}

int ReadInt(const void* device_ptr) {
  int value = 0;
  const orError_t result =
      orMemcpy(&value, device_ptr, sizeof(int), orMemcpyDeviceToHost);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return value;
}

// ------------------------------------------------------------------ create

class StreamCreateTest : public RuntimeTest {};

TEST_F(StreamCreateTest, RejectsNullOutput) {
  EXPECT_FAILS(orStreamCreate(nullptr), orErrorInvalidValue, "orStreamCreate:",
               "stream");
  EXPECT_FAILS(orStreamCreateWithPriority(nullptr, 0), orErrorInvalidValue,
               "orStreamCreateWithPriority", "stream");
}

TEST_F(StreamCreateTest, BelongsToTheCurrentDeviceWithTheDefaultPriority) {
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    ASSERT_OK(orSetDevice(device));
    orStream_t stream = nullptr;
    ASSERT_OK(orStreamCreate(&stream));
    ASSERT_NE(stream, nullptr);
    int stream_device = -1, priority = 7;
    EXPECT_OK(orStreamGetDevice(stream, &stream_device));
    EXPECT_OK(orStreamGetPriority(stream, &priority));
    EXPECT_EQ(stream_device, device);
    EXPECT_EQ(priority, 0);
    EXPECT_EQ(orStreamQuery(stream), orSuccess);
    EXPECT_OK(orStreamDestroy(stream));
  }
}

TEST_F(StreamCreateTest, AcceptsEveryPriorityInTheRange) {
  int least = 0, greatest = 0;
  ASSERT_OK(orDeviceGetStreamPriorityRange(&least, &greatest));
  for (int priority = greatest; priority <= least; ++priority) {
    orStream_t stream = nullptr;
    ASSERT_OK(orStreamCreateWithPriority(&stream, priority));
    int reported = 99;
    EXPECT_OK(orStreamGetPriority(stream, &reported));
    EXPECT_EQ(reported, priority);
    EXPECT_OK(orStreamDestroy(stream));
  }
}

TEST_F(StreamCreateTest, RejectsPrioritiesOutsideTheRange) {
  for (int bad : {1, -2, INT_MAX, INT_MIN}) {
    orStream_t stream = nullptr;
    EXPECT_FAILS(orStreamCreateWithPriority(&stream, bad), orErrorInvalidValue,
                 "orStreamCreateWithPriority", "priority=" + std::to_string(bad),
                 "[-1, 0]");
    EXPECT_EQ(stream, nullptr);
  }
}

TEST_F(StreamCreateTest, StreamsRunIndependently) {
  orStream_t blocked = NewStream(), free_stream = NewStream(-1);
  Gate gate;
  ASSERT_OK(gate.Block(blocked));
  std::atomic<bool> ran{false};
  ASSERT_OK(LaunchFn(free_stream, [&ran] {
    ran.store(true);
    return orSuccess;
  }));
  auto sync = std::async(std::launch::async,
                         [&] { return orStreamSynchronize(free_stream); });
  const bool finished = sync.wait_for(5s) == std::future_status::ready;
  EXPECT_EQ(orStreamQuery(blocked), orErrorNotReady);
  gate.Open();
  EXPECT_TRUE(finished) << "one stream waited for another";
  EXPECT_EQ(sync.get(), orSuccess);
  EXPECT_TRUE(ran.load());
  EXPECT_OK(orStreamDestroy(blocked));
  EXPECT_OK(orStreamDestroy(free_stream));
}

// ----------------------------------------------------------------- destroy

class StreamDestroyTest : public RuntimeTest {};

TEST_F(StreamDestroyTest, RejectsNullAndDefaultStreams) {
  EXPECT_FAILS(orStreamDestroy(nullptr), orErrorInvalidHandle, "orStreamDestroy",
               "stream", "default");
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    orStream_t default_stream = nullptr;
    ASSERT_OK(orStreamGetDefault(device, &default_stream));
    EXPECT_FAILS(orStreamDestroy(default_stream), orErrorNotPermitted,
                 "orStreamDestroy", "default stream",
                 "device " + std::to_string(device));
    // Still alive and working.
    std::atomic<bool> ran{false};
    ASSERT_OK(LaunchFn(default_stream, [&ran] {
      ran.store(true);
      return orSuccess;
    }));
    EXPECT_OK(orStreamSynchronize(default_stream));
    EXPECT_TRUE(ran.load());
  }
}

TEST_F(StreamDestroyTest, RejectsDestroyedAndUnknownHandles) {
  orStream_t destroyed = DestroyedStream();
  EXPECT_FAILS(orStreamDestroy(destroyed), orErrorInvalidHandle, "orStreamDestroy",
               "stream=");
  EXPECT_FAILS(orStreamDestroy(UnknownStream()), orErrorInvalidHandle,
               "orStreamDestroy", "stream=");
}

TEST_F(StreamDestroyTest, FinishesQueuedWorkFirst) {
  orStream_t stream = NewStream();
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(LaunchFn(stream, [&ran] {
      ran.fetch_add(1);
      return orSuccess;
    }));
  }
  // Opening later makes a destroy that drops or skips work visible.
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    gate.Open();
  });
  EXPECT_OK(orStreamDestroy(stream));
  EXPECT_EQ(ran.load(), 3);
  opener.join();
}

TEST_F(StreamDestroyTest, DestroyedHandlesAreRejectedByEveryStreamCall) {
  orStream_t destroyed = DestroyedStream();
  int value = 0;
  orEvent_t event = nullptr;
  ASSERT_OK(orEventCreate(&event));
  EXPECT_FAILS(orStreamQuery(destroyed), orErrorInvalidHandle, "orStreamQuery",
               "stream=");
  EXPECT_FAILS(orStreamSynchronize(destroyed), orErrorInvalidHandle,
               "orStreamSynchronize", "stream=");
  EXPECT_FAILS(orStreamGetDevice(destroyed, &value), orErrorInvalidHandle,
               "orStreamGetDevice", "stream=");
  EXPECT_FAILS(orStreamGetPriority(destroyed, &value), orErrorInvalidHandle,
               "orStreamGetPriority", "stream=");
  EXPECT_FAILS(orLaunchKernel(destroyed, [](void*) { return orSuccess; }, nullptr),
               orErrorInvalidHandle, "orLaunchKernel", "stream=");
  EXPECT_FAILS(orStreamWaitEvent(destroyed, event), orErrorInvalidHandle,
               "orStreamWaitEvent", "stream=");
  EXPECT_FAILS(orEventRecord(event, destroyed), orErrorInvalidHandle,
               "orEventRecord", "stream=");
  EXPECT_EQ(orEventQuery(event), orSuccess);  // the failed record left it unrecorded
  EXPECT_OK(orEventDestroy(event));
}

// ------------------------------------------------------- default / getters

class DefaultStreamTest : public RuntimeTest {};

TEST_F(DefaultStreamTest, RejectsNullOutputAndBadDevices) {
  EXPECT_FAILS(orStreamGetDefault(0, nullptr), orErrorInvalidValue,
               "orStreamGetDefault", "stream");
  for (int bad : InvalidDeviceIndexes()) {
    orStream_t stream = nullptr;
    EXPECT_FAILS(orStreamGetDefault(bad, &stream), orErrorInvalidDevice,
                 "orStreamGetDefault", DeviceArg(bad), ValidDeviceRange());
  }
}

TEST_F(DefaultStreamTest, IsOnePerDeviceAndStable) {
  std::vector<orStream_t> defaults;
  for (int device = 0; device < DeviceCount() && device < 3; ++device) {
    orStream_t first = nullptr, second = nullptr;
    ASSERT_OK(orStreamGetDefault(device, &first));
    ASSERT_OK(orStreamGetDefault(device, &second));
    EXPECT_EQ(first, second);
    int stream_device = -1, priority = 7;
    EXPECT_OK(orStreamGetDevice(first, &stream_device));
    EXPECT_OK(orStreamGetPriority(first, &priority));
    EXPECT_EQ(stream_device, device);
    EXPECT_EQ(priority, 0);
    for (orStream_t other : defaults) EXPECT_NE(other, first);
    defaults.push_back(first);
  }
  // Another thread sees the same default streams.
  orStream_t from_thread = nullptr;
  std::thread([&] { orStreamGetDefault(0, &from_thread); }).join();
  EXPECT_EQ(from_thread, defaults[0]);
}

TEST_F(DefaultStreamTest, NullStreamMeansTheCurrentDevicesDefault) {
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    ASSERT_OK(orSetDevice(device));
    int stream_device = -1, priority = 7;
    EXPECT_OK(orStreamGetDevice(nullptr, &stream_device));
    EXPECT_OK(orStreamGetPriority(nullptr, &priority));
    EXPECT_EQ(stream_device, device);
    EXPECT_EQ(priority, 0);
    std::atomic<int> ran_on{-2};
    ASSERT_OK(LaunchFn(nullptr, [&ran_on] {
      ran_on.store(orKernelCurrentDevice());
      return orSuccess;
    }));
    orStream_t default_stream = nullptr;
    ASSERT_OK(orStreamGetDefault(device, &default_stream));
    EXPECT_OK(orStreamSynchronize(default_stream));
    EXPECT_EQ(ran_on.load(), device);
    EXPECT_EQ(orStreamQuery(nullptr), orSuccess);
  }
}

TEST(StreamGettersTest, RejectNullOutputsAndUnknownHandles) {
  orStream_t stream = NewStream();
  EXPECT_FAILS(orStreamGetDevice(stream, nullptr), orErrorInvalidValue,
               "orStreamGetDevice", "device");
  EXPECT_FAILS(orStreamGetPriority(stream, nullptr), orErrorInvalidValue,
               "orStreamGetPriority", "priority");
  int value = 0;
  EXPECT_FAILS(orStreamGetDevice(UnknownStream(), &value), orErrorInvalidHandle,
               "orStreamGetDevice", "stream=");
  EXPECT_FAILS(orStreamGetPriority(UnknownStream(), &value), orErrorInvalidHandle,
               "orStreamGetPriority", "stream=");
  EXPECT_OK(orStreamDestroy(stream));
}

// ------------------------------------------------------ query / synchronize

TEST(StreamQueryTest, ReportsPendingWorkUntilItCompletes) {
  orStream_t stream = NewStream();
  EXPECT_EQ(orStreamQuery(stream), orSuccess);
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  EXPECT_EQ(orStreamQuery(stream), orErrorNotReady);
  EXPECT_EQ(orStreamQuery(stream), orErrorNotReady);
  gate.Open();
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(orStreamQuery(stream), orSuccess);
  EXPECT_FAILS(orStreamQuery(UnknownStream()), orErrorInvalidHandle, "orStreamQuery",
               "stream=");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(StreamSynchronizeTest, WaitsForEveryLaunchedKernel) {
  orStream_t stream = NewStream();
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(LaunchFn(stream, [&ran] {
      ran.fetch_add(1);
      return orSuccess;
    }));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    gate.Open();
  });
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(ran.load(), 20);
  opener.join();
  EXPECT_FAILS(orStreamSynchronize(UnknownStream()), orErrorInvalidHandle,
               "orStreamSynchronize", "stream=");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(StreamSynchronizeTest, IsNotPermittedInsideAKernel) {
  orStream_t stream = NewStream(), other = NewStream();
  CallOutcome on_other{}, on_default{};
  ASSERT_OK(LaunchFn(stream, [&] {
    on_other = CaptureCall([&] { return orStreamSynchronize(other); });
    on_default = CaptureCall([] { return orStreamSynchronize(nullptr); });
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(stream));  // the kernel itself succeeded
  EXPECT_TRUE(FailedWith(on_other, orErrorNotPermitted,
                         {"orStreamSynchronize", "kernels"}));
  EXPECT_TRUE(FailedWith(on_default, orErrorNotPermitted,
                         {"orStreamSynchronize", "kernels"}));
  EXPECT_OK(orStreamDestroy(stream));
  EXPECT_OK(orStreamDestroy(other));
}

// ------------------------------------------------------------------ kernels

TEST(LaunchKernelTest, RejectsNullFunction) {
  orDebugCounters before{}, after{};
  orGetDebugCounters(&before);
  EXPECT_FAILS(orLaunchKernel(nullptr, nullptr, nullptr), orErrorInvalidValue,
               "orLaunchKernel", "fn");
  orGetDebugCounters(&after);
  EXPECT_EQ(after.kernels_launched, before.kernels_launched);
}

struct KernelProbe {
  int argument = 0;
  std::thread::id thread;
  int device = -2;
};

orError_t ProbeKernel(void* arg) {
  auto* probe = static_cast<KernelProbe*>(arg);
  probe->argument += 1;
  probe->thread = std::this_thread::get_id();
  probe->device = orKernelCurrentDevice();
  return orSuccess;
}

TEST(LaunchKernelTest, RunsTheFunctionWithItsArgumentOnTheStreamsThread) {
  orStream_t stream = NewStream();
  KernelProbe first{41}, second{41};
  ASSERT_OK(orLaunchKernel(stream, ProbeKernel, &first));
  ASSERT_OK(orLaunchKernel(stream, ProbeKernel, &second));
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(first.argument, 42);
  EXPECT_EQ(second.argument, 42);
  EXPECT_NE(first.thread, std::this_thread::get_id());
  EXPECT_EQ(first.thread, second.thread);  // one worker per stream
  EXPECT_EQ(first.device, 0);
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelTest, WorkRunsInLaunchOrder) {
  orStream_t stream = NewStream();
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, sizeof(int)));
  std::vector<int> order;  // only the stream's worker touches it until sync
  Gate gate;
  ASSERT_OK(gate.Block(stream));  // everything below is queued before it runs
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(LaunchFn(stream, [&order, i] {
      order.push_back(i);
      return orSuccess;
    }));
  }
  // Kernels, copies and memsets interleave in order too.
  int observed_after_memset = -1, observed_after_store = -1;
  const int seven = 7;
  ASSERT_OK(orMemcpyAsync(device_ptr, &seven, sizeof(int), orMemcpyHostToDevice, stream));
  ASSERT_OK(orMemsetAsync(device_ptr, 0, sizeof(int), stream));
  ASSERT_OK(orMemcpyAsync(&observed_after_memset, device_ptr, sizeof(int),
                          orMemcpyDeviceToHost, stream));
  ASSERT_OK(StoreFromKernel(stream, device_ptr, 99));
  ASSERT_OK(orMemcpyAsync(&observed_after_store, device_ptr, sizeof(int),
                          orMemcpyDeviceToHost, stream));
  gate.Open();
  ASSERT_OK(orStreamSynchronize(stream));
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(observed_after_memset, 0);
  EXPECT_EQ(observed_after_store, 99);
  EXPECT_OK(orFree(device_ptr));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelTest, KernelsOfDifferentStreamsRunConcurrently) {
  orStream_t a = NewStream(), b = NewStream();
  std::promise<void> b_started;
  std::shared_future<void> b_started_future = b_started.get_future().share();
  // `a` waits for a kernel of `b`: serialized streams would time out here.
  ASSERT_OK(LaunchFn(a, [b_started_future] {
    return b_started_future.wait_for(5s) == std::future_status::ready
               ? orSuccess
               : orErrorNotReady;
  }));
  ASSERT_OK(LaunchFn(b, [&b_started] {
    b_started.set_value();
    return orSuccess;
  }));
  EXPECT_OK(orStreamSynchronize(a));
  EXPECT_OK(orStreamSynchronize(b));
  EXPECT_OK(orStreamDestroy(a));
  EXPECT_OK(orStreamDestroy(b));
}

// ------------------------------------------------------- kernel device access

class KernelMapPointerTest : public RuntimeTest {};

TEST_F(KernelMapPointerTest, HostCallsAreNotPermitted) {
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, 64));
  void* accessible = &device_ptr;
  EXPECT_FAILS(orKernelMapPointer(device_ptr, 64, &accessible), orErrorNotPermitted,
               "orKernelMapPointer", "only kernels", "orMemcpy");
  EXPECT_EQ(accessible, nullptr);
  EXPECT_FAILS(orKernelMapPointer(device_ptr, 64, nullptr), orErrorInvalidValue,
               "orKernelMapPointer", "accessible");
  EXPECT_OK(orFree(device_ptr));
}

TEST_F(KernelMapPointerTest, GivesKernelsReadWriteAccessToTheirDevicesMemory) {
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, 1000));
  const std::vector<unsigned char> data = Pattern(1000, 17);
  ASSERT_OK(orMemcpy(device_ptr, data.data(), 1000, orMemcpyHostToDevice));
  bool read_ok = false;
  ASSERT_OK(LaunchFn(nullptr, [&, device_ptr] {
    void* alias = nullptr;
    // An interior range reaching the exact end is fine.
    char* interior = static_cast<char*>(device_ptr) + 500;
    if (orError_t e = orKernelMapPointer(interior, 500, &alias)) return e;
    auto* bytes = static_cast<unsigned char*>(alias);
    read_ok = std::equal(data.begin() + 500, data.end(), bytes);
    for (int i = 0; i < 500; ++i) bytes[i] = static_cast<unsigned char>(255 - bytes[i]);
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_TRUE(read_ok);
  std::vector<unsigned char> expected = data;
  for (int i = 500; i < 1000; ++i) expected[i] = static_cast<unsigned char>(255 - data[i]);
  EXPECT_EQ(ReadDevice(device_ptr, 1000), expected);
  EXPECT_OK(orFree(device_ptr));
}

TEST_F(KernelMapPointerTest, RejectsBadPointersAndRangesInsideKernels) {
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, 100));
  void* freed = nullptr;
  ASSERT_OK(orMalloc(&freed, 64));
  ASSERT_OK(orFree(freed));
  int host_value = 0;
  CallOutcome null_output{}, host{}, freed_memory{}, past_end{}, crossing{};
  void* left_alone = &host_value;
  ASSERT_OK(LaunchFn(nullptr, [&] {
    null_output = CaptureCall([&] { return orKernelMapPointer(device_ptr, 4, nullptr); });
    host = CaptureCall([&] { return orKernelMapPointer(&host_value, 4, &left_alone); });
    freed_memory = CaptureCall([&] {
      void* alias = nullptr;
      return orKernelMapPointer(freed, 4, &alias);
    });
    past_end = CaptureCall([&] {
      void* alias = nullptr;
      return orKernelMapPointer(device_ptr, 101, &alias);
    });
    crossing = CaptureCall([&] {
      void* alias = nullptr;
      return orKernelMapPointer(static_cast<char*>(device_ptr) + 96, 8, &alias);
    });
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_TRUE(FailedWith(null_output, orErrorInvalidValue,
                         {"orKernelMapPointer", "accessible"}));
  EXPECT_TRUE(FailedWith(host, orErrorInvalidPointer,
                         {"orKernelMapPointer", "device_ptr="}));
  EXPECT_EQ(left_alone, nullptr);
  EXPECT_TRUE(FailedWith(freed_memory, orErrorInvalidPointer,
                         {"orKernelMapPointer", "live allocation"}));
  EXPECT_TRUE(FailedWith(past_end, orErrorInvalidPointer,
                         {"orKernelMapPointer", "+101 bytes", "device 0"}));
  EXPECT_TRUE(FailedWith(crossing, orErrorInvalidPointer,
                         {"orKernelMapPointer", "+8 bytes"}));
  EXPECT_OK(orFree(device_ptr));
}

TEST_F(KernelMapPointerTest, MarkWrittenChecksItsRangeAndKeepsTheKernelsWrites) {
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, 100));
  int host_value = 0;
  CallOutcome whole{}, empty{}, past_end{}, host{}, null_range{};
  ASSERT_OK(LaunchFn(nullptr, [&] {
    void* alias = nullptr;
    if (orError_t e = orKernelMapPointer(device_ptr, 100, &alias)) return e;
    std::memset(alias, 0x3c, 100);
    whole = CaptureCall([&] { return orKernelMarkWritten(alias, 100); });
    empty = CaptureCall([&] { return orKernelMarkWritten(alias, 0); });
    past_end = CaptureCall([&] { return orKernelMarkWritten(static_cast<char*>(alias) + 50, 51); });
    host = CaptureCall([&] { return orKernelMarkWritten(&host_value, 4); });
    null_range = CaptureCall([&] { return orKernelMarkWritten(nullptr, 4); });
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_EQ(whole.code, orSuccess) << whole.message;
  EXPECT_EQ(empty.code, orSuccess) << empty.message;
  EXPECT_TRUE(FailedWith(past_end, orErrorInvalidPointer, {"orKernelMarkWritten", "+51 bytes", "device 0"}));
  EXPECT_TRUE(FailedWith(host, orErrorInvalidPointer, {"orKernelMarkWritten", "mapped by this kernel"}));
  EXPECT_TRUE(FailedWith(null_range, orErrorInvalidValue, {"orKernelMarkWritten", "accessible"}));
  EXPECT_EQ(ReadDevice(device_ptr, 100), std::vector<unsigned char>(100, 0x3c));
  EXPECT_FAILS(orKernelMarkWritten(&host_value, 4), orErrorNotPermitted, "orKernelMarkWritten", "only kernels");
  EXPECT_OK(orFree(device_ptr));
}

TEST_F(KernelMapPointerTest, RejectsMemoryOfAnotherDevice) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  void* on_one = nullptr;
  ASSERT_OK(orMalloc(&on_one, 64));
  ASSERT_OK(orSetDevice(0));
  CallOutcome outcome{};
  ASSERT_OK(LaunchFn(nullptr, [&] {
    outcome = CaptureCall([&] {
      void* alias = nullptr;
      return orKernelMapPointer(on_one, 64, &alias);
    });
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_TRUE(FailedWith(outcome, orErrorDeviceMismatch,
                         {"orKernelMapPointer", "device 0", "device 1"}));
  EXPECT_OK(orFree(on_one));
}

TEST(KernelCurrentDeviceTest, IsMinusOneOnTheHostAndTheStreamsDeviceInKernels) {
  EXPECT_EQ(orKernelCurrentDevice(), -1);
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    orStream_t stream = nullptr;
    ASSERT_OK(orStreamGetDefault(device, &stream));
    std::atomic<int> seen{-2};
    // Launched while device 0 is current: the stream decides, not the host.
    ASSERT_OK(LaunchFn(stream, [&seen] {
      seen.store(orKernelCurrentDevice());
      return orSuccess;
    }));
    ASSERT_OK(orStreamSynchronize(stream));
    EXPECT_EQ(seen.load(), device);
  }
  EXPECT_EQ(orKernelCurrentDevice(), -1);
}

// ---------------------------------------------------------- kernel failures

TEST(KernelFailureTest, IsReportedOnceBySynchronizeWithTheKernelsMessage) {
  orStream_t stream = NewStream();
  ASSERT_OK(LaunchFn(stream, [] {
    orKernelSetError("widget 7 jammed");
    return orErrorInvalidValue;
  }));
  std::atomic<bool> later_ran{false};
  ASSERT_OK(LaunchFn(stream, [&later_ran] {
    later_ran.store(true);
    return orSuccess;
  }));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "device 0", "widget 7 jammed");
  EXPECT_TRUE(later_ran.load()) << "work after a failed kernel still runs";
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(orStreamQuery(stream), orSuccess);
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, IsReportedOnceByQuery) {
  orStream_t stream = NewStream();
  ASSERT_OK(LaunchFn(stream, [] {
    orKernelSetError("checksum mismatch");
    return orErrorInvalidValue;
  }));
  orEvent_t done = nullptr;
  ASSERT_OK(orEventCreate(&done));
  ASSERT_OK(orEventRecord(done, stream));
  ASSERT_OK(orEventSynchronize(done));  // waits without consuming the error
  EXPECT_FAILS(orStreamQuery(stream), orErrorKernelFailed, "orStreamQuery",
               "checksum mismatch");
  EXPECT_EQ(orStreamQuery(stream), orSuccess);
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_OK(orEventDestroy(done));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, KeepsTheFirstFailureUntilReported) {
  orStream_t stream = NewStream();
  for (const char* message : {"first failure", "second failure"}) {
    ASSERT_OK(LaunchFn(stream, [message] {
      orKernelSetError(message);
      return orErrorInvalidValue;
    }));
  }
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "first failure");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, FailingRuntimeCallExplainsAKernelWithoutMessage) {
  orStream_t stream = NewStream();
  int host_value = 0;
  ASSERT_OK(LaunchFn(stream, [&host_value] {
    void* alias = nullptr;
    return orKernelMapPointer(&host_value, sizeof(int), &alias);
  }));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "orKernelMapPointer", "device_ptr=");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, ErrorCodeAloneIsNamed) {
  orStream_t stream = NewStream();
  ASSERT_OK(LaunchFn(stream, [] { return orErrorInvalidDevice; }));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "orErrorInvalidDevice");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, ExceptionsBecomeKernelFailures) {
  orStream_t stream = NewStream();
  ASSERT_OK(LaunchFn(stream, []() -> orError_t {
    throw std::runtime_error("shape [3, 4] is not broadcastable");
  }));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "shape [3, 4] is not broadcastable");
  ASSERT_OK(LaunchFn(stream, []() -> orError_t { throw 42; }));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorKernelFailed,
               "orStreamSynchronize", "unknown exception");
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelFailureTest, StaysOnTheStreamThatFailed) {
  orStream_t failing = NewStream(), healthy = NewStream();
  ASSERT_OK(LaunchFn(failing, [] { return orErrorInvalidValue; }));
  ASSERT_OK(LaunchFn(healthy, [] { return orSuccess; }));
  EXPECT_OK(orStreamSynchronize(healthy));
  EXPECT_EQ(orStreamSynchronize(failing), orErrorKernelFailed);
  EXPECT_OK(orStreamDestroy(failing));
  EXPECT_OK(orStreamDestroy(healthy));
}

TEST(KernelFailureTest, MessageWithoutAnErrorCodeIsNotAFailure) {
  orStream_t stream = NewStream();
  ASSERT_OK(LaunchFn(stream, [] {
    orKernelSetError("just a note");
    return orSuccess;
  }));
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(KernelSetErrorTest, IsIgnoredOutsideKernels) {
  StampLastError();
  const std::string before = orGetLastErrorMessage();
  orKernelSetError("from the host");
  orKernelSetError(nullptr);
  EXPECT_EQ(before, orGetLastErrorMessage());
  EXPECT_EQ(orStreamQuery(nullptr), orSuccess);
}

// ---------------------------------------------------- synchronous launches

TEST(LaunchKernelSyncTest, RejectsNullFunctionAndUnknownStreams) {
  orDebugCounters before{}, after{};
  orGetDebugCounters(&before);
  EXPECT_FAILS(orLaunchKernelSync(nullptr, nullptr, nullptr), orErrorInvalidValue,
               "orLaunchKernelSync", "fn");
  int unknown = 0;
  EXPECT_FAILS(orLaunchKernelSync(reinterpret_cast<orStream_t>(&unknown), ProbeKernel,
                                  nullptr),
               orErrorInvalidHandle, "orLaunchKernelSync", "stream");
  orGetDebugCounters(&after);
  EXPECT_EQ(after.kernels_launched, before.kernels_launched);
}

TEST(LaunchKernelSyncTest, RunsOnTheCallingThreadAsAKernelWhenTheStreamIsIdle) {
  orStream_t stream = NewStream();
  ASSERT_OK(orStreamSynchronize(stream));
  KernelProbe probe{41};
  ASSERT_OK(orLaunchKernelSync(stream, ProbeKernel, &probe));
  EXPECT_EQ(probe.argument, 42);  // done on return
  EXPECT_EQ(probe.thread, std::this_thread::get_id());
  EXPECT_EQ(probe.device, 0);
  EXPECT_EQ(orKernelCurrentDevice(), -1);  // the host thread again afterwards
  EXPECT_EQ(orStreamQuery(stream), orSuccess);
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelSyncTest, InlineKernelsMapOnlyTheirDevicesMemory) {
  REQUIRE_DEVICES(2);
  void* mine = nullptr;
  void* other = nullptr;
  ASSERT_OK(orSetDevice(1));
  ASSERT_OK(orMalloc(&other, sizeof(int)));
  ASSERT_OK(orSetDevice(0));
  ASSERT_OK(orMalloc(&mine, sizeof(int)));
  struct Args {
    void* mine;
    void* other;
    orError_t other_result;
  } args{mine, other, orSuccess};
  ASSERT_OK(orLaunchKernelSync(nullptr, [](void* arg) -> orError_t {
    auto* a = static_cast<Args*>(arg);
    void* accessible = nullptr;
    if (orError_t e = orKernelMapPointer(a->mine, sizeof(int), &accessible)) return e;
    *static_cast<int*>(accessible) = 1234;
    a->other_result = orKernelMapPointer(a->other, sizeof(int), &accessible);
    return orSuccess;
  }, &args));
  EXPECT_EQ(args.other_result, orErrorDeviceMismatch);
  int value = 0;
  ASSERT_OK(orMemcpy(&value, mine, sizeof(int), orMemcpyDeviceToHost));
  EXPECT_EQ(value, 1234);
  // Back on the host, device memory is out of reach again.
  void* accessible = nullptr;
  EXPECT_FAILS(orKernelMapPointer(mine, sizeof(int), &accessible), orErrorNotPermitted,
               "orKernelMapPointer");
  EXPECT_OK(orFree(mine));
  ASSERT_OK(orSetDevice(1));
  EXPECT_OK(orFree(other));
  ASSERT_OK(orSetDevice(0));
}

TEST(LaunchKernelSyncTest, WaitsBehindARunningKernelAndRunsAfterIt) {
  // The stream's only task is running (its queue is empty): the synchronous
  // launch must queue behind it, not run beside it on the calling thread.
  orStream_t stream = NewStream();
  std::promise<void> started, release;
  std::shared_future<void> release_future = release.get_future().share();
  std::atomic<int> written{0};
  ASSERT_OK(LaunchFn(stream, [&started, release_future, &written] {
    started.set_value();
    release_future.wait();
    written.store(1);
    return orSuccess;
  }));
  started.get_future().wait();
  orDebugCounters before{};
  ASSERT_OK(orGetDebugCounters(&before));
  struct Seen {
    std::atomic<int>* written;
    int value = -1;
    std::thread::id thread;
  } seen{&written};
  auto launched = std::async(std::launch::async, [stream, &seen] {
    return orLaunchKernelSync(stream, [](void* arg) -> orError_t {
      auto* s = static_cast<Seen*>(arg);
      s->value = s->written->load();
      s->thread = std::this_thread::get_id();
      return orSuccess;
    }, &seen);
  });
  // The launch is counted once it has been queued (or run, had it run here).
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  orDebugCounters now{};
  do {
    std::this_thread::sleep_for(1ms);
    ASSERT_OK(orGetDebugCounters(&now));
  } while (now.kernels_launched == before.kernels_launched &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_GT(now.kernels_launched, before.kernels_launched) << "the launch never returned";
  release.set_value();
  EXPECT_EQ(launched.get(), orSuccess);
  EXPECT_EQ(seen.value, 1) << "the kernel ran before the stream's earlier kernel finished";
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelSyncTest, WorkLaunchedWhileItRunsInlineWaitsForIt) {
  orStream_t stream = NewStream();
  ASSERT_OK(orStreamSynchronize(stream));
  struct Shared {
    orStream_t stream;
    std::vector<int> order;
    orError_t query_inside = orSuccess;
    orError_t launch_inside = orSuccess;
  } shared{stream};
  ASSERT_OK(orLaunchKernelSync(stream, [](void* arg) -> orError_t {
    auto* s = static_cast<Shared*>(arg);
    // Another thread launches on the stream while this kernel runs inline.
    std::thread([s] {
      s->launch_inside = LaunchFn(s->stream, [s] {
        s->order.push_back(2);
        return orSuccess;
      });
      s->query_inside = orStreamQuery(s->stream);
    }).join();
    s->order.push_back(1);
    return orSuccess;
  }, &shared));
  EXPECT_OK(shared.launch_inside);
  EXPECT_EQ(shared.query_inside, orErrorNotReady);
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(shared.order, (std::vector<int>{1, 2}));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelSyncTest, AStreamDestroyedWhileItsKernelRunsInlineIsDestroyedAfterIt) {
  // Another thread destroys the stream while an inline kernel runs on it:
  // the destruction waits for the kernel, and then finishes (the worker,
  // held back for the kernel, must be told that it ended).
  orStream_t stream = NewStream();
  ASSERT_OK(orStreamSynchronize(stream));
  struct Shared {
    orStream_t stream;
    std::shared_ptr<std::promise<orError_t>> destroyed = std::make_shared<std::promise<orError_t>>();
    bool handle_gone = false;
  } shared{stream};
  std::future<orError_t> destroyed = shared.destroyed->get_future();
  ASSERT_OK(orLaunchKernelSync(stream, [](void* arg) -> orError_t {
    auto* s = static_cast<Shared*>(arg);
    // Detached: were the destruction to hang, the test fails instead of hanging too.
    std::thread([stream = s->stream, done = s->destroyed] { done->set_value(orStreamDestroy(stream)); }).detach();
    // The handle is unregistered first; the destruction then waits for us.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    int device = 0;
    while (orStreamGetDevice(s->stream, &device) == orSuccess &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    s->handle_gone = orStreamGetDevice(s->stream, &device) == orErrorInvalidHandle;
    return orSuccess;
  }, &shared));
  EXPECT_TRUE(shared.handle_gone);
  ASSERT_EQ(destroyed.wait_for(30s), std::future_status::ready)
      << "orStreamDestroy hung after the inline kernel ended";
  EXPECT_OK(destroyed.get());
}

TEST(LaunchKernelSyncTest, ReportsItsKernelsFailureAndAnEarlierOne) {
  orStream_t stream = NewStream();
  EXPECT_FAILS(orLaunchKernelSync(stream, [](void*) -> orError_t {
    orKernelSetError("inline kernel broke");
    return orErrorKernelFailed;
  }, nullptr), orErrorKernelFailed, "orLaunchKernelSync", "device 0", "inline kernel broke");
  EXPECT_OK(orStreamQuery(stream));  // reported once
  // An earlier queued kernel's failure is reported by the next synchronous launch.
  ASSERT_OK(LaunchFn(stream, [] {
    orKernelSetError("queued kernel broke");
    return orErrorKernelFailed;
  }));
  KernelProbe probe{0};
  EXPECT_FAILS(orLaunchKernelSync(stream, ProbeKernel, &probe), orErrorKernelFailed,
               "queued kernel broke");
  EXPECT_EQ(probe.argument, 1);  // it still ran, as a queued kernel would
  EXPECT_OK(orStreamDestroy(stream));
}

TEST(LaunchKernelSyncTest, IsNotPermittedInsideAKernel) {
  orStream_t stream = NewStream();
  orError_t inside = orSuccess;
  ASSERT_OK(LaunchFn(stream, [&inside] {
    inside = orLaunchKernelSync(nullptr, [](void*) -> orError_t { return orSuccess; }, nullptr);
    return orSuccess;
  }));
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(inside, orErrorNotPermitted);
  EXPECT_OK(orStreamDestroy(stream));
}

// ------------------------------------------------------------ stream waits

class StreamWaitEventTest : public RuntimeTest {};

TEST_F(StreamWaitEventTest, RejectsUnknownAndDestroyedHandles) {
  orStream_t stream = NewStream();
  orEvent_t destroyed_event = nullptr;
  ASSERT_OK(orEventCreate(&destroyed_event));
  ASSERT_OK(orEventDestroy(destroyed_event));
  int not_an_event = 0;
  for (orEvent_t bad : {destroyed_event, reinterpret_cast<orEvent_t>(&not_an_event),
                        static_cast<orEvent_t>(nullptr)}) {
    EXPECT_FAILS(orStreamWaitEvent(stream, bad), orErrorInvalidHandle,
                 "orStreamWaitEvent", "event=");
  }
  orEvent_t event = nullptr;
  ASSERT_OK(orEventCreate(&event));
  EXPECT_FAILS(orStreamWaitEvent(UnknownStream(), event), orErrorInvalidHandle,
               "orStreamWaitEvent", "stream=");
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(StreamWaitEventTest, ConsumerSeesTheProducersWrite) {
  orStream_t producer = NewStream(), consumer = NewStream();
  void* device_ptr = nullptr;
  ASSERT_OK(orMalloc(&device_ptr, sizeof(int)));
  ASSERT_OK(orMemsetAsync(device_ptr, 0, sizeof(int), producer));
  Gate gate;
  ASSERT_OK(gate.Block(producer));
  ASSERT_OK(StoreFromKernel(producer, device_ptr, 42));
  orEvent_t written = nullptr;
  ASSERT_OK(orEventCreate(&written));
  ASSERT_OK(orEventRecord(written, producer));
  ASSERT_OK(orStreamWaitEvent(consumer, written));
  int seen = -1;
  ASSERT_OK(orMemcpyAsync(&seen, device_ptr, sizeof(int), orMemcpyDeviceToHost, consumer));
  EXPECT_EQ(orStreamQuery(consumer), orErrorNotReady);
  EXPECT_EQ(seen, -1);
  gate.Open();
  ASSERT_OK(orStreamSynchronize(consumer));
  EXPECT_EQ(seen, 42);
  EXPECT_OK(orEventDestroy(written));
  EXPECT_OK(orFree(device_ptr));
  EXPECT_OK(orStreamDestroy(producer));
  EXPECT_OK(orStreamDestroy(consumer));
}

TEST_F(StreamWaitEventTest, OrdersWorkAcrossDevices) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  orStream_t producer = NewStream();
  void* on_one = nullptr;
  ASSERT_OK(orMalloc(&on_one, sizeof(int)));
  orEvent_t written = nullptr;
  ASSERT_OK(orEventCreate(&written));  // an event of device 1
  ASSERT_OK(orSetDevice(0));
  orStream_t consumer = NewStream();
  void* on_zero = nullptr;
  ASSERT_OK(orMalloc(&on_zero, sizeof(int)));
  ASSERT_OK(orMemsetAsync(on_zero, 0, sizeof(int), consumer));
  ASSERT_OK(orStreamSynchronize(consumer));

  Gate gate;
  ASSERT_OK(gate.Block(producer));
  ASSERT_OK(StoreFromKernel(producer, on_one, 77));
  ASSERT_OK(orEventRecord(written, producer));
  ASSERT_OK(orStreamWaitEvent(consumer, written));
  ASSERT_OK(orMemcpyAsync(on_zero, on_one, sizeof(int), orMemcpyDeviceToDevice, consumer));
  EXPECT_EQ(orStreamQuery(consumer), orErrorNotReady);
  gate.Open();
  ASSERT_OK(orStreamSynchronize(consumer));
  EXPECT_EQ(ReadInt(on_zero), 77);
  EXPECT_OK(orEventDestroy(written));
  EXPECT_OK(orFree(on_zero));
  EXPECT_OK(orFree(on_one));
  EXPECT_OK(orStreamDestroy(producer));
  EXPECT_OK(orStreamDestroy(consumer));
}

TEST_F(StreamWaitEventTest, UnrecordedEventAndTheSameStreamAreNoOps) {
  orStream_t stream = NewStream();
  orEvent_t unrecorded = nullptr;
  ASSERT_OK(orEventCreate(&unrecorded));
  ASSERT_OK(orStreamWaitEvent(stream, unrecorded));
  orEvent_t own = nullptr;
  ASSERT_OK(orEventCreate(&own));
  ASSERT_OK(orEventRecord(own, stream));
  ASSERT_OK(orStreamWaitEvent(stream, own));
  std::atomic<bool> ran{false};
  ASSERT_OK(LaunchFn(stream, [&ran] {
    ran.store(true);
    return orSuccess;
  }));
  auto sync = std::async(std::launch::async, [&] { return orStreamSynchronize(stream); });
  ASSERT_EQ(sync.wait_for(5s), std::future_status::ready) << "a no-op wait blocked";
  EXPECT_EQ(sync.get(), orSuccess);
  EXPECT_TRUE(ran.load());
  EXPECT_OK(orEventDestroy(unrecorded));
  EXPECT_OK(orEventDestroy(own));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(StreamWaitEventTest, WaitsForTheRecordMadeBeforeTheCallOnly) {
  orStream_t producer = NewStream(), consumer = NewStream();
  orEvent_t event = nullptr;
  ASSERT_OK(orEventCreate(&event));
  ASSERT_OK(orEventRecord(event, producer));
  ASSERT_OK(orStreamSynchronize(producer));
  ASSERT_OK(orStreamWaitEvent(consumer, event));  // captures the completed record
  Gate gate;
  ASSERT_OK(gate.Block(producer));
  ASSERT_OK(orEventRecord(event, producer));  // a new record the wait ignores
  auto sync = std::async(std::launch::async, [&] { return orStreamSynchronize(consumer); });
  const bool finished = sync.wait_for(5s) == std::future_status::ready;
  gate.Open();
  EXPECT_TRUE(finished) << "the consumer waited for a later record";
  EXPECT_EQ(sync.get(), orSuccess);
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(producer));
  EXPECT_OK(orStreamDestroy(consumer));
}

// ------------------------------------------------------------------- stress

TEST(StressTest, ManyThreadsCreateStreamsLaunchAndAllocateConcurrently) {
  constexpr int kThreads = 8, kRounds = 12, kKernelsPerRound = 4;
  std::atomic<int> kernels_run{0};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  auto record_failure = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(failures_mutex);
    failures.push_back(what);
  };
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % DeviceCount();
      auto check = [&](orError_t result, const char* what) {
        if (result != orSuccess) {
          record_failure(std::string(what) + ": " + orGetLastErrorMessage());
        }
        return result == orSuccess;
      };
      if (!check(orSetDevice(device), "orSetDevice")) return;
      for (int round = 0; round < kRounds; ++round) {
        orStream_t stream = nullptr;
        if (!check(orStreamCreateWithPriority(&stream, -(round % 2)), "create")) return;
        const size_t size = 512 * (1 + (t * 7 + round) % 9);
        void* device_ptr = nullptr;
        if (!check(orMalloc(&device_ptr, size), "orMalloc")) return;
        const std::vector<unsigned char> data = Pattern(size, t * 100 + round);
        std::vector<unsigned char> back(size, 0);
        check(orMemcpyAsync(device_ptr, data.data(), size, orMemcpyHostToDevice, stream),
              "H2D");
        for (int k = 0; k < kKernelsPerRound; ++k) {
          check(LaunchFn(stream, [&kernels_run, device] {
                  if (orKernelCurrentDevice() != device) return orErrorDeviceMismatch;
                  kernels_run.fetch_add(1);
                  return orSuccess;
                }),
                "launch");
        }
        orEvent_t event = nullptr;
        check(orEventCreate(&event), "orEventCreate");
        check(orEventRecord(event, stream), "orEventRecord");
        check(orMemcpyAsync(back.data(), device_ptr, size, orMemcpyDeviceToHost, stream),
              "D2H");
        const orError_t query = orStreamQuery(stream);
        if (query != orSuccess && query != orErrorNotReady) check(query, "query");
        check(orStreamSynchronize(stream), "orStreamSynchronize");
        check(orEventQuery(event), "orEventQuery");
        if (back != data) record_failure("round trip changed the data");
        check(orEventDestroy(event), "orEventDestroy");
        check(orStreamDestroy(stream), "orStreamDestroy");
        check(orFree(device_ptr), "orFree");
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const auto elapsed = std::chrono::steady_clock::now() - started;
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  EXPECT_EQ(kernels_run.load(), kThreads * kRounds * kKernelsPerRound);
  RecordProperty("elapsed_ms", static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()));
}

}  // namespace
}  // namespace openreg_test

namespace openreg_test {
namespace {

class StreamMemoryOpsTest : public RuntimeTest {};

TEST_F(StreamMemoryOpsTest, AWaitHoldsLaterWorkUntilTheWordIsWritten) {
  orStream_t stream = NewStream();
  uint32_t gate = 0;
  uint32_t first = 0;
  uint32_t second = 0;
  ASSERT_EQ(orStreamWriteValue32(stream, &first, 1), orSuccess) << orGetLastErrorMessage();
  ASSERT_EQ(orStreamWaitValue32(stream, &gate, 2), orSuccess) << orGetLastErrorMessage();
  ASSERT_EQ(orStreamWriteValue32(stream, &second, 1), orSuccess) << orGetLastErrorMessage();
  EXPECT_EQ(orStreamQuery(stream), orErrorNotReady);
  __atomic_store_n(&gate, 1u, __ATOMIC_RELEASE);  // below the value: still held
  EXPECT_EQ(orStreamQuery(stream), orErrorNotReady);
  EXPECT_EQ(__atomic_load_n(&second, __ATOMIC_ACQUIRE), 0u);
  __atomic_store_n(&gate, 3u, __ATOMIC_RELEASE);  // >= the value: released
  ASSERT_EQ(orStreamSynchronize(stream), orSuccess) << orGetLastErrorMessage();
  EXPECT_EQ(__atomic_load_n(&first, __ATOMIC_ACQUIRE), 1u);
  EXPECT_EQ(__atomic_load_n(&second, __ATOMIC_ACQUIRE), 1u);
  EXPECT_EQ(orStreamDestroy(stream), orSuccess);
}

TEST_F(StreamMemoryOpsTest, RejectsBadArgumentsAtTheCall) {
  alignas(8) uint32_t words[2] = {0, 0};
  auto* misaligned = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(words) + 1);
  EXPECT_FAILS(orStreamWaitValue32(nullptr, nullptr, 1), orErrorInvalidValue, "orStreamWaitValue32",
               "address is null");
  EXPECT_FAILS(orStreamWriteValue32(nullptr, misaligned, 1), orErrorInvalidValue, "orStreamWriteValue32",
               "not 4-byte aligned");
  EXPECT_FAILS(orStreamWaitValue32(DestroyedStream(), words, 1), orErrorInvalidHandle, "orStreamWaitValue32");
  EXPECT_EQ(orStreamSynchronize(nullptr), orSuccess);  // nothing was queued
}

}  // namespace
}  // namespace openreg_test

// ------------------------------------------------------------------ graphs

namespace openreg_test {
namespace {

class GraphTest : public RuntimeTest {};

// A kernel that appends `value` to `log` (host memory), owned by the runtime.
struct Append {
  std::vector<int>* log;
  int value;
  std::atomic<int>* released;
};

orError_t LaunchAppend(orStream_t stream, std::vector<int>* log, int value, std::atomic<int>* released) {
  return orLaunchKernelOwned(
      stream,
      [](void* arg) -> orError_t {
        auto* a = static_cast<Append*>(arg);
        a->log->push_back(a->value);
        return orSuccess;
      },
      new Append{log, value, released},
      [](void* arg) {
        auto* a = static_cast<Append*>(arg);
        if (a->released) a->released->fetch_add(1);
        delete a;
      });
}

int IsCapturing(orStream_t stream) {
  int capturing = -1;
  EXPECT_EQ(orStreamIsCapturing(stream, &capturing), orSuccess) << orGetLastErrorMessage();
  return capturing;
}

TEST_F(GraphTest, CaptureRecordsWorkAndEachLaunchRunsItInOrder) {
  orStream_t capture = NewStream();
  orStream_t replay = NewStream();
  std::vector<int> log;
  EXPECT_EQ(IsCapturing(capture), 0);
  ASSERT_OK(orStreamBeginCapture(capture));
  EXPECT_EQ(IsCapturing(capture), 1);
  EXPECT_EQ(IsCapturing(replay), 0);
  for (int value : {1, 2, 3}) ASSERT_OK(LaunchAppend(capture, &log, value, nullptr));
  orGraph_t graph = nullptr;
  ASSERT_OK(orStreamEndCapture(capture, &graph));
  EXPECT_EQ(IsCapturing(capture), 0);
  ASSERT_OK(orStreamSynchronize(capture));
  EXPECT_TRUE(log.empty()) << "captured work ran during the capture";
  size_t nodes = 0;
  ASSERT_OK(orGraphGetNodeCount(graph, &nodes));
  EXPECT_EQ(nodes, 3u);
  // (one launch at a time: launches on two streams run concurrently)
  ASSERT_OK(orGraphLaunch(graph, replay));
  ASSERT_OK(orStreamSynchronize(replay));
  ASSERT_OK(orGraphLaunch(graph, capture));
  ASSERT_OK(orStreamSynchronize(capture));
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3, 1, 2, 3}));
  EXPECT_OK(orGraphDestroy(graph));
  EXPECT_OK(orStreamDestroy(capture));
  EXPECT_OK(orStreamDestroy(replay));
}

TEST_F(GraphTest, ALaunchIsOrderedAfterTheStreamsEarlierWork) {
  orStream_t capture = NewStream();
  orStream_t replay = NewStream();
  std::vector<int> log;
  ASSERT_OK(orStreamBeginCapture(capture));
  ASSERT_OK(LaunchAppend(capture, &log, 2, nullptr));
  orGraph_t graph = nullptr;
  ASSERT_OK(orStreamEndCapture(capture, &graph));
  uint32_t gate = 0;
  ASSERT_OK(orStreamWaitValue32(replay, &gate, 1));
  ASSERT_OK(LaunchAppend(replay, &log, 1, nullptr));
  ASSERT_OK(orGraphLaunch(graph, replay));
  EXPECT_EQ(orStreamQuery(replay), orErrorNotReady);
  __atomic_store_n(&gate, 1u, __ATOMIC_RELEASE);
  ASSERT_OK(orStreamSynchronize(replay));
  EXPECT_EQ(log, (std::vector<int>{1, 2}));
  EXPECT_OK(orGraphDestroy(graph));
  EXPECT_OK(orStreamDestroy(capture));
  EXPECT_OK(orStreamDestroy(replay));
}

TEST_F(GraphTest, CallsThatWaitForTheCapturingStreamFailAndInvalidateTheCapture) {
  orStream_t stream = NewStream();
  int value = 0;
  void* device = nullptr;
  ASSERT_OK(orMalloc(&device, sizeof(int)));
  orEvent_t event = nullptr;
  ASSERT_OK(orEventCreate(&event));
  ASSERT_OK(orStreamBeginCapture(stream));
  EXPECT_FAILS(orStreamSynchronize(stream), orErrorNotPermitted, "orStreamSynchronize", "capturing");
  EXPECT_FAILS(orStreamQuery(stream), orErrorNotPermitted, "orStreamQuery", "capturing");
  EXPECT_FAILS(orMemcpySync(&value, device, sizeof(int), orMemcpyDeviceToHost, stream), orErrorNotPermitted,
               "orMemcpySync");
  EXPECT_FAILS(orEventRecord(event, stream), orErrorNotPermitted, "orEventRecord");
  EXPECT_FAILS(orStreamWaitEvent(stream, event), orErrorNotPermitted, "orStreamWaitEvent");
  EXPECT_FAILS(orStreamDestroy(stream), orErrorNotPermitted, "orStreamDestroy");
  orGraph_t graph = nullptr;
  EXPECT_FAILS(orStreamEndCapture(stream, &graph), orErrorNotPermitted, "invalidated", "orStreamSynchronize");
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(IsCapturing(stream), 0);
  EXPECT_OK(orMemcpySync(&value, device, sizeof(int), orMemcpyDeviceToHost, stream));  // usable again
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orFree(device));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(GraphTest, RejectsBadArgumentsAtTheCall) {
  orStream_t default_stream = nullptr;
  ASSERT_OK(orStreamGetDefault(0, &default_stream));
  EXPECT_FAILS(orStreamBeginCapture(default_stream), orErrorNotPermitted, "orStreamBeginCapture", "default stream");
  EXPECT_FAILS(orStreamBeginCapture(nullptr), orErrorNotPermitted, "default stream");
  orStream_t stream = NewStream();
  orGraph_t graph = nullptr;
  EXPECT_FAILS(orStreamEndCapture(stream, &graph), orErrorNotPermitted, "orStreamEndCapture", "not capturing");
  EXPECT_FAILS(orStreamEndCapture(stream, nullptr), orErrorInvalidValue, "graph is null");
  ASSERT_OK(orStreamBeginCapture(stream));
  EXPECT_FAILS(orStreamBeginCapture(stream), orErrorNotPermitted, "already capturing");
  ASSERT_OK(orStreamEndCapture(stream, &graph));
  ASSERT_NE(graph, nullptr);
  EXPECT_FAILS(orStreamIsCapturing(stream, nullptr), orErrorInvalidValue, "capturing is null");
  EXPECT_FAILS(orGraphGetNodeCount(graph, nullptr), orErrorInvalidValue, "count is null");
  EXPECT_FAILS(orGraphDebugDotPrint(graph, nullptr), orErrorInvalidValue, "path is null");
  EXPECT_FAILS(orGraphDebugDotPrint(graph, "/nonexistent-dir/graph.dot"), orErrorInvalidValue, "path=");
  EXPECT_OK(orGraphDestroy(graph));
  EXPECT_FAILS(orGraphLaunch(graph, stream), orErrorInvalidHandle, "orGraphLaunch", "not a live OpenReg graph");
  EXPECT_FAILS(orGraphDestroy(graph), orErrorInvalidHandle, "orGraphDestroy");
  EXPECT_FAILS(orLaunchKernelOwned(stream, nullptr, nullptr, [](void*) {}), orErrorInvalidValue, "fn is null");
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(GraphTest, LaunchesOnAnotherDeviceAreRejected) {
  REQUIRE_DEVICES(2);
  orStream_t stream = NewStream();
  ASSERT_OK(orStreamBeginCapture(stream));
  orGraph_t graph = nullptr;
  ASSERT_OK(orStreamEndCapture(stream, &graph));
  ASSERT_OK(orSetDevice(1));
  orStream_t other = NewStream();
  EXPECT_FAILS(orGraphLaunch(graph, other), orErrorDeviceMismatch, "captured on device 0", "device 1");
  EXPECT_OK(orStreamDestroy(other));
  ASSERT_OK(orSetDevice(0));
  EXPECT_OK(orGraphDestroy(graph));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(GraphTest, OwnedArgumentsAreReleasedOnceNothingCanRunThem) {
  orStream_t stream = NewStream();
  std::vector<int> log;
  std::atomic<int> released{0};
  ASSERT_OK(LaunchAppend(stream, &log, 7, &released));
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(released.load(), 1) << "an uncaptured kernel's argument is released after it ran";
  ASSERT_OK(orStreamBeginCapture(stream));
  ASSERT_OK(LaunchAppend(stream, &log, 8, &released));
  orGraph_t graph = nullptr;
  ASSERT_OK(orStreamEndCapture(stream, &graph));
  ASSERT_OK(orGraphLaunch(graph, stream));
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(released.load(), 1) << "the graph still holds the captured kernel's argument";
  ASSERT_OK(orGraphLaunch(graph, stream));
  EXPECT_OK(orGraphDestroy(graph));  // the queued launch keeps the argument
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(log, (std::vector<int>{7, 8, 8}));
  EXPECT_EQ(released.load(), 2);
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(GraphTest, DotPrintListsTheOperationsInOrder) {
  orStream_t stream = NewStream();
  void* device = nullptr;
  ASSERT_OK(orMalloc(&device, 64));
  ASSERT_OK(orStreamBeginCapture(stream));
  ASSERT_OK(orMemsetAsync(device, 0, 64, stream));
  ASSERT_OK(LaunchAppend(stream, nullptr, 0, nullptr));
  orGraph_t graph = nullptr;
  ASSERT_OK(orStreamEndCapture(stream, &graph));
  char path[] = "/tmp/openreg-graph-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_OK(orGraphDebugDotPrint(graph, path));
  std::FILE* f = std::fopen(path, "r");
  ASSERT_NE(f, nullptr);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  std::remove(path);
  EXPECT_NE(text.find("digraph"), std::string::npos) << text;
  EXPECT_NE(text.find("0: memset"), std::string::npos) << text;
  EXPECT_NE(text.find("1: kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("n0 -> n1"), std::string::npos) << text;
  EXPECT_OK(orGraphDestroy(graph));  // never launched: the kernel never runs
  EXPECT_OK(orFree(device));
  EXPECT_OK(orStreamDestroy(stream));
}

}  // namespace
}  // namespace openreg_test
