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

// Every Device-taking method checks the device type first.
void check_type(const Device& device) {
  check_openreg_device(device, "device");
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  // PyTorch enters and exits a DeviceGuard around every operator, so the two
  // methods a guard calls have a fast path for the common case (an openreg
  // device in range): the runtime's thread-local current device, read and
  // written directly. Anything else takes the general path, which produces
  // the errors.
  Device exchangeDevice(Device device) const override {
    const DeviceIndex index = device.index();
    int current = 0;
    if (device.type() == kType && index >= 0 && index < device_count() && orGetDevice(&current) == orSuccess)
        [[likely]] {
      if (current != index) OPENREG_CHECK(orSetDevice(index));
      return Device(kType, static_cast<DeviceIndex>(current));
    }
    check_type(device);
    return Device(kType, exchange_device(index));
  }

  Device getDevice() const override { return Device(kType, current_device()); }

  void setDevice(Device device) const override {
    check_type(device);
    set_device(device.index());
  }

  // Guard destructors call this: it must never throw, so an invalid device
  // (which no guard could have produced) is ignored: the device stays.
  void uncheckedSetDevice(Device device) const noexcept override {
    int current = 0;
    if (device.type() == kType && device.index() >= 0 && device.index() < device_count() &&
        orGetDevice(&current) == orSuccess) [[likely]] {
      if (current != device.index()) orSetDevice(device.index());
      return;
    }
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
    return stream_from_pool(device.index(), priority);
  }

  Stream exchangeStream(Stream stream) const override {
    return exchange_stream(stream);
  }

  DeviceIndex deviceCount() const noexcept override {
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

  bool isStreamCapturing(const Stream& stream) const override {
    int capturing = 0;
    OPENREG_CHECK(orStreamIsCapturing(native_stream(stream), &capturing));
    return capturing != 0;
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
    OPENREG_CHECK(orEventElapsedTime(&ms, static_cast<orEvent_t>(start), static_cast<orEvent_t>(end)));
    return ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

}  // namespace openreg
