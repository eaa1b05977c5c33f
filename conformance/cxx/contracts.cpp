// The plain-C++ half of the probe in one translation unit (a unity build):
// the GoogleTest contract cases, their runner and the hooks watcher share
// the headers of c10, ATen and GoogleTest, which dominate the compile time,
// so parsing them once instead of once per file cuts the probe's first
// compile. Each file stays readable on its own; probe.cpp (the Python
// bindings, the other translation unit) compiles in parallel with this one.
#include "contracts_guard.cpp"
#include "contracts_stream_guard.cpp"
#include "gtest_runner.cpp"
#include "hooks_watch.cpp"
