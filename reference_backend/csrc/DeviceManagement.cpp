#include "DeviceManagement.h"

#include "Exception.h"

#include <c10/util/Exception.h>


namespace openreg {

namespace {

// Every change of the calling thread's current device goes through here.
orError_t switch_device(int index) {
  return orSetDevice(index);
}

}  // namespace

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

std::string no_devices_reason() {
  int n = 0;
  if (orGetDeviceCount(&n) != orSuccess) {
    // "orGetDeviceCount: OPENREG_DEVICE_COUNT='x' is invalid: expected ..."
    std::string message = orGetLastErrorMessage();
    const auto colon = message.find(": ");
    if (colon != std::string::npos) message.erase(0, colon + 2);
    return "there are no OpenReg devices because " + message;
  }
  return "there are no OpenReg devices (OPENREG_DEVICE_COUNT=0)";
}

void check_device_index(c10::DeviceIndex index, const char* argument) {
  const auto count = device_count();
  TORCH_CHECK(count > 0, "OpenReg: ", argument, "=",
                    static_cast<int>(index),
                    " is invalid: ", no_devices_reason());
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
    OPENREG_CHECK(switch_device(index));
  }
}

c10::DeviceIndex exchange_device(c10::DeviceIndex index) {
  check_device_index(index);
  const auto previous = current_device();
  if (index != previous) {
    OPENREG_CHECK(switch_device(index));
  }
  return previous;
}

c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex index) {
  const auto count = device_count();
  if (count == 0) return -1;
  const auto previous = current_device();
  if (index >= 0 && index < count && index != previous) {
    OPENREG_CHECK(switch_device(index));
  }
  return previous;
}

void unchecked_set_device(c10::DeviceIndex index) noexcept {
  if (index < 0 || index >= device_count()) return;
  int current = -1;
  if (orGetDevice(&current) != orSuccess) return;
  if (current != index) switch_device(index);
}

bool is_device_initialized(c10::DeviceIndex index) noexcept {
  if (index < 0 || index >= device_count()) return false;
  int initialized = 0;
  return orDeviceIsInitialized(index, &initialized) == orSuccess && initialized;
}

}  // namespace openreg
