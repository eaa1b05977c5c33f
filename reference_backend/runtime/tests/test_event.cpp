// Events: creation flags, destruction, recording on streams, query and
// synchronize, the owning device, and elapsed time between events.
#include "test_helpers.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace openreg_test {
namespace {

using namespace std::chrono_literals;

orEvent_t NewEvent(unsigned flags = orEventDefault) {
  orEvent_t event = nullptr;
  const orError_t result = orEventCreateWithFlags(&event, flags);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return event;
}

orEvent_t DestroyedEvent() {
  orEvent_t event = NewEvent();
  const orError_t result = orEventDestroy(event);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return event;
}

// An address that was never an event: the runtime must not dereference it.
orEvent_t UnknownEvent() {
  static int not_an_event = 0;
  return reinterpret_cast<orEvent_t>(&not_an_event);
}

// A kernel that takes at least `duration` on `stream`.
orError_t Sleep(orStream_t stream, std::chrono::milliseconds duration) {
  return LaunchFn(stream, [duration] {
    std::this_thread::sleep_for(duration);
    return orSuccess;
  });
}

class EventTest : public RuntimeTest {};

// ------------------------------------------------------------------- create

TEST_F(EventTest, CreateRejectsNullOutput) {
  // "orEventCreate:" with the colon: orEventCreateWithFlags is another call.
  EXPECT_FAILS(orEventCreate(nullptr), orErrorInvalidValue, "orEventCreate:",
               "event");
  EXPECT_FAILS(orEventCreateWithFlags(nullptr, orEventDefault), orErrorInvalidValue,
               "orEventCreateWithFlags", "event");
}

TEST_F(EventTest, CreateRejectsUnknownFlags) {
  for (unsigned flags : {0x1u, 0x3u, 0x4u, 0xffffffffu}) {
    orEvent_t event = nullptr;
    char hex[16];
    std::snprintf(hex, sizeof(hex), "flags=0x%x", flags);
    EXPECT_FAILS(orEventCreateWithFlags(&event, flags), orErrorInvalidValue,
                 "orEventCreateWithFlags", hex, "orEventDefault(0x0)",
                 "orEventDisableTiming(0x2)");
    EXPECT_EQ(event, nullptr);
  }
}

TEST_F(EventTest, BelongsToTheCurrentDeviceAtCreation) {
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    ASSERT_OK(orSetDevice(device));
    for (unsigned flags : {unsigned{orEventDefault}, unsigned{orEventDisableTiming}}) {
      orEvent_t event = NewEvent(flags);
      ASSERT_OK(orSetDevice(0));  // later changes do not move the event
      int event_device = -1;
      EXPECT_OK(orEventGetDevice(event, &event_device));
      EXPECT_EQ(event_device, device);
      EXPECT_OK(orEventDestroy(event));
      ASSERT_OK(orSetDevice(device));
    }
  }
}

TEST_F(EventTest, GetDeviceRejectsNullOutputAndUnknownEvents) {
  orEvent_t event = NewEvent();
  EXPECT_FAILS(orEventGetDevice(event, nullptr), orErrorInvalidValue,
               "orEventGetDevice", "device");
  int device = 42;
  for (orEvent_t bad : {DestroyedEvent(), UnknownEvent(), static_cast<orEvent_t>(nullptr)}) {
    EXPECT_FAILS(orEventGetDevice(bad, &device), orErrorInvalidHandle,
                 "orEventGetDevice", "event=");
    EXPECT_EQ(device, 42);
  }
  EXPECT_OK(orEventDestroy(event));
}

// ------------------------------------------------------------------ destroy

TEST_F(EventTest, DestroyRejectsNullDestroyedAndUnknownEvents) {
  for (orEvent_t bad : {static_cast<orEvent_t>(nullptr), DestroyedEvent(), UnknownEvent()}) {
    EXPECT_FAILS(orEventDestroy(bad), orErrorInvalidHandle, "orEventDestroy", "event=");
  }
}

