// Random number generators of OpenReg devices.
//
// Each device has one default generator (created on first use). A generator
// keeps its state in a CPU (Mersenne Twister) generator, because the random
// kernels that run on the device are PyTorch's CPU kernels (see Fallback):
// they are handed the inner CPU generator, so drawing on a device advances
// exactly that device's generator and nothing else. Offsets are not
// supported (like CPU generators) and say so.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace openreg {

// Index -1 means the current device. Both validate the index.
const at::Generator& default_generator(c10::DeviceIndex index = -1);
at::Generator new_generator(c10::DeviceIndex index = -1);

// The CPU generator holding the state of an OpenReg generator. Throws for
// generators of another device type.
at::Generator cpu_state_of(const at::Generator& generator);

}  // namespace openreg
