// The runtime in either execution mode (OPENREG_EXECUTOR=thread or process;
// docs/reference-backend/executor.md), with Google Benchmark. The mode is
// read once per process: benchmarks/run_all.py runs this program once per
// mode and puts the two side by side.
//
//   openreg_bench_modes <path of the test kernels module> [benchmark flags]
#include <openreg/runtime.h>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::string g_module;

void Check(orError_t e, const char* what) {
  if (e != orSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", what, orGetErrorName(e), orGetLastErrorMessage());
    std::exit(1);
  }
}

orFunction_t Nop() {
  static orFunction_t fn = [] {
    orModule_t module = nullptr;
    Check(orModuleLoad(&module, g_module.c_str()), "orModuleLoad");
    orFunction_t f = nullptr;
    Check(orModuleGetFunction(&f, module, "openreg_test_nop"), "orModuleGetFunction");
    return f;
  }();
  return fn;
}

// Launch an empty kernel and wait for it: the smallest operation a host
// waits for.
void BM_EmptyKernelRoundTrip(benchmark::State& state) {
  orFunction_t fn = Nop();
  for (auto _ : state) {
    Check(orLaunchModuleKernel(nullptr, fn, nullptr, 0), "launch");
    Check(orStreamSynchronize(nullptr), "sync");
  }
}
BENCHMARK(BM_EmptyKernelRoundTrip)->UseRealTime();

// Launch cost per kernel while the stream is busy: 64 launches, one wait.
void BM_LaunchEmptyKernelX64(benchmark::State& state) {
  orFunction_t fn = Nop();
  for (auto _ : state) {
    for (int i = 0; i < 64; ++i) Check(orLaunchModuleKernel(nullptr, fn, nullptr, 0), "launch");
    Check(orStreamSynchronize(nullptr), "sync");
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_LaunchEmptyKernelX64)->UseRealTime();

// Page-aligned host buffers: two buffers a little less than a page apart
// modulo 4 KiB (what two std::vector buffers usually are) would measure
// memmove's 4K-aliasing penalty (docs/performance.md), not the copy path.
struct HostBuffer {
  explicit HostBuffer(size_t bytes, char fill)
      : data(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    if (!data) std::abort();
    std::memset(data, fill, bytes);
  }
  ~HostBuffer() { std::free(data); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* data;
};

void Copy(benchmark::State& state, orMemcpyKind kind) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  void* device = nullptr;
  Check(orMalloc(&device, bytes), "orMalloc");
  HostBuffer host(bytes, 1);
  Check(orMemcpy(device, host.data, bytes, orMemcpyHostToDevice), "warm");
  for (auto _ : state) {
    if (kind == orMemcpyHostToDevice) {
      Check(orMemcpy(device, host.data, bytes, kind), "H2D");
    } else {
      Check(orMemcpy(host.data, device, bytes, kind), "D2H");
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  Check(orFree(device), "orFree");
}

void BM_CopyHostToDevice(benchmark::State& state) { Copy(state, orMemcpyHostToDevice); }
void BM_CopyDeviceToHost(benchmark::State& state) { Copy(state, orMemcpyDeviceToHost); }
BENCHMARK(BM_CopyHostToDevice)->Arg(4 << 10)->Arg(256 << 20)->UseRealTime();
BENCHMARK(BM_CopyDeviceToHost)->Arg(4 << 10)->Arg(256 << 20)->UseRealTime();

// The yardstick of the copies: memcpy between two host buffers.
void BM_HostMemcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  HostBuffer a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(b.data, a.data, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_HostMemcpy)->Arg(4 << 10)->Arg(256 << 20)->UseRealTime();

void BM_MallocFree(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    Check(orMalloc(&p, bytes), "orMalloc");
    Check(orFree(p), "orFree");
  }
}
BENCHMARK(BM_MallocFree)->Arg(4 << 10)->Arg(4 << 20)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: openreg_bench_modes <kernels module> [benchmark flags]\n");
    return 2;
  }
  g_module = argv[1];
  benchmark::Initialize(&argc, argv);  // leaves the module path (unknown to it)
  Check(orDeviceInit(0), "orDeviceInit");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
