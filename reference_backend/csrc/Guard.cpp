// DeviceGuardImplInterface for PrivateUse1: how c10's DeviceGuard, StreamGuard,
// MultiStreamGuard, torch.Stream, torch.Event and torch.accelerator reach us.
#include "Allocator.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Stream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace openreg {

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::Stream;

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  Device exchangeDevice(Device device) const override {
    check_openreg_device(device, "device");
    return Device(kType, exchange_device(device.index()));
  }

  Device getDevice() const override { return Device(kType, current_device()); }

  void setDevice(Device device) const override {
    check_openreg_device(device, "device");
    set_device(device.index());
  }

  // Guard destructors call this: it must never throw, so an invalid device
  // (which no guard could have produced) is ignored: the device stays.
  void uncheckedSetDevice(Device device) const noexcept override {
    const auto count = device_count();
    if (device.type() != kType || device.index() < 0 || device.index() >= count) {
      return;
    }
    int current = -1;
    if (orGetDevice(&current) == orSuccess && current != device.index()) {
      orSetDevice(device.index());
    }
  }

  Stream getStream(Device device) const override {
    check_openreg_device(device, "device");
    return current_stream(device.index());
  }

  Stream getDefaultStream(Device device) const override {
    check_openreg_device(device, "device");
    return default_stream(device.index());
  }

  Stream getStreamFromGlobalPool(Device device, bool isHighPriority) const override {
    check_openreg_device(device, "device");
    return stream_from_pool(device.index(),
                            isHighPriority ? kGreatestPriority : kLeastPriority);
  }

  Stream getNewStream(Device device, int priority) const override {
    check_openreg_device(device, "device");
    return stream_from_pool(device.index(), priority);
  }

  Stream exchangeStream(Stream stream) const override {
    return exchange_stream(stream);
  }

  void* getStreamNativeHandle(const Stream stream) const override {
    return native_stream(stream);
  }

  DeviceIndex deviceCount() const noexcept override { return device_count(); }

  c10::DeviceCapability getDeviceCapability(Device device) const override {
    check_openreg_device(device, "device");
    resolve_device_index(device.index());
    // Tensors of every dtype can live on the device and convert, except the
    // quantized ones (the CPU fallback cannot rebuild quantizers).
    c10::DeviceCapability capability;
    capability.capability_data.supported_scalar_types.has_QInt8 = 0;
    capability.capability_data.supported_scalar_types.has_QUInt8 = 0;
    capability.capability_data.supported_scalar_types.has_QInt32 = 0;
    capability.capability_data.supported_scalar_types.has_QUInt4x2 = 0;
    capability.capability_data.supported_scalar_types.has_QUInt2x4 = 0;
    return capability;
  }

  // Events are created lazily on first record, on the stream's device.
  void record(void** event, const Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(event != nullptr, "OpenReg: record: event slot is null");
    orStream_t native = native_stream(stream);
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "OpenReg: an event of device ", static_cast<int>(device_index),
                " cannot be recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    TORCH_CHECK(flag != c10::EventFlag::INVALID, "OpenReg: record: invalid event flag");
    auto* handle = static_cast<orEvent_t>(*event);
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
    }
    OPENREG_CHECK(orEventRecord(handle, native));
  }

  void block(void* event, const Stream& stream) const override {
    if (!event) return;  // never recorded: nothing to wait for
    OPENREG_CHECK(orStreamWaitEvent(native_stream(stream),
                                    static_cast<orEvent_t>(event)));
  }

  bool queryEvent(void* event) const override {
    if (!event) return true;
    const orError_t status = orEventQuery(static_cast<orEvent_t>(event));
    if (status == orErrorNotReady) return false;
    OPENREG_CHECK(status);
    return true;
  }

  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    if (event) orEventDestroy(static_cast<orEvent_t>(event));
  }

  bool queryStream(const Stream& stream) const override {
    const orError_t status = orStreamQuery(native_stream(stream));
    if (status == orErrorNotReady) return false;
    OPENREG_CHECK(status);
    return true;
  }

  void synchronizeStream(const Stream& stream) const override {
    OPENREG_CHECK(orStreamSynchronize(native_stream(stream)));
  }

  void synchronizeEvent(void* event) const override {
    if (!event) return;
    OPENREG_CHECK(orEventSynchronize(static_cast<orEvent_t>(event)));
  }

  // Waits for the device named, not the current one.
  void synchronizeDevice(const DeviceIndex device_index) const override {
    const auto index = resolve_device_index(device_index, "device_index");
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
    OPENREG_CHECK(orEventElapsedTime(&ms, static_cast<orEvent_t>(start),
                                     static_cast<orEvent_t>(end)));
    return ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

}  // namespace openreg
