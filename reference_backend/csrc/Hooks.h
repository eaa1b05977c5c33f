#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace openreg {

// How many times PyTorch called the hooks' init() in this process
// (instrumentation for the conformance suite: it must be exactly once).
uint64_t hooks_init_calls();

}  // namespace openreg
