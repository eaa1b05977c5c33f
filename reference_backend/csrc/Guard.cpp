// DeviceGuardImplInterface for PrivateUse1: how c10's DeviceGuard, StreamGuard,
// MultiStreamGuard, torch.Stream, torch.Event and torch.accelerator reach us.
#include "Allocator.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Mutants.h"
#include "Stream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

namespace openreg {

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::Stream;

// Every Device-taking method checks the device type first.
void check_type(const Device& device) {
  if (!mutant::is("guard-accepts-other-device-types")) check_openreg_device(device, "device");
}

// Mutant elapsed-time-host-clock: when the host called record() on each event.
std::mutex g_host_times_mutex;
// Mutants device-count-varies and event-pool-exhausts: calls and events so far.
std::atomic<uint64_t> g_count_calls{0};
std::atomic<uint64_t> g_events_made{0};
std::unordered_map<void*, std::chrono::steady_clock::time_point> g_host_times;

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  // PyTorch enters and exits a DeviceGuard around every operator, so the two
  // methods a guard calls have a fast path for the common case (an openreg
  // device in range, no mutant): the runtime's thread-local current device,
  // read and written directly. Anything else takes the general path, which
  // produces the errors.
  Device exchangeDevice(Device device) const override {
    const DeviceIndex index = device.index();
    int current = 0;
    if (device.type() == kType && mutant::selected == nullptr && index >= 0 && index < device_count() &&
        orGetDevice(&current) == orSuccess) [[likely]] {
      if (current != index) OPENREG_CHECK(orSetDevice(index));
      return Device(kType, static_cast<DeviceIndex>(current));
    }
    check_type(device);
    if (mutant::is("guard-redundant-switch")) OPENREG_CHECK(orSetDevice(current_device()));
    if (mutant::is("guard-switch-initializes-device") && index >= 0 && index < device_count()) orDeviceInit(index);
    if (mutant::is("exchange-clamps") && index >= device_count()) return Device(kType, exchange_device(device_count() - 1));
    if (mutant::is("exchange-same-device-returns-0") && index == current_device()) return Device(kType, 0);
    return Device(kType, exchange_device(index));
  }

  Device getDevice() const override { return Device(kType, current_device()); }

  void setDevice(Device device) const override {
    check_type(device);
    if (mutant::is("guard-set-device-noop")) return;
    set_device(device.index());
  }

  // Guard destructors call this: it must never throw, so an invalid device
  // (which no guard could have produced) is ignored: the device stays.
  void uncheckedSetDevice(Device device) const noexcept override {
    int current = 0;
    if (device.type() == kType && mutant::selected == nullptr && device.index() >= 0 &&
        device.index() < device_count() && orGetDevice(&current) == orSuccess) [[likely]] {
      if (current != device.index()) orSetDevice(device.index());
      return;
    }
    if (mutant::is("unchecked-set-device-throws")) set_device(device.index());
    if (mutant::is("unchecked-set-device-checks-type")) check_openreg_device(device, "device");
    if (mutant::is("guard-does-not-restore")) return;
    if (device.type() == kType) unchecked_set_device(device.index());
  }

  Stream getStream(Device device) const override {
    check_type(device);
    return current_stream(device.index());
  }

  Stream getDefaultStream(Device device) const override {
    check_type(device);
    return default_stream(device.index());
  }

  Stream getStreamFromGlobalPool(Device device, bool isHighPriority) const override {
    check_type(device);
    return stream_from_pool(device.index(),
                            isHighPriority ? kGreatestPriority : kLeastPriority);
  }

  Stream getNewStream(Device device, int priority) const override {
    check_type(device);
    if (mutant::is("new-stream-no-index-on-device-0") && device.index() == -1) device = Device(kType, 0);
    TORCH_CHECK(!mutant::is("priority-minus-one-fails") || priority == 0, "OpenReg: priority ", priority, " failed");
    if (mutant::is("bad-priority-crashes") && (priority < kGreatestPriority || priority > kLeastPriority)) std::abort();
    return stream_from_pool(device.index(), priority);
  }