TEST_F(EventTest, DestroyingAnEventWithPendingWorkIsFine) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  orEvent_t event = NewEvent();
  ASSERT_OK(orEventRecord(event, stream));
  EXPECT_OK(orEventDestroy(event));
  gate.Open();
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_OK(orStreamDestroy(stream));
}


TEST_F(EventTest, DebugCountersCountLiveEvents) {
  auto live = [] {
    orDebugCounters counters{};
    EXPECT_OK(orGetDebugCounters(&counters));
    return counters.live_events;
  };
  const uint64_t before = live();
  orEvent_t a = NewEvent();
  orEvent_t b = NewEvent(orEventDisableTiming);
  EXPECT_EQ(live(), before + 2);
  ASSERT_OK(orEventDestroy(a));
  EXPECT_EQ(live(), before + 1);
  ASSERT_OK(orEventDestroy(b));
  EXPECT_EQ(live(), before);
}
TEST_F(EventTest, DestroyedEventsAreRejectedByEveryEventCall) {
  // The live event first: a new event may reuse a destroyed one's address.
  orEvent_t live = NewEvent();
  orEvent_t destroyed = DestroyedEvent();
  ASSERT_OK(orEventRecord(live, nullptr));
  ASSERT_OK(orEventSynchronize(live));
  float ms = -7.0f;
  EXPECT_FAILS(orEventRecord(destroyed, nullptr), orErrorInvalidHandle,
               "orEventRecord", "event=");
  EXPECT_FAILS(orEventQuery(destroyed), orErrorInvalidHandle, "orEventQuery", "event=");
  EXPECT_FAILS(orEventSynchronize(destroyed), orErrorInvalidHandle,
               "orEventSynchronize", "event=");
  EXPECT_FAILS(orEventElapsedTime(&ms, destroyed, live), orErrorInvalidHandle,
               "orEventElapsedTime", "start=");
  EXPECT_FAILS(orEventElapsedTime(&ms, live, destroyed), orErrorInvalidHandle,
               "orEventElapsedTime", "end=");
  EXPECT_EQ(ms, -7.0f);
  EXPECT_OK(orEventDestroy(live));
}

// ------------------------------------------------------------------- record

TEST_F(EventTest, RecordRejectsUnknownStreams) {
  orEvent_t event = NewEvent();
  orStream_t destroyed = nullptr;
  ASSERT_OK(orStreamCreate(&destroyed));
  ASSERT_OK(orStreamDestroy(destroyed));
  int not_a_stream = 0;
  for (orStream_t bad : {destroyed, reinterpret_cast<orStream_t>(&not_a_stream)}) {
    EXPECT_FAILS(orEventRecord(event, bad), orErrorInvalidHandle, "orEventRecord",
                 "stream=");
  }
  EXPECT_FAILS(orEventRecord(UnknownEvent(), nullptr), orErrorInvalidHandle,
               "orEventRecord", "event=");
  EXPECT_OK(orEventDestroy(event));
}

TEST_F(EventTest, RecordRejectsAStreamOfAnotherDeviceAndKeepsTheLastRecord) {
  REQUIRE_DEVICES(2);
  ASSERT_OK(orSetDevice(1));
  orEvent_t event = NewEvent();  // device 1
  orStream_t stream_one = nullptr;
  ASSERT_OK(orStreamCreate(&stream_one));
  Gate gate;
  ASSERT_OK(gate.Block(stream_one));
  ASSERT_OK(orEventRecord(event, stream_one));
  ASSERT_OK(orSetDevice(0));
  orStream_t default_zero = nullptr;
  ASSERT_OK(orStreamGetDefault(0, &default_zero));
  EXPECT_FAILS(orEventRecord(event, default_zero), orErrorDeviceMismatch,
               "orEventRecord", "event belongs to device 1",
               "stream belongs to device 0");
  EXPECT_FAILS(orEventRecord(event, nullptr), orErrorDeviceMismatch, "orEventRecord",
               "device 1", "device 0");
  // Still bound to the record on device 1's blocked stream.
  EXPECT_EQ(orEventQuery(event), orErrorNotReady);
  gate.Open();
  EXPECT_OK(orEventSynchronize(event));
  EXPECT_EQ(orEventQuery(event), orSuccess);
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(stream_one));
}

