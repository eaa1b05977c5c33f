// Random number generators of OpenReg devices.
//
// Each device has one default generator (created on first use). A generator
// keeps its state in a CPU (Mersenne Twister) generator, because the random
// kernels that run on the device are PyTorch's CPU kernels (see Fallback).
// Kernels never touch that state: when a random kernel is launched, the host
// takes the next 624 words of the generator's sequence as the Mersenne
// Twister state of a CPU generator of the kernel's own (kernel_generator),
// as CUDA reserves a range of its counter-based generator at launch. So the
// order of launches alone decides every kernel's numbers, random kernels
// queue like any other, and reading or setting a generator's state never
// waits for the device. Offsets are not supported (like CPU generators) and
// say so.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <functional>

namespace openreg {

// Index -1 means the current device. Both validate the index.
const at::Generator& default_generator(c10::DeviceIndex index = -1);
at::Generator new_generator(c10::DeviceIndex index = -1);

// The CPU generator holding the state of an OpenReg generator. Throws for
// generators of another device type.
at::Generator cpu_state_of(const at::Generator& generator);

// A new CPU generator for one random kernel, made at its launch: its state is
// the next 624 32-bit words drawn from `generator` (an OpenReg generator),
// which advances by exactly that much. `undo()` gives the words back: it sets
// `generator` back to its state before the draw, if no one drew from it
// since (for a call that raises at the host after the draw: bad input
// changes no state). Throws as cpu_state_of.
struct KernelGenerator {
  at::Generator kernel;
  std::function<void()> undo;
};
KernelGenerator kernel_generator(const at::Generator& generator);

}  // namespace openreg