  Stream exchangeStream(Stream stream) const override {
    return exchange_stream(foreign_as_openreg(stream));
  }

  // Mutant guard-accepts-foreign-stream: a stream of another type is taken
  // for the OpenReg stream with the same index and id.
  static Stream foreign_as_openreg(Stream stream) {
    if (!mutant::is("guard-accepts-foreign-stream") || stream.device_type() == kType) return stream;
    return Stream(Stream::UNSAFE, Device(kType, stream.device_index()), stream.id());
  }

  DeviceIndex deviceCount() const noexcept override {
    if (mutant::is("device-count-varies") && g_count_calls.fetch_add(1) % 97 == 96) return device_count() - 1;
    return device_count();
  }

  void* getStreamNativeHandle(const Stream stream) const override {
    return native_stream(stream);
  }

  c10::DeviceCapability getDeviceCapability(Device device) const override {
    check_type(device);
    resolve_device_index(device.index());
    // torch.accelerator.get_device_capability documents a supported dtype
    // as one whose tensors can be allocated on the device and converted to
    // and from the other supported dtypes. The device's kernels are the
    // CPU's, so that is every dtype CPU copy_ converts. Not claimed:
    //  * the quantized dtypes (the CPU fallback cannot rebuild quantizers);
    //  * the sub-byte integers int1..int7 and uint1..uint7, placeholders
    //    without any kernel;
    //  * the bits dtypes and float4_e2m1fn_x2: they can be allocated and
    //    copied as they are, but convert to no other dtype, on the CPU either.
    c10::DeviceCapability capability;  // every dtype claimed
    // Mutant capability-claims-every-dtype: the default-constructed answer.
    if (mutant::is("capability-claims-every-dtype")) return capability;
    auto& types = capability.capability_data.supported_scalar_types;
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = 0;
    types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
    types.has_Int1 = types.has_Int2 = types.has_Int3 = types.has_Int4 = 0;
    types.has_Int5 = types.has_Int6 = types.has_Int7 = 0;
    types.has_UInt1 = types.has_UInt2 = types.has_UInt3 = types.has_UInt4 = 0;
    types.has_UInt5 = types.has_UInt6 = types.has_UInt7 = 0;
    types.has_Bits1x8 = types.has_Bits2x4 = types.has_Bits4x2 = 0;
    types.has_Bits8 = types.has_Bits16 = 0;
    types.has_Float4_e2m1fn_x2 = 0;
    return capability;
  }

  // Events are created lazily on first record, on the stream's device.
  void record(void** event, const Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(event != nullptr, "OpenReg: record: event slot is null");
    orStream_t native = native_stream(stream);
    if (mutant::is("rejected-record-moves-event") && *event && device_index != stream.device_index()) {
      // Records on the other device first, then refuses: the event has moved.
      orEventDestroy(static_cast<orEvent_t>(*event));
      orEvent_t moved = nullptr;
      const auto previous = exchange_device(stream.device_index());
      orEventCreateWithFlags(&moved, orEventDisableTiming);
      maybe_exchange_device(previous);
      orEventRecord(moved, native);
      *event = moved;
    }
    const bool any_device = mutant::is("event-records-on-any-device");
    TORCH_CHECK(any_device || device_index == -1 || device_index == stream.device_index(),
                "OpenReg: an event of device ", static_cast<int>(device_index),
                " cannot be recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    TORCH_CHECK(flag != c10::EventFlag::INVALID, "OpenReg: record: invalid event flag");
    auto* handle = static_cast<orEvent_t>(*event);
    if (handle && any_device) orEventDestroy(handle), handle = nullptr;  // made anew below
    TORCH_CHECK(!mutant::is("event-pool-exhausts") || handle || g_events_made.fetch_add(1) < 8000,
                "OpenReg: out of events");
    if (!handle) {
      const unsigned flags = flag == c10::EventFlag::BACKEND_DEFAULT
          ? orEventDefault
          : orEventDisableTiming;
      const auto previous = exchange_device(stream.device_index());
      const orError_t status = orEventCreateWithFlags(&handle, flags);
      maybe_exchange_device(previous);
      OPENREG_CHECK(status);
      *event = handle;
    } else {
      int event_device = -1;
      OPENREG_CHECK(orEventGetDevice(handle, &event_device));
      TORCH_CHECK(event_device == stream.device_index(),
                  "OpenReg: an event of device ", event_device,
                  " cannot be recorded on a stream of device ",
                  static_cast<int>(stream.device_index()));
      if (mutant::is("event-rerecord-ignored")) return;
    }
    if (mutant::is("event-record-on-default-stream")) native = native_stream(default_stream(stream.device_index()));
    OPENREG_CHECK(orEventRecord(handle, native));
    if (mutant::is("elapsed-time-host-clock")) {
      std::lock_guard<std::mutex> lock(g_host_times_mutex);
      g_host_times[handle] = std::chrono::steady_clock::now();
    }
  }

  void block(void* event, const Stream& stream) const override {
    if (!event) return;  // never recorded: nothing to wait for
    if (mutant::is("stream-wait-is-noop")) return;
    OPENREG_CHECK(orStreamWaitEvent(native_stream(stream),
                                    static_cast<orEvent_t>(event)));
  }

  bool queryEvent(void* event) const override {
    if (!event) return true;
    if (mutant::is("event-complete-before-work")) return true;
    const orError_t status = orEventQuery(static_cast<orEvent_t>(event));
    if (status == orErrorNotReady) return false;
    OPENREG_CHECK(status);
    return true;
  }

  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    if (event && !mutant::is("event-destroy-leaks")) orEventDestroy(static_cast<orEvent_t>(event));
  }