TEST_F(EventTest, RecordOnNullStreamUsesTheCurrentDevicesDefaultStream) {
  for (int device = 0; device < DeviceCount() && device < 2; ++device) {
    ASSERT_OK(orSetDevice(device));
    orEvent_t event = NewEvent();
    Gate gate;
    ASSERT_OK(gate.Block(nullptr));
    ASSERT_OK(orEventRecord(event, nullptr));
    EXPECT_EQ(orEventQuery(event), orErrorNotReady);
    gate.Open();
    EXPECT_OK(orEventSynchronize(event));
    EXPECT_EQ(orEventQuery(event), orSuccess);
    EXPECT_OK(orEventDestroy(event));
  }
}

// ------------------------------------------------------ query / synchronize

TEST_F(EventTest, UnrecordedEventIsComplete) {
  orEvent_t event = NewEvent();
  EXPECT_EQ(orEventQuery(event), orSuccess);
  EXPECT_OK(orEventSynchronize(event));
  EXPECT_OK(orEventDestroy(event));
}

TEST_F(EventTest, QueryTracksTheCapturedWork) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  orEvent_t event = NewEvent();
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  ASSERT_OK(orEventRecord(event, stream));
  EXPECT_EQ(orEventQuery(event), orErrorNotReady);
  gate.Open();
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(orEventQuery(event), orSuccess);
  // Work launched after the record does not belong to the event.
  Gate later;
  ASSERT_OK(later.Block(stream));
  EXPECT_EQ(orEventQuery(event), orSuccess);
  later.Open();
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(EventTest, SynchronizeWaitsForTheCapturedWorkOnly) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  orEvent_t event = NewEvent();
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  std::atomic<bool> ran{false};
  ASSERT_OK(LaunchFn(stream, [&ran] {
    ran.store(true);
    return orSuccess;
  }));
  ASSERT_OK(orEventRecord(event, stream));
  Gate later;
  ASSERT_OK(later.Block(stream));  // after the record: not waited for
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    gate.Open();
  });
  auto sync = std::async(std::launch::async, [&] { return orEventSynchronize(event); });
  const bool finished = sync.wait_for(5s) == std::future_status::ready;
  opener.join();
  later.Open();
  EXPECT_TRUE(finished) << "orEventSynchronize waited for work recorded later";
  EXPECT_EQ(sync.get(), orSuccess);
  EXPECT_TRUE(ran.load());
  EXPECT_OK(orStreamSynchronize(stream));
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(EventTest, ReRecordingCapturesTheNewWork) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  orEvent_t event = NewEvent();
  ASSERT_OK(orEventRecord(event, stream));
  ASSERT_OK(orEventSynchronize(event));
  EXPECT_EQ(orEventQuery(event), orSuccess);
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  ASSERT_OK(orEventRecord(event, stream));
  EXPECT_EQ(orEventQuery(event), orErrorNotReady);
  gate.Open();
  EXPECT_OK(orEventSynchronize(event));
  EXPECT_EQ(orEventQuery(event), orSuccess);
  EXPECT_OK(orEventDestroy(event));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(EventTest, QueryAndSynchronizeWorkFromOtherThreads) {
  orEvent_t event = NewEvent();
  Gate gate;
  ASSERT_OK(gate.Block(nullptr));
  ASSERT_OK(orEventRecord(event, nullptr));
  orError_t from_thread = orSuccess;
  std::thread([&] { from_thread = orEventQuery(event); }).join();
  EXPECT_EQ(from_thread, orErrorNotReady);
  gate.Open();
  std::thread([&] { from_thread = orEventSynchronize(event); }).join();
  EXPECT_EQ(from_thread, orSuccess);
  EXPECT_EQ(orEventQuery(event), orSuccess);
  EXPECT_OK(orEventDestroy(event));
}

