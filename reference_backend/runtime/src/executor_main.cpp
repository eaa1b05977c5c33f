// openreg-executor: one OpenReg device as a process of its own
// (OPENREG_EXECUTOR=process; docs/reference-backend/executor.md).
//
// Started by the runtime (the driver) when the device initializes:
//   openreg-executor <channel fd> <device> <memory base> <capacity> <driver pid>
// The device's memory exists only here: an anonymous mapping at the address
// range the driver reserved (PROT_NONE, nothing behind it) in its own address
// space, so that device pointers mean the same in both processes. The driver
// copies to and from it with process_vm_writev/readv and sends everything
// else (kernels, memset, device-to-device copies, page discards) as requests
// over the shared-memory channels, each served by a thread of its own.
//
// The executor knows no torch and no runtime internals: kernels come from
// modules (shared libraries) it loads by path, and reach device memory
// through the orKernelContext it passes them.
#include "executor_protocol.h"

#include <openreg/runtime.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using namespace openreg::executor;

int g_device = -1;
uintptr_t g_base = 0;
size_t g_capacity = 0;
thread_local std::string* tls_error = nullptr;

bool parse_u64(const char* text, int base, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, base);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

bool in_memory(uint64_t ptr, uint64_t count) {
  return ptr >= g_base && count <= g_capacity && ptr - g_base <= g_capacity - count;
}

void set_message(Channel& ch, const std::string& text) {
  std::snprintf(ch.message, sizeof(ch.message), "%s", text.c_str());
}

orError_t map_pointer(const void* device_ptr, size_t count, void** accessible) {
  if (!accessible) return orErrorInvalidValue;
  *accessible = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(device_ptr);
  if (!in_memory(p, count)) {
    if (tls_error) {
      char text[256];
      std::snprintf(text, sizeof(text), "orKernelContext.map_pointer: [%p, +%zu bytes) is not "
                    "memory of device %d", device_ptr, count, g_device);
      *tls_error = text;
    }
    return orErrorInvalidPointer;
  }
  *accessible = const_cast<void*>(device_ptr);
  return orSuccess;
}

void set_error(const char* message) {
  if (tls_error && message) *tls_error = message;
}

struct Kernels {
  std::mutex mutex;
  std::unordered_map<std::string, orModuleKernelFn> by_key;  // path '\n' name
};
Kernels& kernels() {
  static auto* k = new Kernels();  // lives until exit
  return *k;
}

orModuleKernelFn find_kernel(const std::string& path, const std::string& name,
                             std::string* error) {
  const std::string key = path + '\n' + name;
  Kernels& k = kernels();
  std::lock_guard<std::mutex> lock(k.mutex);
  auto it = k.by_key.find(key);
  if (it != k.by_key.end()) return it->second;
  // Modules stay loaded until the executor exits, as in the driver.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    *error = "the executor of device " + std::to_string(g_device) + " cannot load module '" +
        path + "': " + dlerror();
    return nullptr;
  }
  auto fn = reinterpret_cast<orModuleKernelFn>(dlsym(handle, name.c_str()));
  if (!fn) {
    *error = "module '" + path + "' has no kernel '" + name + "'";
    return nullptr;
  }
  k.by_key.emplace(key, fn);
  return fn;
}

orError_t run_kernel(Channel& ch) {
  KernelHeader h;
  if (ch.payload_size < sizeof(h)) {
    set_message(ch, "malformed kernel request");
    return orErrorInvalidValue;
  }
  std::memcpy(&h, ch.payload, sizeof(h));
  if (sizeof(h) + h.path_size + h.name_size > ch.payload_size ||
      h.params_offset > ch.payload_size || h.params_size > ch.payload_size - h.params_offset) {
    set_message(ch, "malformed kernel request");
    return orErrorInvalidValue;
  }
  const char* strings = reinterpret_cast<const char*>(ch.payload) + sizeof(h);
  const std::string path(strings, h.path_size);
  const std::string name(strings + h.path_size, h.name_size);
  std::string error;
  orModuleKernelFn fn = find_kernel(path, name, &error);
  if (!fn) {
    set_message(ch, error);
    return orErrorKernelFailed;
  }
  orKernelContext ctx{};
  ctx.device = g_device;
  ctx.map_pointer = map_pointer;
  ctx.set_error = set_error;
  tls_error = &error;
  orError_t result;
  try {
    result = fn(&ctx, ch.payload + h.params_offset, h.params_size);
  } catch (const std::exception& e) {
    error = e.what();
    result = orErrorKernelFailed;
  } catch (...) {
    error = "unknown exception";
    result = orErrorKernelFailed;
  }
  tls_error = nullptr;
  if (result != orSuccess) {
    if (error.empty()) error = std::string("kernel returned error ") + std::to_string(result);
    set_message(ch, error);
  }
  return result;
}

