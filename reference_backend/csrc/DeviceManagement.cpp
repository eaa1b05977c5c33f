#include "DeviceManagement.h"

#include "Exception.h"
#include "Mutants.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <utility>

namespace openreg {

namespace {

// Mutant current-device-process-wide: one current device for the whole
// process instead of the runtime's per-thread one.
std::atomic<int> g_process_device{0};

orError_t switch_device(int index) {
  if (mutant::is("current-device-process-wide")) g_process_device.store(index);
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
  TORCH_CHECK(!mutant::is("range-error-without-range") || (index >= 0 && index < count),
              "OpenReg: invalid device");
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
  // Mutant initial-device-is-last: a thread starts on the last device.
  thread_local bool first_query = true;
  if (mutant::is("initial-device-is-last") && std::exchange(first_query, false)) switch_device(device_count() - 1);
  OPENREG_CHECK(orGetDevice(&device));
  if (mutant::is("current-device-process-wide")) {
    const int shared = g_process_device.load();
    if (shared != device) orSetDevice(shared);  // the runtime follows
    return static_cast<c10::DeviceIndex>(shared);
  }
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex index) {
  if (mutant::is("set-device-ignores-out-of-range") && (index < 0 || index >= device_count())) return;
  if (mutant::is("set-device-bad-index-leaves-device-0") && (index < 0 || index >= device_count())) switch_device(0);
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
  return mutant::is("exchange-returns-new") ? index : previous;
}

c10::DeviceIndex maybe_exchange_device(c10::DeviceIndex index) {
  const auto count = device_count();
  if (count == 0) return -1;
  if (mutant::is("maybe-exchange-minus-one-raises") && index == -1) check_device_index(index);
  const auto previous = current_device();
  if (index >= 0 && index < count && index != previous) {
    OPENREG_CHECK(switch_device(index));
  }
  return previous;
}

void unchecked_set_device(c10::DeviceIndex index) noexcept {
  if (mutant::is("unchecked-set-device-clamps") && index >= device_count()) index = device_count() - 1;
  if (mutant::is("unchecked-set-device-minus-one-selects-0") && index == -1) index = 0;
  if (index < 0 || index >= device_count()) return;
  int current = -1;
  if (orGetDevice(&current) != orSuccess) return;
  if (mutant::is("current-device-process-wide")) current = g_process_device.load();
  if (current != index) switch_device(index);
}

bool is_device_initialized(c10::DeviceIndex index) noexcept {
  if (index < 0 || index >= device_count()) return false;
  int initialized = 0;
  return orDeviceIsInitialized(index, &initialized) == orSuccess && initialized;
}

}  // namespace openreg
