// c10::Stream <-> OpenReg runtime streams.
//
// Stream ids: 0 is the device's default stream (the runtime's default stream,
// never shared with the pool). Pool streams have id (level << 5) | slot, with
// level 1 for priority 0 and level 2 for priority -1, and 32 slots per level
// handed out round robin, as CUDA does. Pool streams are created on first use.
// The current stream is per thread and per device, and starts as the default.
#pragma once

#include <openreg/runtime.h>

#include <c10/core/Stream.h>

namespace openreg {

constexpr int kStreamsPerPriority = 32;
constexpr int kLeastPriority = 0;      // the default
constexpr int kGreatestPriority = -1;  // most urgent

// Index -1 means the current device. All validate the device index.
c10::Stream default_stream(c10::DeviceIndex index = -1);
// A pool stream with `priority` clamped to [kGreatestPriority, kLeastPriority].
c10::Stream stream_from_pool(c10::DeviceIndex index = -1, int priority = 0);
c10::Stream current_stream(c10::DeviceIndex index = -1);
// Makes `stream` current for its device in this thread; returns the previous
// current stream of that device. Does not change the current device.
c10::Stream exchange_stream(c10::Stream stream);

// The runtime handle for `stream`; throws for streams of another device type,
// invalid devices or unknown ids.
orStream_t native_stream(const c10::Stream& stream);
int stream_priority(const c10::Stream& stream);
// Whether `stream` is capturing a graph (Graph.cpp).
bool is_capturing(const c10::Stream& stream);

// Throws unless `device` is an OpenReg device (argument names the caller).
void check_openreg_device(const c10::Device& device, const char* argument);

}  // namespace openreg