orError_t run(Channel& ch) {
  ch.message[0] = '\0';
  switch (ch.command) {
    case kNop:
      return orSuccess;
    case kMemset:
      if (!in_memory(ch.a, ch.c)) break;
      std::memset(reinterpret_cast<void*>(ch.a), static_cast<int>(ch.b), ch.c);
      return orSuccess;
    case kCopy:
      if (!in_memory(ch.a, ch.c) || !in_memory(ch.b, ch.c)) break;
      std::memmove(reinterpret_cast<void*>(ch.a), reinterpret_cast<const void*>(ch.b), ch.c);
      return orSuccess;
    case kDiscard:
      if (!in_memory(ch.a, ch.c)) break;
      // Private anonymous pages read as zero after MADV_DONTNEED.
      madvise(reinterpret_cast<void*>(ch.a), ch.c, MADV_DONTNEED);
      return orSuccess;
    case kKernel:
      return run_kernel(ch);
    default:
      set_message(ch, "unknown command " + std::to_string(ch.command));
      return orErrorInvalidValue;
  }
  set_message(ch, "a request names memory outside device " + std::to_string(g_device));
  return orErrorInvalidPointer;
}

[[noreturn]] void serve(Channel& ch) {
  for (;;) {
    wait_state(&ch.state, [](uint32_t v) { return v == kRequest; }, kExecutorSpinNs);
    ch.status = run(ch);
    ch.state.store(kDone, std::memory_order_release);
    futex_wake(&ch.state);
  }
}

[[noreturn]] void fail_start(Shared* shared, const std::string& why) {
  if (shared) {
    std::snprintf(shared->header.message, sizeof(shared->header.message), "%s", why.c_str());
    shared->header.ready.store(kFailed, std::memory_order_release);
    futex_wake(&shared->header.ready);
  }
  std::fprintf(stderr, "openreg-executor: %s\n", why.c_str());
  std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  // Die with the driver, even when it is killed with SIGKILL: the signal is
  // tied to the driver thread that started this process, which lives as long
  // as the driver does. A driver that died before this line is no longer our
  // parent.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  uint64_t fd = 0, device = 0, base = 0, capacity = 0, parent = 0;
  if (argc != 6 || !parse_u64(argv[1], 10, &fd) || !parse_u64(argv[2], 10, &device) ||
      !parse_u64(argv[3], 16, &base) || !parse_u64(argv[4], 10, &capacity) ||
      !parse_u64(argv[5], 10, &parent)) {
    std::fprintf(stderr, "usage: openreg-executor <fd> <device> <base hex> <capacity> "
                 "<driver pid> (started by the OpenReg runtime, not by hand)\n");
    return 2;
  }
  if (static_cast<uint64_t>(getppid()) != parent) return 3;
  // Nothing of the driver's but the channels' memfd.
  syscall(SYS_close_range, static_cast<unsigned>(fd) + 1, ~0u, 0);
  void* mapped = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED,
                      static_cast<int>(fd), 0);
  if (mapped == MAP_FAILED) fail_start(nullptr, std::string("mmap of the channels failed: ") +
                                                    std::strerror(errno));
  auto* shared = static_cast<Shared*>(mapped);
  if (shared->header.magic != kMagic || shared->header.version != kVersion) {
    fail_start(nullptr, "the channels' memory is not an OpenReg executor protocol v1 header");
  }
  g_device = static_cast<int>(device);
  g_base = base;
  g_capacity = capacity;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped_size = (capacity + page - 1) / page * page;
  void* memory = mmap(reinterpret_cast<void*>(base), mapped_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (memory == MAP_FAILED || reinterpret_cast<uintptr_t>(memory) != base) {
    char text[256];
    std::snprintf(text, sizeof(text), "cannot map %zu bytes of device memory at 0x%llx in the "
                  "executor: %s", mapped_size, static_cast<unsigned long long>(base),
                  memory == MAP_FAILED ? std::strerror(errno) : "the range is taken");
    fail_start(shared, text);
  }
  // A dump of a crashed executor would hold the whole device.
  madvise(memory, mapped_size, MADV_DONTDUMP);
  madvise(memory, mapped_size, MADV_HUGEPAGE);
  std::vector<std::thread> threads;
  for (int i = 1; i < kChannels; ++i) {
    threads.emplace_back([shared, i] { serve(shared->channels[i]); });
  }
  shared->header.ready.store(kReady, std::memory_order_release);
  futex_wake(&shared->header.ready);
  serve(shared->channels[0]);
}
