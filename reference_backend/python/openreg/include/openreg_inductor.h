// The C interface between kernels that Inductor generates for OpenReg and
// the OpenReg runtime (docs/reference-backend/inductor.md).
//
// Inductor's C++ code generation writes each fused kernel as a plain C
// function over raw pointers, `void kernel(const float* in_ptr0, float*
// out_ptr0, int64_t ks0)`, compiled into a Python extension module of its
// own. For a CPU that module calls the kernel at once with the tensors'
// data pointers. For OpenReg it must not: device memory is not host memory
// (the host faults on it), and device work runs in order on the device's
// streams. So the module OpenReg's backend generates (openreg/_inductor.py)
// packs the call's arguments and *launches* the kernel on the current stream
// of the tensors' device, through this interface; on the stream's worker the
// kernel gets each tensor's kernel-accessible address, as OpenReg's own
// kernels do (runtime.h, orKernelMapPointer).
//
// The generated module gets the interface from the capsule
// `openreg._C._inductor_api` (PyCapsule_Import) and checks `version`. It
// includes no torch header: generated kernels compile in seconds.
#ifndef OPENREG_INDUCTOR_H_
#define OPENREG_INDUCTOR_H_

#include <Python.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPENREG_INDUCTOR_API_VERSION 2
#define OPENREG_INDUCTOR_API_CAPSULE "openreg._C._inductor_api"

// A tensor argument of a kernel call, as the kernel will reach it. A 0-dim
// CPU tensor next to device tensors (PyTorch's type promotion allows it:
// `x * torch.tensor(2.0)`, an optimizer's step counter) is passed by value,
// as a GPU kernel gets a host scalar: its element is read at the launch into
// `value`, and `device` is -1 (it places the kernel on no device).
typedef struct {
  int device;               // the OpenReg device index of its storage; -1 for a host scalar
  const void* storage;      // device address of its storage (NULL if empty or a host scalar)
  size_t storage_nbytes;
  ptrdiff_t offset;         // bytes from `storage` to the tensor's first element
  unsigned char value[16];  // a host scalar's element (complex128 at most)
} OpenRegInductorTensor;

// Runs on the stream's worker: 0, or nonzero after calling fail().
typedef int (*OpenRegInductorKernel)(void* call);

typedef struct {
  int version;  // OPENREG_INDUCTOR_API_VERSION
  // Host side, GIL held: describes `object`, which must be an OpenReg
  // tensor or a 0-dim CPU tensor (a host scalar, read now). 0, or -1 with a
  // Python exception set (a TypeError naming `argument` for anything else,
  // a CPU tensor of more than 0 dimensions included).
  int (*tensor)(PyObject* object, const char* kernel_name, int argument, OpenRegInductorTensor* out);
  // Host side, GIL held: enqueues run(call) on the current stream of
  // `device` and returns at once. release(call) runs after run (on the
  // worker), or here if the launch fails. 0, or -1 with a Python exception.
  // A kernel that fails makes the stream's next synchronization raise its
  // message, as any OpenReg kernel does (CUDA's sticky error model).
  int (*launch)(int device, OpenRegInductorKernel run, void* call, void (*release)(void* call));
  // Worker side, inside run: the kernel-accessible address of the tensor's
  // first element (NULL for an empty storage; `value` for a host scalar), or
  // NULL after fail() when the tensor is not memory of the kernel's device.
  void* (*map)(const OpenRegInductorTensor* tensor, int* failed);
  // Worker side: the message the failing kernel leaves for the stream.
  void (*fail)(const char* message);
} OpenRegInductorApi;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // OPENREG_INDUCTOR_H_
