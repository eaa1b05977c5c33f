// C++ contracts of the stream guards and exchangeStream: c10::StreamGuard,
// c10::OptionalStreamGuard, c10::MultiStreamGuard (GD-STR-001, GD-STR-002,
// GD-MULTI-001).
//
// Every case first makes a non-default stream current on each device, so
// that "restored" cannot pass by accident when a backend resets to the
// default stream instead of the previous one.
#include "contracts_common.h"

#include <stdexcept>

namespace pu1c {
namespace {

using GD_STR_001 = WithDevices;
using GD_STR_002 = WithDevices;
using GD_MULTI_001 = WithDevices;

// ------------------------------------------------------------ GD-STR-001

TEST_F(GD_STR_001, SwitchesDeviceAndStreamRestoresBothLeavesTheOriginAlone) {
  // decides GD-STR-001.1 GD-STR-001.2
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  for (const auto& [origin, target] : {std::pair{0, last}, std::pair{last, 0}}) {
    impl().setDevice(dev(origin));
    const auto before = make_non_default_streams_current();
    const c10::Stream stream = other_stream(target);
    {
      c10::StreamGuard guard(stream);
      EXPECT_TRUE(CurrentIs(target)) << "inside StreamGuard(" << str(stream) << ") entered on "
                                     << dev(origin) << ": it must switch to the stream's device";
      EXPECT_TRUE(StreamIs(target, stream)) << "inside StreamGuard(" << str(stream) << ")";
      EXPECT_TRUE(StreamIs(origin, before[origin]))
          << "inside StreamGuard(" << str(stream) << "): the current stream of the origin device "
          << dev(origin) << " must stay untouched";
      EXPECT_EQ(guard.original_stream(), before[origin])
          << "StreamGuard.original_stream() must be the current stream of the origin device";
      EXPECT_EQ(guard.current_stream(), stream);
      EXPECT_EQ(guard.original_device(), dev(origin));
      EXPECT_EQ(guard.current_device(), dev(target));
    }
    EXPECT_TRUE(CurrentIs(origin)) << "after StreamGuard(" << str(stream) << ") entered on "
                                   << dev(origin) << " was destroyed";
    EXPECT_TRUE(StreamsAre(before))
        << "after StreamGuard(" << str(stream) << ") was destroyed: every device's current stream "
        << "must be what it was (exchangeStream must return the previous stream)";
  }
}

TEST_F(GD_STR_001, OnTheCurrentDeviceSwitchesOnlyTheStream) {
  // decides GD-STR-001.1
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(last));
  const auto before = make_non_default_streams_current();
  const c10::Stream stream = other_stream(last);
  {
    c10::StreamGuard guard(stream);
    EXPECT_TRUE(CurrentIs(last)) << "inside StreamGuard(" << str(stream) << ") on its own device";
    EXPECT_TRUE(StreamIs(last, stream)) << "inside StreamGuard(" << str(stream) << ")";
    EXPECT_TRUE(StreamIs(0, before[0])) << "inside StreamGuard(" << str(stream)
                                        << "): another device's stream changed";
  }
  EXPECT_TRUE(CurrentIs(last));
  EXPECT_TRUE(StreamsAre(before)) << "after StreamGuard(" << str(stream) << ") was destroyed";
}

TEST_F(GD_STR_001, RestoresWhenAnExceptionUnwinds) {
  // decides GD-STR-001.3
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream stream = other_stream(last);
  try {
    c10::StreamGuard guard(stream);
    ASSERT_TRUE(CurrentIs(last)) << "inside StreamGuard(" << str(stream) << ")";
    throw Escape();
  } catch (const Escape&) {
  }
  EXPECT_TRUE(CurrentIs(0)) << "after an exception unwound StreamGuard(" << str(stream) << ")";
  EXPECT_TRUE(StreamsAre(before)) << "after an exception unwound StreamGuard(" << str(stream) << ")";
}

TEST_F(GD_STR_001, ResetStreamMovesTheGuardAndRestoresEverything) {
  // decides GD-STR-001.4
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream first = other_stream(0);
  const c10::Stream second = other_stream(0, first);
  const c10::Stream elsewhere = other_stream(last);
  {
    c10::StreamGuard guard(first);
    guard.reset_stream(second);  // same device: only the stream changes
    EXPECT_TRUE(CurrentIs(0)) << "after reset_stream(" << str(second) << ") on the same device";
    EXPECT_TRUE(StreamIs(0, second)) << "after reset_stream(" << str(second) << ")";
    guard.reset_stream(elsewhere);  // another device: restores the first one's stream
    EXPECT_TRUE(CurrentIs(last)) << "after reset_stream(" << str(elsewhere) << ")";
    EXPECT_TRUE(StreamIs(last, elsewhere)) << "after reset_stream(" << str(elsewhere) << ")";
    EXPECT_TRUE(StreamIs(0, before[0]))
        << "after reset_stream(" << str(elsewhere) << "): the stream of " << dev(0)
        << " that the guard had changed must be restored";
  }
  EXPECT_TRUE(CurrentIs(0)) << "after a StreamGuard moved with reset_stream was destroyed";
  EXPECT_TRUE(StreamsAre(before)) << "after a StreamGuard moved with reset_stream was destroyed";
}

TEST_F(GD_STR_001, NestedStreamGuardsRestoreInLifoOrder) {
  // decides GD-STR-001.5
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream a = other_stream(last);
  const c10::Stream b = other_stream(0);
  const c10::Stream c = other_stream(last, a);
  {
    c10::StreamGuard ga(a);
    {
      c10::StreamGuard gb(b);
      {
        c10::StreamGuard gc(c);
        EXPECT_TRUE(CurrentIs(last));
        EXPECT_TRUE(StreamIs(last, c)) << "inside the third nested StreamGuard";
        EXPECT_TRUE(StreamIs(0, b)) << "inside the third nested StreamGuard";
      }
      EXPECT_TRUE(CurrentIs(0)) << "after the third nested StreamGuard ended";
      EXPECT_TRUE(StreamIs(0, b)) << "after the third nested StreamGuard ended";
      EXPECT_TRUE(StreamIs(last, a)) << "after the third nested StreamGuard ended";
    }
    EXPECT_TRUE(CurrentIs(last)) << "after the second nested StreamGuard ended";
    EXPECT_TRUE(StreamIs(last, a)) << "after the second nested StreamGuard ended";
    EXPECT_TRUE(StreamIs(0, before[0])) << "after the second nested StreamGuard ended";
  }
  EXPECT_TRUE(CurrentIs(0)) << "after all nested StreamGuards ended";
  EXPECT_TRUE(StreamsAre(before)) << "after all nested StreamGuards ended";
}

TEST_F(GD_STR_001, OptionalStreamGuard) {
  // decides GD-STR-001.6
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream stream = other_stream(last);
  {
    c10::OptionalStreamGuard guard;  // uninitialized: does nothing at all
    EXPECT_FALSE(guard.original_stream().has_value());
    EXPECT_TRUE(CurrentIs(0));
    EXPECT_TRUE(StreamsAre(before));
  }
  EXPECT_TRUE(CurrentIs(0)) << "after an uninitialized OptionalStreamGuard";
  EXPECT_TRUE(StreamsAre(before)) << "after an uninitialized OptionalStreamGuard";
  {
    c10::OptionalStreamGuard guard(stream);
    EXPECT_TRUE(CurrentIs(last)) << "inside OptionalStreamGuard(" << str(stream) << ")";
    EXPECT_TRUE(StreamIs(last, stream)) << "inside OptionalStreamGuard(" << str(stream) << ")";
    EXPECT_TRUE(StreamIs(0, before[0])) << "inside OptionalStreamGuard(" << str(stream) << ")";
    guard.reset();
    EXPECT_TRUE(CurrentIs(0)) << "after OptionalStreamGuard::reset()";
    EXPECT_TRUE(StreamsAre(before)) << "after OptionalStreamGuard::reset()";
    guard.reset_stream(stream);  // initializes it again
    EXPECT_TRUE(CurrentIs(last)) << "after OptionalStreamGuard::reset_stream(" << str(stream) << ")";
    EXPECT_TRUE(StreamIs(last, stream));
  }
  EXPECT_TRUE(CurrentIs(0)) << "after OptionalStreamGuard(" << str(stream) << ") was destroyed";
  EXPECT_TRUE(StreamsAre(before)) << "after OptionalStreamGuard(" << str(stream) << ") was destroyed";
}

// ------------------------------------------------------------ GD-STR-002

TEST_F(GD_STR_002, ChangesOnlyThatDevicesStreamAndReturnsThePreviousOne) {
  // decides GD-STR-002.1
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  for (const auto& [current, target] :
       {std::pair{0, last}, std::pair{last, 0}, std::pair{0, 0}, std::pair{last, last}}) {
    impl().setDevice(dev(current));
    const auto before = make_non_default_streams_current();
    const c10::Stream stream = other_stream(target);
    const std::string call = "exchangeStream(" + str(stream) + ") on " + str(dev(current));
    const c10::Stream previous = impl().exchangeStream(stream);
    EXPECT_EQ(previous, before[target])
        << call << " returned " << str(previous) << ", not the previous current stream "
        << str(before[target]) << " of " << dev(target);
    EXPECT_TRUE(CurrentIs(current)) << "after " << call << ": exchangeStream must not change "
                                    << "the current device";
    EXPECT_TRUE(StreamIs(target, stream)) << "after " << call;
    for (int i : devices_used()) {
      if (i != target) {
        EXPECT_TRUE(StreamIs(i, before[i]))
            << "after " << call << ": the current stream of another device changed";
      }
    }
    const c10::Stream again = impl().exchangeStream(stream);
    EXPECT_EQ(again, stream) << "exchanging " << str(stream)
                             << " while it is current must return it";
    const c10::Stream back = impl().exchangeStream(previous);
    EXPECT_EQ(back, stream) << "exchangeStream(" << str(previous) << ") returned " << str(back)
                            << ", not the stream made current before";
    EXPECT_TRUE(StreamsAre(before)) << "after exchanging the previous stream back";
    EXPECT_TRUE(CurrentIs(current)) << "after exchanging the previous stream back";
  }
}

// ------------------------------------------------------------ GD-MULTI-001

TEST_F(GD_MULTI_001, SetsEachDevicesStreamKeepsTheDeviceRestoresAll) {
  // decides GD-MULTI-001.1
  PU1C_REQUIRE_DEVICES(2);
  const auto used = devices_used();
  const size_t n = used.size();
  for (int current : {0, used.back()}) {
    impl().setDevice(dev(current));
    const auto before = make_non_default_streams_current();
    std::vector<c10::Stream> streams;
    for (auto i = used.rbegin(); i != used.rend(); ++i) streams.push_back(other_stream(*i));  // not in device order
    {
      c10::MultiStreamGuard guard(streams);
      EXPECT_TRUE(CurrentIs(current)) << "inside a MultiStreamGuard over " << n
                                      << " devices: it must not change the current device";
      for (const auto& s : streams) {
        EXPECT_TRUE(StreamIs(s.device_index(), s)) << "inside a MultiStreamGuard";
      }
    }
    EXPECT_TRUE(CurrentIs(current)) << "after a MultiStreamGuard over " << n << " devices";
    EXPECT_TRUE(StreamsAre(before)) << "after a MultiStreamGuard over " << n << " devices";
  }
}

TEST_F(GD_MULTI_001, LeavesDevicesNotListedAlone) {
  // decides GD-MULTI-001.2
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream stream = other_stream(last);
  {
    c10::MultiStreamGuard guard(std::vector<c10::Stream>{stream});
    EXPECT_TRUE(CurrentIs(0)) << "inside MultiStreamGuard({" << str(stream) << "})";
    EXPECT_TRUE(StreamIs(last, stream)) << "inside MultiStreamGuard({" << str(stream) << "})";
    EXPECT_TRUE(StreamIs(0, before[0])) << "inside MultiStreamGuard({" << str(stream)
                                        << "}): a device not listed changed its stream";
  }
  EXPECT_TRUE(CurrentIs(0));
  EXPECT_TRUE(StreamsAre(before)) << "after MultiStreamGuard({" << str(stream) << "})";
}

TEST_F(GD_MULTI_001, EmptyListIsANoOp) {
  // decides GD-MULTI-001.3
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(last));
  const auto before = make_non_default_streams_current();
  {
    c10::MultiStreamGuard guard(std::vector<c10::Stream>{});
    impl().setDevice(dev(0));
  }
  EXPECT_TRUE(CurrentIs(0)) << "an empty MultiStreamGuard must not restore any device";
  EXPECT_TRUE(StreamsAre(before)) << "after an empty MultiStreamGuard";
}