// ------------------------------------------------------------- elapsed time

TEST_F(EventTest, ElapsedTimeRejectsNullOutput) {
  orEvent_t start = NewEvent(), end = NewEvent();
  EXPECT_FAILS(orEventElapsedTime(nullptr, start, end), orErrorInvalidValue,
               "orEventElapsedTime", "ms");
  EXPECT_OK(orEventDestroy(start));
  EXPECT_OK(orEventDestroy(end));
}

TEST_F(EventTest, ElapsedTimeRejectsUnknownEvents) {
  orEvent_t live = NewEvent();
  float ms = -7.0f;
  for (orEvent_t bad : {UnknownEvent(), static_cast<orEvent_t>(nullptr)}) {
    EXPECT_FAILS(orEventElapsedTime(&ms, bad, live), orErrorInvalidHandle,
                 "orEventElapsedTime", "=");
    EXPECT_FAILS(orEventElapsedTime(&ms, live, bad), orErrorInvalidHandle,
                 "orEventElapsedTime", "=");
  }
  EXPECT_EQ(ms, -7.0f);
  EXPECT_OK(orEventDestroy(live));
}

TEST_F(EventTest, ElapsedTimeRejectsTimingDisabledEvents) {
  orEvent_t timed = NewEvent(), untimed = NewEvent(orEventDisableTiming);
  ASSERT_OK(orEventRecord(timed, nullptr));
  ASSERT_OK(orEventRecord(untimed, nullptr));
  ASSERT_OK(orStreamSynchronize(nullptr));
  float ms = -7.0f;
  for (auto [start, end] : {std::pair{timed, untimed}, std::pair{untimed, timed},
                            std::pair{untimed, untimed}}) {
    EXPECT_FAILS(orEventElapsedTime(&ms, start, end), orErrorInvalidValue,
                 "orEventElapsedTime", "timing enabled", "orEventDisableTiming");
  }
  EXPECT_EQ(ms, -7.0f);
  // Timing-disabled events still record, query and synchronize.
  EXPECT_EQ(orEventQuery(untimed), orSuccess);
  EXPECT_OK(orEventSynchronize(untimed));
  EXPECT_OK(orEventDestroy(timed));
  EXPECT_OK(orEventDestroy(untimed));
}

TEST_F(EventTest, ElapsedTimeRejectsEventsOfDifferentDevices) {
  REQUIRE_DEVICES(2);
  orEvent_t on_zero = NewEvent();
  ASSERT_OK(orEventRecord(on_zero, nullptr));
  ASSERT_OK(orSetDevice(1));
  orEvent_t on_one = NewEvent();
  ASSERT_OK(orEventRecord(on_one, nullptr));
  ASSERT_OK(orEventSynchronize(on_zero));
  ASSERT_OK(orEventSynchronize(on_one));
  float ms = -7.0f;
  EXPECT_FAILS(orEventElapsedTime(&ms, on_zero, on_one), orErrorDeviceMismatch,
               "orEventElapsedTime", "start belongs to device 0",
               "end to device 1");
  EXPECT_FAILS(orEventElapsedTime(&ms, on_one, on_zero), orErrorDeviceMismatch,
               "orEventElapsedTime", "start belongs to device 1",
               "end to device 0");
  EXPECT_EQ(ms, -7.0f);
  EXPECT_OK(orEventDestroy(on_zero));
  EXPECT_OK(orEventDestroy(on_one));
}

