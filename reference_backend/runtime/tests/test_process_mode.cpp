// Module kernels (both execution modes) and process mode
// (OPENREG_EXECUTOR=process): devices as executor processes that own their
// memory, and what happens when one dies.
#include "test_helpers.h"
#include "test_kernels_params.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace openreg_test {
namespace {

using openreg_test_kernels::AddParams;
using openreg_test_kernels::FillParams;
using openreg_test_kernels::PointerParams;

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// The test module's kernel `name` (tests/test_kernels_module.cpp).
orError_t Kernel(const char* name, orFunction_t* fn) {
  orModule_t module = nullptr;
  if (orError_t e = orModuleLoad(&module, OPENREG_TEST_KERNELS_MODULE)) return e;
  return orModuleGetFunction(fn, module, name);
}

template <typename Params>
orError_t Launch(orStream_t stream, const char* name, const Params& params) {
  orFunction_t fn = nullptr;
  if (orError_t e = Kernel(name, &fn)) return e;
  return orLaunchModuleKernel(stream, fn, &params, sizeof(params));
}

std::vector<uint32_t> ReadU32(const void* device_ptr, size_t count) {
  std::vector<uint32_t> out(count, 0);
  orMemcpy(out.data(), device_ptr, count * 4, orMemcpyDeviceToHost);
  return out;
}

// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
bool Ended(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// Waits for `pid` to end; the bound only turns a hang into a failure.
bool EndsWithin(int pid, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!Ended(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// ------------------------------------------------- module kernels (thread mode)

class ModuleKernelTest : public RuntimeTest {};

TEST_F(ModuleKernelTest, RunsWithCopiedParametersInTheStreamOrder) {
  constexpr size_t kCount = 1000;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_OK(orMalloc(&a, kCount * 4));
  ASSERT_OK(orMalloc(&b, kCount * 4));
  orStream_t stream = nullptr;
  ASSERT_OK(orStreamCreate(&stream));
  Gate gate;
  ASSERT_OK(gate.Block(stream));
  FillParams fill{Addr(a), kCount, 7};
  ASSERT_OK(Launch(stream, "openreg_test_fill_u32", fill));
  fill.value = 1000;  // the launch copied the parameters
  ASSERT_OK(Launch(stream, "openreg_test_add_u32", AddParams{Addr(b), Addr(a), kCount, 5}));
  EXPECT_EQ(orStreamQuery(stream), orErrorNotReady);
  gate.Open();
  ASSERT_OK(orStreamSynchronize(stream));
  EXPECT_EQ(ReadU32(b, kCount), std::vector<uint32_t>(kCount, 12));
  ASSERT_OK(orStreamDestroy(stream));
  EXPECT_OK(orFree(a));
  EXPECT_OK(orFree(b));
}

TEST_F(ModuleKernelTest, RunsInThisProcessInThreadMode) {
  int process = -1;
  ASSERT_OK(orGetExecutionMode(&process));
  if (process) GTEST_SKIP() << "the tests run in process mode";
  void* out = nullptr;
  ASSERT_OK(orMalloc(&out, 8));
  ASSERT_OK(Launch(nullptr, "openreg_test_where", PointerParams{Addr(out)}));
  ASSERT_OK(orStreamSynchronize(nullptr));
  std::vector<uint32_t> where = ReadU32(out, 2);
  EXPECT_EQ(static_cast<int>(where[0]), getpid());
  EXPECT_EQ(where[1], 0u);
  int pid = 0;
  EXPECT_FAILS(orDeviceGetExecutorPid(0, &pid), orErrorNotSupported, "orDeviceGetExecutorPid",
               "thread mode");
  EXPECT_OK(orFree(out));
}

TEST_F(ModuleKernelTest, AFailingKernelFailsTheStreamWithItsMessage) {
  ASSERT_OK(Launch(nullptr, "openreg_test_fail", PointerParams{0}));
  EXPECT_FAILS(orStreamSynchronize(nullptr), orErrorKernelFailed,
               "openreg_test_fail failed on purpose");
  EXPECT_OK(orStreamSynchronize(nullptr));  // reported once
  // The context maps nothing but memory of the kernel's device.
  ASSERT_OK(Launch(nullptr, "openreg_test_map_host", PointerParams{0}));
  EXPECT_FAILS(orStreamSynchronize(nullptr), orErrorKernelFailed, "not OpenReg device memory");
}

TEST_F(ModuleKernelTest, RejectsBadArgumentsAtTheCall) {
  orModule_t module = nullptr;
  EXPECT_FAILS(orModuleLoad(nullptr, "x"), orErrorInvalidValue, "orModuleLoad", "module");
  EXPECT_FAILS(orModuleLoad(&module, ""), orErrorInvalidValue, "orModuleLoad", "path");
  EXPECT_FAILS(orModuleLoad(&module, "/nonexistent/openreg_module.so"), orErrorInvalidValue,
               "orModuleLoad", "/nonexistent/openreg_module.so");
  ASSERT_OK(orModuleLoad(&module, OPENREG_TEST_KERNELS_MODULE));
  orModule_t again = nullptr;
  ASSERT_OK(orModuleLoad(&again, OPENREG_TEST_KERNELS_MODULE));
  EXPECT_EQ(module, again);
  orFunction_t fn = nullptr;
  EXPECT_FAILS(orModuleGetFunction(&fn, module, "no_such_kernel"), orErrorInvalidValue,
               "orModuleGetFunction", "no_such_kernel");
  int not_a_module = 0;
  EXPECT_FAILS(orModuleGetFunction(&fn, reinterpret_cast<orModule_t>(&not_a_module), "k"),
               orErrorInvalidHandle, "orModuleGetFunction", "module=");
  ASSERT_OK(orModuleGetFunction(&fn, module, "openreg_test_fill_u32"));
  std::vector<char> big(OR_MAX_KERNEL_PARAMS + 1);
  const uint64_t launched = [] {
    orDebugCounters c{};
    orGetDebugCounters(&c);
    return c.kernels_launched;
  }();
  EXPECT_FAILS(orLaunchModuleKernel(nullptr, fn, big.data(), big.size()), orErrorInvalidValue,
               "orLaunchModuleKernel", "params_size=32769", "32768");
  EXPECT_FAILS(orLaunchModuleKernel(nullptr, fn, nullptr, 8), orErrorInvalidValue,
               "orLaunchModuleKernel", "params is null");
  EXPECT_FAILS(orLaunchModuleKernel(nullptr, reinterpret_cast<orFunction_t>(&not_a_module),
                                    nullptr, 0),
               orErrorInvalidHandle, "orLaunchModuleKernel", "function=");
  orDebugCounters c{};
  orGetDebugCounters(&c);
  EXPECT_EQ(c.kernels_launched, launched) << "a refused launch launched nothing";
}

// ------------------------------------------------------------ process mode

void UseProcessMode(const char* device_count) {
  setenv("OPENREG_EXECUTOR", "process", 1);
  setenv("OPENREG_DEVICE_COUNT", device_count, 1);
  setenv("OPENREG_DEVICE_MEMORY", "256M", 1);
  DisableCoreDumps();
}

[[noreturn]] void CheckProcessModeRunsDevicesInExecutors() {
  UseProcessMode("2");
  ChildReport report;
  int process = 0;
  report.ExpectOk(orGetExecutionMode(&process), "orGetExecutionMode");
  report.Expect(process == 1, "process mode is on");
  constexpr size_t kBytes = (size_t{3} << 20) + 123;
  void* a = nullptr;
  void* b = nullptr;
  report.ExpectOk(orMalloc(&a, kBytes), "orMalloc a on device 0");
  report.ExpectOk(orMalloc(&b, kBytes), "orMalloc b on device 0");
  int pid0 = -1;
  report.ExpectOk(orDeviceGetExecutorPid(0, &pid0), "orDeviceGetExecutorPid(0)");
  report.Expect(pid0 > 0 && pid0 != getpid(), "device 0 has an executor process of its own");

  // Copies in every direction, and memset, move the right bytes.
  const std::vector<unsigned char> pattern = Pattern(kBytes, 3);
  report.ExpectOk(orMemcpy(a, pattern.data(), kBytes, orMemcpyHostToDevice), "H2D");
  report.Expect(ReadDevice(a, kBytes) == pattern, "D2H reads what H2D wrote");
  report.ExpectOk(orMemcpy(b, a, kBytes, orMemcpyDeviceToDevice), "D2D on device 0");
  report.Expect(ReadDevice(b, kBytes) == pattern, "D2D copied every byte");
  report.ExpectOk(orMemsetAsync(static_cast<char*>(b) + 10, 0xab, 100, nullptr), "memset");
  std::vector<unsigned char> expected = pattern;
  std::fill(expected.begin() + 10, expected.begin() + 110, 0xab);
  report.Expect(ReadDevice(b, kBytes) == expected, "memset wrote its range only");

  // A peer copy between the two executors.
  report.ExpectOk(orSetDevice(1), "orSetDevice(1)");
  void* c = nullptr;
  report.ExpectOk(orMalloc(&c, kBytes), "orMalloc c on device 1");
  int pid1 = -1;
  report.ExpectOk(orDeviceGetExecutorPid(1, &pid1), "orDeviceGetExecutorPid(1)");
  report.Expect(pid1 > 0 && pid1 != pid0 && pid1 != getpid(), "device 1 has its own executor");
  report.ExpectOk(orMemcpy(c, b, kBytes, orMemcpyDeviceToDevice), "D2D device 0 -> 1");
  report.Expect(ReadDevice(c, kBytes) == expected, "the peer copy moved every byte");

  // Kernels run in the executor, in stream order behind a gate, and events
  // order another stream after them.
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  void* where = nullptr;
  void* flag = nullptr;
  report.ExpectOk(orMalloc(&where, 8), "orMalloc where");
  report.ExpectOk(orMalloc(&flag, 4), "orMalloc flag");
  report.ExpectOk(orMemsetAsync(flag, 0, 4, nullptr), "clear the gate flag");
  report.ExpectOk(orStreamSynchronize(nullptr), "sync");
  orStream_t s1 = nullptr, s2 = nullptr, opener = nullptr;
  report.ExpectOk(orStreamCreate(&s1), "orStreamCreate s1");
  report.ExpectOk(orStreamCreate(&s2), "orStreamCreate s2");
  report.ExpectOk(orStreamCreate(&opener), "orStreamCreate opener");
  orEvent_t done = nullptr;
  report.ExpectOk(orEventCreate(&done), "orEventCreate");
  report.ExpectOk(Launch(s1, "openreg_test_gate", PointerParams{Addr(flag)}), "gate kernel");
  report.ExpectOk(Launch(s1, "openreg_test_fill_u32", FillParams{Addr(a), 1000, 41}), "fill");
  report.ExpectOk(orEventRecord(done, s1), "record");
  report.ExpectOk(orStreamWaitEvent(s2, done), "s2 waits for s1");
  report.ExpectOk(Launch(s2, "openreg_test_add_u32", AddParams{Addr(b), Addr(a), 1000, 1}),
                  "add on s2");
  report.ExpectOk(Launch(s2, "openreg_test_where", PointerParams{Addr(where)}), "where on s2");
  report.Expect(orStreamQuery(s1) == orErrorNotReady, "s1 is held by its gate");
  report.Expect(orStreamQuery(s2) == orErrorNotReady, "s2 waits for s1's event");
  report.Expect(orEventQuery(done) == orErrorNotReady, "the event is pending");
  const uint32_t one = 1;
  report.ExpectOk(orMemcpyAsync(flag, &one, 4, orMemcpyHostToDevice, opener), "open the gate");
  report.ExpectOk(orStreamSynchronize(s2), "sync s2");
  report.Expect(ReadU32(b, 1000) == std::vector<uint32_t>(1000, 42), "add ran after fill");
  const std::vector<uint32_t> w = ReadU32(where, 2);
  report.Expect(static_cast<int>(w[0]) == pid0, "the kernel ran in device 0's executor");
  report.Expect(w[1] == 0, "the kernel's context names device 0");

  // A failing kernel fails its stream with its message.
  report.ExpectOk(Launch(s1, "openreg_test_fail", PointerParams{0}), "failing kernel");
  report.ExpectFails(orStreamSynchronize(s1), orErrorKernelFailed,
                     {"openreg_test_fail failed on purpose"}, "the kernel's error");

  // Stream memory operations run where streams are ordered, in both modes.
  uint32_t gate = 0, reached = 0;
  report.ExpectOk(orStreamWaitValue32(s1, &gate, 1), "orStreamWaitValue32");
  report.ExpectOk(orStreamWriteValue32(s1, &reached, 7), "orStreamWriteValue32");
  report.Expect(orStreamQuery(s1) == orErrorNotReady, "the wait holds the stream");
  __atomic_store_n(&gate, 1u, __ATOMIC_RELEASE);
  report.ExpectOk(orStreamSynchronize(s1), "the opened stream drains");
  report.Expect(__atomic_load_n(&reached, __ATOMIC_ACQUIRE) == 7, "the write ran after the wait");

  // Large blocks give their pages back on free, and the memory is reusable.
  report.ExpectOk(orFree(a), "orFree a");
  void* again = nullptr;
  report.ExpectOk(orMalloc(&again, kBytes), "orMalloc again");
  report.ExpectOk(orMemcpy(again, pattern.data(), kBytes, orMemcpyHostToDevice), "H2D again");
  report.Expect(ReadDevice(again, kBytes) == pattern, "reused memory holds new data");
  size_t free_bytes = 0, total = 0;
  report.ExpectOk(orDeviceGetMemoryInfo(0, &free_bytes, &total), "orDeviceGetMemoryInfo");
  report.Expect(total == (size_t{256} << 20), "capacity is the configured size");
  report.ExpectOk(orDeviceSynchronize(0), "orDeviceSynchronize(0)");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeRunsDevicesInExecutors) {
  EXPECT_IN_FRESH_PROCESS(CheckProcessModeRunsDevicesInExecutors());
}

// Host-function kernels in process mode run in this process, in stream
// order, over staged copies of the device memory they map (staging.cpp).
[[noreturn]] void CheckProcessModeRunsHostKernelsOverStagedMemory() {
  UseProcessMode("2");
  ChildReport report;
  constexpr size_t kBytes = (size_t{1} << 20) + 100;  // not a whole number of pages
  void* data = nullptr;
  void* flag = nullptr;
  report.ExpectOk(orMalloc(&data, kBytes), "orMalloc data");
  report.ExpectOk(orMalloc(&flag, 4), "orMalloc flag");
  const std::vector<unsigned char> pattern = Pattern(kBytes, 5);
  report.ExpectOk(orMemcpy(data, pattern.data(), kBytes, orMemcpyHostToDevice), "H2D");
  report.ExpectOk(orMemsetAsync(flag, 0, 4, nullptr), "clear the gate flag");
  report.ExpectOk(orStreamSynchronize(nullptr), "sync");
  orStream_t s1 = nullptr, s2 = nullptr, opener = nullptr;
  report.ExpectOk(orStreamCreate(&s1), "orStreamCreate s1");
  report.ExpectOk(orStreamCreate(&s2), "orStreamCreate s2");
  report.ExpectOk(orStreamCreate(&opener), "orStreamCreate opener");

  // Asynchronous and stream-ordered: queued behind a gate in the executor,
  // the host kernel has not run; once it runs it sees the device's bytes,
  // and what it writes reaches the device. Overlapping maps of one
  // allocation within a kernel see one copy.
  std::atomic<int> ran{0};
  std::atomic<bool> saw_device_bytes{false}, maps_agree{false};
  char* const tail = static_cast<char*>(data) + kBytes - 10;
  report.ExpectOk(Launch(s1, "openreg_test_gate", PointerParams{Addr(flag)}), "gate kernel");
  report.ExpectOk(LaunchFn(s1, [&, tail]() -> orError_t {
                    void* whole = nullptr;
                    void* last = nullptr;
                    if (orError_t e = orKernelMapPointer(tail, 10, &last)) return e;
                    if (orError_t e = orKernelMapPointer(data, kBytes, &whole)) return e;
                    auto* bytes = static_cast<unsigned char*>(whole);
                    saw_device_bytes = std::memcmp(bytes, pattern.data(), kBytes) == 0;
                    maps_agree = static_cast<unsigned char*>(last) == bytes + kBytes - 10;
                    std::memset(bytes + 4096 - 3, 0xee, 6);  // across a page boundary
                    static_cast<unsigned char*>(last)[9] = 0x77;  // the last byte
                    ran.fetch_add(1);
                    return orSuccess;
                  }),
                  "host kernel behind the gate");
  report.Expect(orStreamQuery(s1) == orErrorNotReady, "the host kernel is queued, not run");
  report.Expect(ran.load() == 0, "the host kernel waits for the gate before it");
  const uint32_t one = 1;
  report.ExpectOk(orMemcpyAsync(flag, &one, 4, orMemcpyHostToDevice, opener), "open the gate");
  report.ExpectOk(orStreamSynchronize(s1), "sync s1");
  report.Expect(ran.load() == 1, "the host kernel ran once");
  report.Expect(saw_device_bytes.load(), "the host kernel read the device's bytes");
  report.Expect(maps_agree.load(), "two maps of one allocation share one staged copy");
  std::vector<unsigned char> expected = pattern;
  std::fill(expected.begin() + 4096 - 3, expected.begin() + 4096 + 3, 0xee);
  expected[kBytes - 1] = 0x77;
  report.Expect(ReadDevice(data, kBytes) == expected, "the host kernel's writes reached the device");

  // Two host kernels on two streams write the even and the odd bytes of one
  // range while both hold it staged: each writes back only the bytes it
  // changed, so neither undoes the other's.
  std::atomic<int> step{0};
  auto spin_until = [&step](int value) {
    while (step.load(std::memory_order_acquire) < value) std::this_thread::yield();
  };
  report.ExpectOk(LaunchFn(s1, [&]() -> orError_t {
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(data, 4096, &p)) return e;
                    step.store(1, std::memory_order_release);
                    spin_until(2);  // the other kernel has staged the range too
                    for (size_t i = 0; i < 4096; i += 2) static_cast<unsigned char*>(p)[i] = 0x11;
                    return orSuccess;
                  }),
                  "even bytes on s1");
  report.ExpectOk(LaunchFn(s2, [&]() -> orError_t {
                    spin_until(1);
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(data, 4096, &p)) return e;
                    step.store(2, std::memory_order_release);
                    for (size_t i = 1; i < 4096; i += 2) static_cast<unsigned char*>(p)[i] = 0x22;
                    return orSuccess;
                  }),
                  "odd bytes on s2");
  report.ExpectOk(orStreamSynchronize(s1), "sync s1");
  report.ExpectOk(orStreamSynchronize(s2), "sync s2");
  const std::vector<unsigned char> mixed = ReadDevice(data, 4096);
  bool both = true;
  for (size_t i = 0; i < 4096; ++i) both = both && mixed[i] == (i % 2 ? 0x22 : 0x11);
  report.Expect(both, "both kernels' bytes reached the device");

  // A range a kernel marks written goes back whole, the bytes it left as
  // they were included: a write of another stream to that range meanwhile
  // is overwritten, one outside it is kept. Marking is checked: host
  // memory, or a range past the allocation, is refused.
  step.store(0);
  std::atomic<int> unmapped{-1}, past_mapping{-1};
  report.ExpectOk(orMemsetAsync(data, 0x44, 4096, s1), "fill the range");
  report.ExpectOk(orStreamSynchronize(s1), "sync s1");
  report.ExpectOk(LaunchFn(s1, [&]() -> orError_t {
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(data, 4096, &p)) return e;
                    auto* bytes = static_cast<unsigned char*>(p);
                    step.store(1, std::memory_order_release);
                    spin_until(2);  // the other stream has written bytes 100 and 3000
                    for (size_t i = 0; i < 2048; ++i) {
                      if (i != 100) bytes[i] = 0x55;  // byte 100 keeps the staged 0x44
                    }
                    if (orError_t e = orKernelMarkWritten(bytes, 2048)) return e;
                    unsigned char host_byte = 0;
                    unmapped = orKernelMarkWritten(&host_byte, 1);
                    past_mapping = orKernelMarkWritten(bytes + 4000, kBytes);
                    return orSuccess;
                  }),
                  "kernel marking [0, 2048) written");
  report.ExpectOk(LaunchFn(s2, [&]() -> orError_t {
                    spin_until(1);
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(data, 4096, &p)) return e;
                    static_cast<unsigned char*>(p)[100] = 0x66;
                    static_cast<unsigned char*>(p)[3000] = 0x66;
                    return orSuccess;
                  }),
                  "another stream writing bytes 100 and 3000");
  report.ExpectOk(orStreamSynchronize(s2), "sync s2");
  step.store(2, std::memory_order_release);
  report.ExpectOk(orStreamSynchronize(s1), "sync s1");
  const std::vector<unsigned char> marked = ReadDevice(data, 4096);
  report.Expect(marked[100] == 0x44, "a marked range is written back whole, unchanged bytes included");
  report.Expect(marked[0] == 0x55 && marked[2047] == 0x55, "the marked range holds the kernel's bytes");
  report.Expect(marked[3000] == 0x66 && marked[2048] == 0x44,
                "outside the marked range, only the bytes the kernel changed are written back");
  report.Expect(unmapped.load() == orErrorInvalidPointer, "marking host memory is refused");
  report.Expect(past_mapping.load() == orErrorInvalidPointer, "marking past the allocation is refused");
  report.ExpectFails(orKernelMarkWritten(data, 1), orErrorNotPermitted, {"orKernelMarkWritten", "only kernels"},
                     "marking outside kernels");

