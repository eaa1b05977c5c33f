// Device management from C++: OpenReg's functions and c10::DeviceGuard next
// to a plain thread-local read/write, the floor any implementation pays; and
// the device allocator without Python in the way, next to malloc/free.
// Run through benchmarks/run_all.py (which also runs the Python side).
#include <DeviceManagement.h>
#include <openreg/runtime.h>

#include <benchmark/benchmark.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>

#include <cstdlib>

namespace {

thread_local int tls_value = 0;

// The floor: what a per-thread "current device" costs at the very least.
void BM_ThreadLocalReadWrite(benchmark::State& state) {
  for (auto _ : state) {
    int v = tls_value;
    benchmark::DoNotOptimize(v);
    tls_value = v ^ 1;
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_ThreadLocalReadWrite);

void BM_CurrentDevice(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(openreg::current_device());
}
BENCHMARK(BM_CurrentDevice);

void BM_SetDeviceSame(benchmark::State& state) {
  for (auto _ : state) openreg::set_device(0);
}
BENCHMARK(BM_SetDeviceSame);

void BM_ExchangeDeviceBackAndForth(benchmark::State& state) {
  for (auto _ : state) {
    openreg::exchange_device(1);
    openreg::exchange_device(0);
  }
}
BENCHMARK(BM_ExchangeDeviceBackAndForth);

// Enter + exit of the guard PyTorch's kernels use, to the current device.
void BM_DeviceGuardSameDevice(benchmark::State& state) {
  const c10::Device device(c10::DeviceType::PrivateUse1, 0);
  for (auto _ : state) {
    c10::DeviceGuard guard(device);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DeviceGuardSameDevice);

// The framework's own floor: the same guard over a backend whose guard
// implementation does nothing (PyTorch's NoOpDeviceGuardImpl, for Meta).
void BM_DeviceGuardNoOpImpl(benchmark::State& state) {
  const c10::Device device(c10::DeviceType::Meta, 0);
  for (auto _ : state) {
    c10::DeviceGuard guard(device);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DeviceGuardNoOpImpl);

// Enter + exit to another device: two real switches.
void BM_DeviceGuardOtherDevice(benchmark::State& state) {
  const c10::Device device(c10::DeviceType::PrivateUse1, 1);
  for (auto _ : state) {
    c10::DeviceGuard guard(device);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DeviceGuardOtherDevice);

// Allocate + free through the allocator PyTorch uses for openreg tensors
// (the caching allocator: after the first pair, a block from the cache).
void BM_CachingAllocatorPair(benchmark::State& state) {
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  const auto bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    c10::DataPtr block = allocator->allocate(bytes);
    benchmark::DoNotOptimize(block.get());
  }
}
BENCHMARK(BM_CachingAllocatorPair)->Arg(4 << 10)->Arg(1 << 20);

// The same pair straight from the runtime: what every allocation would cost
// without the cache (a memfd range mapped twice, then unmapped).
void BM_RuntimeMallocFree(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* ptr = nullptr;
    if (orMalloc(&ptr, bytes) != orSuccess) {
      state.SkipWithError(orGetLastErrorMessage());
      break;
    }
    benchmark::DoNotOptimize(ptr);
    orFree(ptr);
  }
}
BENCHMARK(BM_RuntimeMallocFree)->Arg(4 << 10)->Arg(1 << 20);

// The host baseline: glibc malloc/free of the same size.
void BM_HostMallocFree(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* ptr = std::malloc(bytes);
    benchmark::DoNotOptimize(ptr);
    std::free(ptr);
  }
}
BENCHMARK(BM_HostMallocFree)->Arg(4 << 10)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
