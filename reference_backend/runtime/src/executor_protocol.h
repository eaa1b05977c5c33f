// The shared-memory protocol between the OpenReg runtime (the driver, in the
// host process) and a device's executor process (OPENREG_EXECUTOR=process;
// docs/reference-backend/executor.md). Shared by both sides; no torch, no
// runtime internals.
//
// One memfd per device holds a Header and kChannels Channels. A channel is a
// one-request mailbox: the driver fills in a command and sets state kRequest;
// the executor thread that owns the channel runs it, fills in status and
// message and sets kDone; the driver reads the result and sets kIdle. Either
// side sleeps on the state word with a shared futex after a short spin. When
// the executor dies the driver's monitor sets every channel to kDead.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>

namespace openreg::executor {

constexpr uint32_t kMagic = 0x5845524f;  // "OREX"
constexpr uint32_t kVersion = 1;
// Requests in flight at once per device (driver threads beyond this wait
// for a free channel).
constexpr int kChannels = 16;
// Kernel parameters and the kernel's module path and name travel in the
// channel: OR_MAX_KERNEL_PARAMS plus room for the two strings.
constexpr size_t kPayload = 32768 + 8192;
constexpr size_t kMessage = 1024;

// How long each side polls before it sleeps on the futex: a request often
// comes, or finishes, within microseconds, and a futex wake-up costs far more
// (about 80 us on the project's 2-vCPU machines; docs/reference-backend/executor.md).
constexpr long kExecutorSpinNs = 30000;
constexpr long kDriverSpinNs = 30000;

enum State : uint32_t { kIdle = 0, kRequest = 1, kDone = 2, kDead = 3 };

enum Command : uint32_t {
  kNop = 1,      // round trip only
  kMemset = 2,   // a = dst, b = value, c = count
  kCopy = 3,     // a = dst, b = src, c = count (both in this device)
  kDiscard = 4,  // a = start, c = count: give the pages back (they read 0)
  kKernel = 5,   // payload: KernelHeader, path, name, parameters
};

struct KernelHeader {
  uint32_t path_size;    // bytes of the module path that follow
  uint32_t name_size;    // bytes of the kernel name after the path
  uint32_t params_offset;  // from the payload's start, 16-byte aligned
  uint32_t params_size;
};

struct alignas(64) Channel {
  std::atomic<uint32_t> state;
  uint32_t command;
  int32_t status;  // orError_t of the request
  uint32_t payload_size;
  uint64_t a, b, c;
  char message[kMessage];  // why the request failed, NUL-terminated
  alignas(64) unsigned char payload[kPayload];
};

enum Ready : uint32_t { kStarting = 0, kReady = 1, kFailed = 2, kExited = 3 };

struct Header {
  uint32_t magic;
  uint32_t version;
  std::atomic<uint32_t> ready;  // Ready
  uint32_t reserved;
  char message[kMessage];       // why start-up failed (kFailed)
};

struct Shared {
  Header header;
  Channel channels[kChannels];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Shared (not process-private) futexes: the word lives in a MAP_SHARED memfd.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, nullptr,
          nullptr, 0);
}

inline void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr,
          nullptr, 0);
}

// Waits until `done(state)` holds: a spin of up to `spin_ns` (a request of
// the other side often comes or finishes within microseconds), then the
// futex. Returns the state. The spin only decides how a thread waits.
template <typename Done>
uint32_t wait_state(std::atomic<uint32_t>* word, Done done, long spin_ns) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (unsigned i = 0;; ++i) {
    const uint32_t value = word->load(std::memory_order_acquire);
    if (done(value)) return value;
    if ((i & 63) == 63) {
      // Between polls the CPU goes to whoever can use it: a round trip
      // involves three polling threads (the waiting host, the stream's
      // worker, this side's thread), often more than there are CPUs.
      sched_yield();
      timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      const long elapsed_ns =
          (now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec);
      if (elapsed_ns > spin_ns) break;
    }
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  for (;;) {
    const uint32_t value = word->load(std::memory_order_acquire);
    if (done(value)) return value;
    futex_wait(word, value);
  }
}

}  // namespace openreg::executor