  // orLaunchKernelSync: done (and written back) when it returns. A failed
  // host kernel fails its stream with its message; what it wrote before
  // failing reaches the device, as in thread mode.
  struct Args {
    void* data;
  } args{data};
  report.ExpectOk(orLaunchKernelSync(s1, [](void* arg) -> orError_t {
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(static_cast<Args*>(arg)->data, 1, &p)) return e;
                    *static_cast<unsigned char*>(p) = 0x5a;
                    return orSuccess;
                  }, &args),
                  "orLaunchKernelSync");
  report.Expect(ReadDevice(data, 1)[0] == 0x5a, "the sync host kernel's write is there at once");
  report.ExpectOk(LaunchFn(s1, [&]() -> orError_t {
                    void* p = nullptr;
                    if (orError_t e = orKernelMapPointer(data, 1, &p)) return e;
                    *static_cast<unsigned char*>(p) = 0x6b;
                    orKernelSetError("host kernel failed on purpose");
                    return orErrorKernelFailed;
                  }),
                  "failing host kernel");
  report.ExpectFails(orStreamSynchronize(s1), orErrorKernelFailed,
                     {"host kernel failed on purpose"}, "the host kernel's error");
  report.Expect(ReadDevice(data, 1)[0] == 0x6b, "the failed kernel's write reached the device");

  // Maps are checked as in thread mode: another device's memory, a range
  // past the allocation, and the host outside kernels are refused.
  report.ExpectOk(orSetDevice(1), "orSetDevice(1)");
  void* other = nullptr;
  report.ExpectOk(orMalloc(&other, 64), "orMalloc on device 1");
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  std::atomic<int> mismatch{-1}, past_end{-1};
  report.ExpectOk(LaunchFn(s1, [&]() -> orError_t {
                    void* p = nullptr;
                    mismatch = orKernelMapPointer(other, 64, &p);
                    past_end = orKernelMapPointer(data, kBytes + 1, &p);
                    return orSuccess;
                  }),
                  "kernel mapping bad ranges");
  report.ExpectOk(orStreamSynchronize(s1), "sync s1");
  report.Expect(mismatch.load() == orErrorDeviceMismatch, "another device's memory is refused");
  report.Expect(past_end.load() == orErrorInvalidPointer, "a range past the allocation is refused");
  void* host_view = nullptr;
  report.ExpectFails(orKernelMapPointer(data, 1, &host_view), orErrorNotPermitted,
                     {"orKernelMapPointer", "only kernels"}, "the host outside kernels");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeRunsHostKernelsOverStagedMemory) {
  EXPECT_IN_FRESH_PROCESS(CheckProcessModeRunsHostKernelsOverStagedMemory());
}

