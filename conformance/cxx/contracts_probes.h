// Probes of the C++ contract tests that Python calls directly (the rules they
// serve are observed from Python, e.g. with the backend's instrumentation).
#pragma once

#include <string>

namespace pu1c {

// GD-DEV-002: `repeats` times, guard the current device with the guard
// `kind` ("DeviceGuard", "nested DeviceGuard", "OptionalDeviceGuard",
// "StreamGuard") and let it go.
void guard_current_device(const std::string& kind, int repeats);

// GD-DEV-002 (counter liveness): one DeviceGuard to device `index`.
void guard_other_device(int index);

}  // namespace pu1c
