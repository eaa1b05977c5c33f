#include "DeviceManagement.h"

#include "Exception.h"

#include <c10/util/Exception.h>

namespace openreg {

c10::DeviceIndex device_count() noexcept {
  // The runtime reads its configuration once, so the answer never changes.
  static const c10::DeviceIndex count = [] {
    int n = 0;
    if (orGetDeviceCount(&n) != orSuccess) {
      TORCH_WARN("OpenReg: no devices available: ", orGetLastErrorMessage());
      return static_cast<c10::DeviceIndex>(0);
    }
    return static_cast<c10::DeviceIndex>(n);
  }();
  return count;
}

void check_device_index(c10::DeviceIndex index, const char* argument) {
  const auto count = device_count();
  TORCH_CHECK(count > 0, "OpenReg: ", argument, "=",
                    static_cast<int>(index),
                    " is invalid: there are no OpenReg devices");
  TORCH_CHECK(index >= 0 && index < count, "OpenReg: ", argument, "=",
                    static_cast<int>(index),
                    " is out of range: valid device indices are [0, ",
                    static_cast<int>(count), ")");
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index,
                                      const char* argument) {
  if (index == -1) return current_device();
  check_device_index(index, argument);
  return index;
}

c10::DeviceIndex current_device() {
  int device = 0;
  OPENREG_CHECK(orGetDevice(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex index) {
  check_device_index(index);
  if (index != current_device()) {
    OPENREG_CHECK(orSetDevice(index));
  }
}

c10::DeviceIndex exchange_device(c10::DeviceIndex index) {
  check_device_index(index);
  const auto previous = current_device();
  if (index != previous) {
    OPENREG_CHECK(orSetDevice(index));
  }
  return previous;
}

c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex index) {
  const auto count = device_count();
  if (count == 0) return -1;
  const auto previous = current_device();
  if (index >= 0 && index < count && index != previous) {
    OPENREG_CHECK(orSetDevice(index));
  }
  return previous;
}

bool is_device_initialized(c10::DeviceIndex index) noexcept {
  if (index < 0 || index >= device_count()) return false;
  int initialized = 0;
  return orDeviceIsInitialized(index, &initialized) == orSuccess && initialized;
}

}  // namespace openreg