TEST_F(EventTest, ElapsedTimeRejectsUnrecordedEvents) {
  orEvent_t recorded = NewEvent(), unrecorded = NewEvent();
  ASSERT_OK(orEventRecord(recorded, nullptr));
  ASSERT_OK(orEventSynchronize(recorded));
  float ms = -7.0f;
  for (auto [start, end] : {std::pair{recorded, unrecorded},
                            std::pair{unrecorded, recorded},
                            std::pair{unrecorded, unrecorded}}) {
    EXPECT_FAILS(orEventElapsedTime(&ms, start, end), orErrorInvalidValue,
                 "orEventElapsedTime", "recorded");
  }
  EXPECT_EQ(ms, -7.0f);
  EXPECT_OK(orEventDestroy(recorded));
  EXPECT_OK(orEventDestroy(unrecorded));
}

TEST_F(EventTest, ElapsedTimeIsNotReadyUntilBothEventsComplete) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  orEvent_t start = NewEvent(), end = NewEvent();
  ASSERT_OK(orEventRecord(start, stream));
  ASSERT_OK(orEventSynchronize(start));
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  ASSERT_OK(orEventRecord(end, stream));
  float ms = -7.0f;
  EXPECT_FAILS(orEventElapsedTime(&ms, start, end), orErrorNotReady,
               "orEventElapsedTime", "not completed");
  EXPECT_FAILS(orEventElapsedTime(&ms, end, start), orErrorNotReady,
               "orEventElapsedTime", "not completed");
  EXPECT_EQ(ms, -7.0f);
  gate.Open();
  ASSERT_OK(orEventSynchronize(end));
  EXPECT_OK(orEventElapsedTime(&ms, start, end));
  EXPECT_GE(ms, 0.0f);
  EXPECT_OK(orEventDestroy(start));
  EXPECT_OK(orEventDestroy(end));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(EventTest, ElapsedTimeGrowsWithTheWorkBetweenTheEvents) {
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  orEvent_t start = NewEvent(), idle_end = NewEvent(), busy_end = NewEvent();
  ASSERT_OK(orEventRecord(start, stream));
  ASSERT_OK(orEventRecord(idle_end, stream));
  ASSERT_OK(Sleep(stream, 40ms));
  ASSERT_OK(orEventRecord(busy_end, stream));
  ASSERT_OK(orEventSynchronize(busy_end));
  float idle_ms = -1.0f, busy_ms = -1.0f, same_ms = -1.0f;
  ASSERT_OK(orEventElapsedTime(&idle_ms, start, idle_end));
  ASSERT_OK(orEventElapsedTime(&busy_ms, start, busy_end));
  ASSERT_OK(orEventElapsedTime(&same_ms, start, start));
  EXPECT_GE(idle_ms, 0.0f);
  EXPECT_GE(busy_ms, 36.0f);  // 40 ms of sleep, less float rounding and slack
  EXPECT_GE(busy_ms, idle_ms);
  EXPECT_EQ(same_ms, 0.0f);
  EXPECT_OK(orEventDestroy(start));
  EXPECT_OK(orEventDestroy(idle_end));
  EXPECT_OK(orEventDestroy(busy_end));
  EXPECT_OK(orStreamDestroy(stream));
}

TEST_F(EventTest, ReRecordingTheEndEventMovesItLater) {
  orEvent_t start = NewEvent(), end = NewEvent();
  ASSERT_OK(orEventRecord(start, nullptr));
  ASSERT_OK(orEventRecord(end, nullptr));
  ASSERT_OK(orEventSynchronize(end));
  float first_ms = -1.0f, second_ms = -1.0f;
  ASSERT_OK(orEventElapsedTime(&first_ms, start, end));
  ASSERT_OK(Sleep(nullptr, 30ms));
  ASSERT_OK(orEventRecord(end, nullptr));
  ASSERT_OK(orEventSynchronize(end));
  ASSERT_OK(orEventElapsedTime(&second_ms, start, end));
  EXPECT_GE(second_ms - first_ms, 27.0f);
  EXPECT_OK(orEventDestroy(start));
  EXPECT_OK(orEventDestroy(end));
}

}  // namespace
}  // namespace openreg_test
