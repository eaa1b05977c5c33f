#include "Stream.h"

#include "DeviceManagement.h"
#include "Exception.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace openreg {

namespace {

constexpr int kLevels = 2;  // pool levels: priority 0 and priority -1
constexpr int kSlotBits = 5;
static_assert((1 << kSlotBits) == kStreamsPerPriority);

struct DevicePool {
  std::once_flag default_once;
  orStream_t default_handle = nullptr;
  std::array<std::array<std::once_flag, kStreamsPerPriority>, kLevels> once;
  std::array<std::array<orStream_t, kStreamsPerPriority>, kLevels> handles{};
  std::array<std::atomic<uint32_t>, kLevels> next{};
};

// One entry per device, created at first use and never destroyed (streams
// are handed around by value and may outlive any owner).
DevicePool& pool(c10::DeviceIndex index) {
  static auto* pools = [] {
    auto* v = new std::vector<std::unique_ptr<DevicePool>>();
    for (int i = 0; i < device_count(); ++i) {
      v->push_back(std::make_unique<DevicePool>());
    }
    return v;
  }();
  return *(*pools)[index];
}

// Current stream id of each device, per thread; 0 (default) until set.
std::vector<c10::StreamId>& current_ids() {
  thread_local std::vector<c10::StreamId> ids(device_count(), 0);
  return ids;
}

int level_of(int priority) { return priority < 0 ? 1 : 0; }

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(c10::DeviceType::PrivateUse1, index), id);
}

// Runs `create` with `index` as the runtime's current device.
orStream_t create_on(c10::DeviceIndex index, int priority) {
  int previous = 0;
  OPENREG_CHECK(orGetDevice(&previous));
  if (previous != index) OPENREG_CHECK(orSetDevice(index));
  orStream_t handle = nullptr;
  orError_t status = orStreamCreateWithPriority(&handle, priority);
  if (previous != index) orSetDevice(previous);
  OPENREG_CHECK(status);
  return handle;
}

}  // namespace

void check_openreg_device(const c10::Device& device, const char* argument) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "OpenReg: ",
              argument, " must be an OpenReg device, but got a ",
              c10::DeviceTypeName(device.type(), /*lower_case=*/true),
              " device");
}

c10::Stream default_stream(c10::DeviceIndex index) {
  index = resolve_device_index(index);
  return make_stream(index, 0);
}

c10::Stream stream_from_pool(c10::DeviceIndex index, int priority) {
  index = resolve_device_index(index);
  const int level = level_of(priority);
  const uint32_t slot = pool(index).next[level]++ % kStreamsPerPriority;
  return make_stream(index, ((level + 1) << kSlotBits) | slot);
}

c10::Stream current_stream(c10::DeviceIndex index) {
  index = resolve_device_index(index);
  return make_stream(index, current_ids()[index]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  native_stream(stream);  // validates before anything changes
  const auto index = stream.device_index();
  auto& ids = current_ids();
  const auto previous = make_stream(index, ids[index]);
  ids[index] = stream.id();
  return previous;
}

orStream_t native_stream(const c10::Stream& stream) {
  check_openreg_device(stream.device(), "stream.device");
  const auto index = stream.device_index();
  check_device_index(index, "stream.device_index");
  const c10::StreamId id = stream.id();
  DevicePool& p = pool(index);
  if (id == 0) {
    std::call_once(p.default_once, [&] {
      OPENREG_CHECK(orStreamGetDefault(index, &p.default_handle));
    });
    return p.default_handle;
  }
  const int64_t level = (id >> kSlotBits) - 1;
  const int64_t slot = id & (kStreamsPerPriority - 1);
  TORCH_CHECK(level >= 0 && level < kLevels && (id >> (kSlotBits + 2)) == 0,
              "OpenReg: stream id ", id, " on device ", static_cast<int>(index),
              " is not an OpenReg stream (ids are 0 for the default stream or "
              "(level << 5 | slot) with level in [1, 2] and slot in [0, 32))");
  std::call_once(p.once[level][slot], [&] {
    p.handles[level][slot] = create_on(index, level == 0 ? kLeastPriority : kGreatestPriority);
  });
  return p.handles[level][slot];
}

int stream_priority(const c10::Stream& stream) {
  native_stream(stream);
  return stream.id() >> kSlotBits == 2 ? kGreatestPriority : kLeastPriority;
}

}  // namespace openreg
