// Module kernels for the runtime's tests (test_process_mode.cpp): a module
// uses nothing but runtime.h's kernel ABI, so the same kernels run in the
// host's stream workers (thread mode) and in executors (process mode).
#include <openreg/runtime.h>

#include "test_kernels_params.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <ctime>

namespace {

template <typename T>
orError_t map(const orKernelContext* ctx, uint64_t device_ptr, size_t bytes, T** out) {
  void* p = nullptr;
  orError_t e = ctx->map_pointer(reinterpret_cast<const void*>(device_ptr), bytes, &p);
  *out = static_cast<T*>(p);
  return e;
}

using openreg_test_kernels::AddParams;
using openreg_test_kernels::FillParams;
using openreg_test_kernels::PointerParams;

}  // namespace

extern "C" {

// dst[i] = value for i < count (uint32 elements).
orError_t openreg_test_fill_u32(const orKernelContext* ctx, const void* params, size_t size) {
  if (size != sizeof(FillParams)) return orErrorInvalidValue;
  FillParams p;
  std::memcpy(&p, params, sizeof(p));
  uint32_t* dst = nullptr;
  if (orError_t e = map(ctx, p.dst, p.count * 4, &dst)) return e;
  for (uint64_t i = 0; i < p.count; ++i) dst[i] = p.value;
  return orSuccess;
}

// dst[i] = src[i] + addend.
orError_t openreg_test_add_u32(const orKernelContext* ctx, const void* params, size_t size) {
  if (size != sizeof(AddParams)) return orErrorInvalidValue;
  AddParams p;
  std::memcpy(&p, params, sizeof(p));
  uint32_t* dst = nullptr;
  uint32_t* src = nullptr;
  if (orError_t e = map(ctx, p.dst, p.count * 4, &dst)) return e;
  if (orError_t e = map(ctx, p.src, p.count * 4, &src)) return e;
  for (uint64_t i = 0; i < p.count; ++i) dst[i] = src[i] + p.addend;
  return orSuccess;
}

// *ptr = {the kernel's process id, its device} (two int32).
orError_t openreg_test_where(const orKernelContext* ctx, const void* params, size_t size) {
  if (size != sizeof(PointerParams)) return orErrorInvalidValue;
  PointerParams p;
  std::memcpy(&p, params, sizeof(p));
  int32_t* out = nullptr;
  if (orError_t e = map(ctx, p.ptr, 8, &out)) return e;
  out[0] = static_cast<int32_t>(getpid());
  out[1] = ctx->device;
  return orSuccess;
}

// Fails with a message.
orError_t openreg_test_fail(const orKernelContext* ctx, const void*, size_t) {
  ctx->set_error("openreg_test_fail failed on purpose");
  return orErrorKernelFailed;
}

// Writes to an unmapped address: kills the process it runs in with SIGSEGV.
// The default action is restored first, so that a sanitizer's handler (in
// the sanitizer builds) does not turn the signal into an exit status.
orError_t openreg_test_crash(const orKernelContext*, const void*, size_t) {
  std::signal(SIGSEGV, SIG_DFL);
  volatile int* unmapped = reinterpret_cast<volatile int*>(uintptr_t{16});
  *unmapped = 1;
  return orSuccess;
}

// Waits until the uint32 at *ptr is not zero (a gate the host opens by
// copying to it on another stream).
orError_t openreg_test_gate(const orKernelContext* ctx, const void* params, size_t size) {
  if (size != sizeof(PointerParams)) return orErrorInvalidValue;
  PointerParams p;
  std::memcpy(&p, params, sizeof(p));
  uint32_t* flag = nullptr;
  if (orError_t e = map(ctx, p.ptr, 4, &flag)) return e;
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0) {
    timespec pause{0, 200000};
    nanosleep(&pause, nullptr);
  }
  return orSuccess;
}

// Maps a pointer it was not given (the context must refuse it).
orError_t openreg_test_map_host(const orKernelContext* ctx, const void* params, size_t) {
  void* p = nullptr;
  return ctx->map_pointer(params, 4, &p);
}

}  // extern "C"

extern "C" {

// Does nothing: the benchmarks' empty kernel.
orError_t openreg_test_nop(const orKernelContext*, const void*, size_t) { return orSuccess; }

}  // extern "C"