  bool queryStream(const Stream& stream) const override {
    if (mutant::is("stream-query-always-true")) return true;
    const orError_t status = orStreamQuery(native_stream(foreign_as_openreg(stream)));
    if (status == orErrorNotReady) return false;
    OPENREG_CHECK(status);
    return true;
  }

  void synchronizeStream(const Stream& stream) const override {
    if (mutant::is("stream-synchronize-returns-early")) return;
    OPENREG_CHECK(orStreamSynchronize(native_stream(foreign_as_openreg(stream))));
  }

  bool isStreamCapturing(const Stream& stream) const override {
    if (mutant::is("stream-capturing-always-false")) return false;
    int capturing = 0;
    OPENREG_CHECK(orStreamIsCapturing(native_stream(foreign_as_openreg(stream)), &capturing));
    return capturing != 0;
  }

  void synchronizeEvent(void* event) const override {
    if (!event) return;
    if (mutant::is("event-synchronize-returns-early")) return;
    OPENREG_CHECK(orEventSynchronize(static_cast<orEvent_t>(event)));
  }

  // Waits for the device named, not the current one.
  void synchronizeDevice(const DeviceIndex device_index) const override {
    auto index = resolve_device_index(device_index, "device_index");
    if (mutant::is("synchronize-current-device")) index = current_device();
    if (mutant::is("device-synchronize-switches-device")) set_device(index);
    if (mutant::is("device-synchronize-current-stream-only")) {
      OPENREG_CHECK(orStreamSynchronize(native_stream(current_stream(index))));
      return;
    }
    OPENREG_CHECK(orDeviceSynchronize(index));
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const Stream& stream) const override {
    record_stream(data_ptr, stream);
  }

  double elapsedTime(void* start, void* end,
                     const DeviceIndex device_index) const override {
    TORCH_CHECK(start && end, "OpenReg: both events must be recorded before "
                "calculating elapsed time");
    float ms = 0;
    OPENREG_CHECK(orEventElapsedTime(&ms, static_cast<orEvent_t>(start), static_cast<orEvent_t>(end)));
    if (mutant::is("elapsed-time-in-microseconds")) return ms * 1000.0;
    if (mutant::is("elapsed-time-zero")) return 0.0;
    if (mutant::is("elapsed-time-host-clock")) {
      std::lock_guard<std::mutex> lock(g_host_times_mutex);
      return std::chrono::duration<double, std::milli>(g_host_times[end] - g_host_times[start]).count();
    }
    return ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

}  // namespace openreg