[[noreturn]] void CheckHostReadOfExecutorMemoryFaults() {
  UseProcessMode("1");
  void* p = nullptr;
  if (orMalloc(&p, 64) != orSuccess) _exit(3);
  // The host reserves the addresses only: no memory is behind them here.
  volatile char value = *static_cast<volatile char*>(p);
  (void)value;
  _exit(0);
}

TEST_F(FreshProcessDeathTest, ProcessModeHostReadOfDeviceMemoryFaults) {
  EXPECT_EXIT(CheckHostReadOfExecutorMemoryFaults(), testing::KilledBySignal(SIGSEGV), "");
}

[[noreturn]] void CheckCrashingKernelLosesOnlyItsDevice() {
  UseProcessMode("2");
  ChildReport report;
  void* keep = nullptr;
  report.ExpectOk(orMalloc(&keep, 1024), "orMalloc on device 0");
  const std::vector<unsigned char> pattern = Pattern(1024, 9);
  report.ExpectOk(orMemcpy(keep, pattern.data(), 1024, orMemcpyHostToDevice), "H2D device 0");
  report.ExpectOk(orSetDevice(1), "orSetDevice(1)");
  void* lost_memory = nullptr;
  report.ExpectOk(orMalloc(&lost_memory, 1024), "orMalloc on device 1");
  int pid1 = -1;
  report.ExpectOk(orDeviceGetExecutorPid(1, &pid1), "executor pid of device 1");
  report.ExpectOk(Launch(nullptr, "openreg_test_crash", PointerParams{0}), "crashing kernel");
  report.ExpectFails(orStreamSynchronize(nullptr), orErrorDeviceLost,
                     {"orStreamSynchronize", "device 1 was lost", "signal 11", "SIGSEGV",
                      std::to_string(pid1)},
                     "the crash loses device 1, with its cause");
  int lost = 0;
  report.ExpectOk(orDeviceIsLost(1, &lost), "orDeviceIsLost(1)");
  report.Expect(lost == 1, "device 1 is lost");
  void* more = nullptr;
  report.ExpectFails(orMalloc(&more, 64), orErrorDeviceLost, {"orMalloc", "device 1"},
                     "allocation on the lost device");
  std::vector<unsigned char> back(1024);
  report.ExpectFails(orMemcpy(back.data(), lost_memory, 1024, orMemcpyDeviceToHost),
                     orErrorDeviceLost, {"device 1"}, "reading the lost device's memory");
  size_t free_bytes = 0, total = 0;
  report.ExpectFails(orDeviceGetMemoryInfo(1, &free_bytes, &total), orErrorDeviceLost,
                     {"device 1"}, "the lost device's memory counts as gone");
  report.ExpectOk(orFree(lost_memory), "orFree of the lost device's memory still works");
  report.Expect(EndsWithin(pid1, std::chrono::seconds(30)), "the executor is gone");
  // Device 0 and the host go on.
  report.ExpectOk(orSetDevice(0), "orSetDevice(0)");
  report.Expect(ReadDevice(keep, 1024) == pattern, "device 0 keeps its data");
  report.ExpectOk(Launch(nullptr, "openreg_test_fill_u32", FillParams{Addr(keep), 4, 5}),
                  "a kernel on device 0");
  report.ExpectOk(orStreamSynchronize(nullptr), "device 0 synchronizes");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeCrashingKernelLosesOnlyItsDevice) {
  EXPECT_IN_FRESH_PROCESS(CheckCrashingKernelLosesOnlyItsDevice());
}