TEST_F(GD_MULTI_001, RestoresWhenAnExceptionUnwinds) {
  // decides GD-MULTI-001.4
  PU1C_REQUIRE_DEVICES(2);
  const int last = count() - 1;
  impl().setDevice(dev(last));
  const auto before = make_non_default_streams_current();
  const std::vector<c10::Stream> streams = {other_stream(0), other_stream(last)};
  try {
    c10::MultiStreamGuard guard(streams);
    throw Escape();
  } catch (const Escape&) {
  }
  EXPECT_TRUE(CurrentIs(last)) << "after an exception unwound a MultiStreamGuard";
  EXPECT_TRUE(StreamsAre(before)) << "after an exception unwound a MultiStreamGuard";
}

// PyTorch's own check, before the backend is involved: a list mixing device
// types is refused and changes nothing.
TEST_F(GD_MULTI_001, RejectsMixedDeviceTypes) {
  // decides GD-MULTI-001.5
  PU1C_REQUIRE_DEVICES(2);
  impl().setDevice(dev(0));
  const auto before = make_non_default_streams_current();
  const c10::Stream cpu(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  for (const auto& streams : {std::vector<c10::Stream>{other_stream(1), cpu},
                              std::vector<c10::Stream>{cpu, other_stream(1)}}) {
    bool threw = false;
    try {
      c10::MultiStreamGuard guard(streams);
    } catch (const c10::Error& e) {
      threw = true;
      EXPECT_NE(lower(e.what_without_backtrace()).find("mix of device types"), std::string::npos)
          << e.what_without_backtrace();
    }
    EXPECT_TRUE(threw) << "MultiStreamGuard({" << str(streams[0]) << ", " << str(streams[1])
                       << "}) was accepted";
    EXPECT_TRUE(CurrentIs(0));
    EXPECT_TRUE(StreamsAre(before)) << "after a refused MultiStreamGuard";
  }
}

}  // namespace
}  // namespace pu1c
