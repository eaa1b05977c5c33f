// Device management from C++: OpenReg's functions and c10::DeviceGuard next
// to a plain thread-local read/write, the floor any implementation pays.
// Run through benchmarks/run_all.py (which also runs the Python side).
#include <DeviceManagement.h>

#include <benchmark/benchmark.h>
#include <c10/core/DeviceGuard.h>

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

}  // namespace

BENCHMARK_MAIN();