[[noreturn]] void CheckKilledExecutorInTheMiddleOfQueuedWork() {
  UseProcessMode("2");
  ChildReport report;
  void* flag = nullptr;
  void* data = nullptr;
  report.ExpectOk(orMalloc(&flag, 4), "orMalloc flag");
  report.ExpectOk(orMalloc(&data, 4000), "orMalloc data");
  report.ExpectOk(orMemsetAsync(flag, 0, 4, nullptr), "clear flag");
  report.ExpectOk(orStreamSynchronize(nullptr), "sync");
  orStream_t s = nullptr;
  report.ExpectOk(orStreamCreate(&s), "orStreamCreate");
  report.ExpectOk(Launch(s, "openreg_test_gate", PointerParams{Addr(flag)}), "gate");
  report.ExpectOk(Launch(s, "openreg_test_fill_u32", FillParams{Addr(data), 1000, 1}), "fill");
  orEvent_t e = nullptr;
  report.ExpectOk(orEventCreate(&e), "orEventCreate");
  report.ExpectOk(orEventRecord(e, s), "record behind the gate");
  int pid = -1;
  report.ExpectOk(orDeviceGetExecutorPid(0, &pid), "executor pid");
  report.Expect(kill(pid, SIGKILL) == 0, "kill the executor");
  report.ExpectFails(orStreamSynchronize(s), orErrorDeviceLost,
                     {"device 0 was lost", "signal 9", "SIGKILL"},
                     "waiting for the queued work fails with the cause");
  report.ExpectFails(orEventSynchronize(e), orErrorDeviceLost, {"device 0"}, "event wait");
  report.ExpectOk(orStreamDestroy(s), "orStreamDestroy still works");
  report.ExpectOk(orEventDestroy(e), "orEventDestroy still works");
  report.ExpectOk(orSetDevice(1), "orSetDevice(1)");
  void* other = nullptr;
  report.ExpectOk(orMalloc(&other, 64), "device 1 allocates");
  report.ExpectOk(Launch(nullptr, "openreg_test_fill_u32", FillParams{Addr(other), 16, 3}),
                  "device 1 runs kernels");
  report.Expect(ReadU32(other, 16) == std::vector<uint32_t>(16, 3), "device 1 computes");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeKilledExecutorInTheMiddleOfQueuedWork) {
  EXPECT_IN_FRESH_PROCESS(CheckKilledExecutorInTheMiddleOfQueuedWork());
}

