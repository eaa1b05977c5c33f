// The five device-management functions of the accelerator integration docs,
// over the OpenReg runtime. Every entry point that takes a device index
// validates it with check_device_index, so all of them report the same error.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace openreg {

// Number of devices; 0 (with a one-time warning) if the runtime is
// misconfigured. Never throws.
c10::DeviceIndex device_count() noexcept;

// Why there are no devices: the runtime's configuration error (naming the
// environment variable and its valid values) or "OPENREG_DEVICE_COUNT=0".
std::string no_devices_reason();

// Throws c10::Error (RuntimeError in Python) naming `argument`, the given index
// and the valid range [0, device_count()).
void check_device_index(c10::DeviceIndex index, const char* argument = "device");

// Resolves -1 to the current device, then validates.
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index,
                                      const char* argument = "device");

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
// Sets `index` and returns the previous device. Performs no runtime call when
// `index` is already current.
c10::DeviceIndex exchange_device(c10::DeviceIndex index);
// -1 or an invalid index: no change, returns the current device. Otherwise
// like exchange_device. Never throws for a bad index.
c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex index);

// What guard destructors need: switches to `index` if it is a valid device
// and not already current; ignores anything else. Never throws.
void unchecked_set_device(c10::DeviceIndex index) noexcept;

// Whether the runtime has initialized `index` (a "primary context").
// Never initializes; false for invalid indices.
bool is_device_initialized(c10::DeviceIndex index) noexcept;

}  // namespace openreg