[[noreturn]] void CheckInjectedFaultEndsTheExecutor() {
  UseProcessMode("1");
  ChildReport report;
  report.ExpectOk(orDeviceInit(0), "orDeviceInit(0)");
  int pid = -1;
  report.ExpectOk(orDeviceGetExecutorPid(0, &pid), "executor pid");
  report.ExpectOk(orDeviceInjectFault(0, "an injected test fault"), "orDeviceInjectFault");
  report.ExpectFails(orDeviceSynchronize(0), orErrorDeviceLost, {"an injected test fault"},
                     "the injected cause is the one reported");
  report.Expect(EndsWithin(pid, std::chrono::seconds(30)), "the executor ended");
  // The monitor's later cause (the kill) does not replace the first.
  report.ExpectFails(orDeviceSynchronize(0), orErrorDeviceLost, {"an injected test fault"},
                     "the first cause stays");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeInjectedFaultEndsTheExecutor) {
  EXPECT_IN_FRESH_PROCESS(CheckInjectedFaultEndsTheExecutor());
}

// A host killed with SIGKILL leaves no executor behind.
[[noreturn]] void CheckNoOrphanExecutors() {
  UseProcessMode("2");
  ChildReport report;
  int fds[2];
  report.Expect(pipe(fds) == 0, "pipe");
  // What the host reports: each device's executor and how starting it went.
  struct Started {
    int pids[2] = {-1, -1};
    int errors[2] = {-1, -1};
    char message[512] = {};
  };
  const pid_t host = fork();
  if (host == 0) {
    // The executors inherit stderr: not the test's pipe, so that executors
    // left behind (the failure this test looks for) cannot hold it open.
    freopen("/dev/null", "w", stderr);
    Started started;
    for (int device = 0; device < 2; ++device) {
      started.errors[device] = orDeviceInit(device);
      if (started.errors[device] == orSuccess) {
        started.errors[device] = orDeviceGetExecutorPid(device, &started.pids[device]);
      }
      if (started.errors[device] != orSuccess && started.message[0] == '\0') {
        snprintf(started.message, sizeof(started.message), "%s", orGetLastErrorMessage());
      }
    }
    ssize_t ignored = write(fds[1], &started, sizeof(started));
    (void)ignored;
    pause();
    _exit(0);
  }
  Started started;
  report.Expect(read(fds[0], &started, sizeof(started)) == sizeof(started), "read what the host started");
  const int* pids = started.pids;
  report.Expect(pids[0] > 0 && pids[1] > 0,
                "the host started two executors (orDeviceInit/orDeviceGetExecutorPid returned " +
                    std::to_string(started.errors[0]) + " and " + std::to_string(started.errors[1]) +
                    (started.message[0] ? std::string(": ") + started.message : std::string()) + ")");
  kill(host, SIGKILL);
  waitpid(host, nullptr, 0);
  for (int pid : started.pids) {
    if (pid > 0) {
      report.Expect(EndsWithin(pid, std::chrono::seconds(30)),
                    "executor " + std::to_string(pid) + " ended with its host");
    }
  }
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeLeavesNoOrphansWhenTheHostIsKilled) {
  EXPECT_IN_FRESH_PROCESS(CheckNoOrphanExecutors());
}

[[noreturn]] void CheckBadExecutorSettings(const char* mode, const char* path,
                                           std::initializer_list<std::string_view> fragments,
                                           orError_t expected) {
  setenv("OPENREG_EXECUTOR", mode, 1);
  if (path) setenv("OPENREG_EXECUTOR_PATH", path, 1);
  ChildReport report;
  void* p = nullptr;
  report.ExpectFails(orMalloc(&p, 64), expected, fragments, "orMalloc");
  report.Finish();
}

TEST_F(FreshProcessDeathTest, ProcessModeSettingsAreCheckedWithClearErrors) {
  EXPECT_IN_FRESH_PROCESS(CheckBadExecutorSettings(
      "processes", nullptr, {"OPENREG_EXECUTOR='processes'", "'thread'", "'process'"},
      orErrorInitialization));
  EXPECT_IN_FRESH_PROCESS(CheckBadExecutorSettings(
      "process", "/nonexistent/openreg-executor",
      {"cannot initialize device 0", "/nonexistent/openreg-executor", "OPENREG_EXECUTOR_PATH"},
      orErrorInitialization));
}

}  // namespace
}  // namespace openreg_test
