// Process mode (OPENREG_EXECUTOR=process): the driver's side of a device's
// executor process. See executor_protocol.h and executor_main.cpp, and
// docs/reference-backend/executor.md.
#include "executor_protocol.h"
#include "internal.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>

extern char** environ;

namespace openreg::runtime {

namespace {

using namespace openreg::executor;

// The executable: OPENREG_EXECUTOR_PATH, else openreg-executor next to the
// binary that holds this runtime (the runtime's tests, or libopenreg_torch).
std::string executor_path() {
  if (const char* path = std::getenv("OPENREG_EXECUTOR_PATH"); path && *path) return path;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&orGetExecutionMode), &info) == 0 || !info.dli_fname) {
    return "openreg-executor";
  }
  std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) +
         "/openreg-executor";
}

std::string describe_exit(int pid, int status) {
  char text[160];
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    std::snprintf(text, sizeof(text), "its executor process (pid %d) was killed by signal %d "
                  "(SIG%s: %s)", pid, sig, name ? name : "?", strsignal(sig));
  } else {
    std::snprintf(text, sizeof(text), "its executor process (pid %d) exited with status %d",
                  pid, WEXITSTATUS(status));
  }
  return text;
}

Shared* shared_of(void* p) { return static_cast<Shared*>(p); }

}  // namespace

Executor* Executor::start(Device* d, std::string* error) {
  auto* ex = new Executor(d);  // lives as long as the process, as the device
  const std::string name = "openreg-executor-channels-" + std::to_string(d->index);
  ex->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (ex->fd_ < 0 || ftruncate(ex->fd_, sizeof(Shared)) != 0) {
    *error = std::string("cannot create the executor's channels: ") + std::strerror(errno);
    return nullptr;
  }
  void* mapped = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, ex->fd_, 0);
  if (mapped == MAP_FAILED) {
    *error = std::string("cannot map the executor's channels: ") + std::strerror(errno);
    return nullptr;
  }
  ex->shared_ = mapped;
  Shared* shared = shared_of(mapped);
  shared->header.magic = kMagic;
  shared->header.version = kVersion;
  for (int i = kChannels - 1; i >= 0; --i) ex->free_channels_.push_back(i);
  // The executor dies with the thread that started it (PR_SET_PDEATHSIG), so
  // a thread that lives as long as the process starts it: its monitor.
  std::thread(&Executor::monitor, ex, executor_path()).detach();
  {
    std::unique_lock<std::mutex> lock(ex->start_mutex_);
    ex->started_.wait(lock, [&] { return ex->spawned_; });
    if (!ex->spawn_error_.empty()) {
      *error = ex->spawn_error_;
      return nullptr;
    }
  }
  const uint32_t ready = wait_state(&shared->header.ready,
                                    [](uint32_t v) { return v != kStarting; }, 0);
  if (ready == kReady) return ex;
  if (ready == kFailed) {
    *error = std::string("its executor failed to start: ") + shared->header.message;
  } else {
    std::lock_guard<std::mutex> lock(d->lost_mutex);
    *error = "its executor ended during start-up: " + d->lost_cause;
  }
  return nullptr;
}

void Executor::monitor(std::string path) {
  Shared* shared = shared_of(shared_);
  int child_fd = fd_;
  if (child_fd == 3) child_fd = fcntl(fd_, F_DUPFD_CLOEXEC, 10);  // dup2(3, 3) keeps CLOEXEC
  char base[32], capacity[32], device[16], fd_text[16], parent[16];
  std::snprintf(fd_text, sizeof(fd_text), "%d", 3);
  std::snprintf(device, sizeof(device), "%d", device_->index);
  std::snprintf(base, sizeof(base), "%" PRIxPTR, reinterpret_cast<uintptr_t>(device_->arena.base()));
  std::snprintf(capacity, sizeof(capacity), "%zu", device_->arena.capacity());
  std::snprintf(parent, sizeof(parent), "%d", static_cast<int>(getpid()));
  char* argv[] = {const_cast<char*>(path.c_str()), fd_text, device, base, capacity, parent,
                  nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_fd, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Default signal handling and mask, whatever the host set; a process group
  // of its own, so a terminal's Ctrl-C reaches the host, not the device.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (child_fd != fd_) close(child_fd);
  {
    std::lock_guard<std::mutex> lock(start_mutex_);
    if (rc != 0) {
      spawn_error_ = "cannot start its executor '" + path + "': " + std::strerror(rc) +
                     " (set OPENREG_EXECUTOR_PATH to the openreg-executor program)";
    } else {
      pid_.store(pid);
    }
    spawned_ = true;
  }
  started_.notify_all();
  if (rc != 0) return;
  // Observe the exit without reaping: until it is reaped the pid cannot be
  // reused, so no copy or signal of ours can reach another process.
  siginfo_t info{};
  int rc_wait;
  while ((rc_wait = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT)) < 0 &&
         errno == EINTR) {
  }
  std::string cause;
  if (rc_wait < 0) {
    // Someone else reaped it (SIGCHLD ignored, or waitpid(-1) elsewhere).
    cause = "its executor process (pid " + std::to_string(pid) + ") ended";
  } else {
    const int status = info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8
                                                  : (info.si_status & 0x7f);
    cause = describe_exit(pid, status);
  }
  lose_device(device_, cause);
  {
    std::unique_lock<std::shared_mutex> lock(gone_mutex_);  // waits out transfers
    gone_ = true;
  }
  if (rc_wait == 0) waitpid(pid, nullptr, 0);
  shared->header.ready.store(kExited, std::memory_order_release);
  futex_wake(&shared->header.ready);
  for (Channel& ch : shared->channels) {
    ch.state.store(kDead, std::memory_order_release);
    futex_wake(&ch.state);
  }
}

void Executor::kill() {
  std::shared_lock<std::shared_mutex> lock(gone_mutex_);
  const int pid = pid_.load();
  if (pid > 0 && !gone_) ::kill(pid, SIGKILL);
}

int Executor::acquire_channel() {
  std::unique_lock<std::mutex> lock(channels_mutex_);
  channel_free_.wait(lock, [&] { return !free_channels_.empty(); });
  const int index = free_channels_.back();
  free_channels_.pop_back();
  return index;
}

void Executor::release_channel(int index) {
  {
    std::lock_guard<std::mutex> lock(channels_mutex_);
    free_channels_.push_back(index);
  }
  channel_free_.notify_one();
}

orError_t Executor::request(const char* call, uint32_t command, uint64_t a, uint64_t b,
                            uint64_t c, const void* payload, size_t payload_size) {
  if (payload_size > kPayload) {
    return fail(orErrorInvalidValue, "%s: a request of %zu bytes is larger than a channel "
                "(%zu bytes)", call, payload_size, kPayload);
  }
  const int index = acquire_channel();
  Channel& ch = shared_of(shared_)->channels[index];
  ch.command = command;
  ch.a = a;
  ch.b = b;
  ch.c = c;
  ch.payload_size = static_cast<uint32_t>(payload_size);
  if (payload_size) std::memcpy(ch.payload, payload, payload_size);
  // A dead executor's channels stay kDead: the request is then never posted
  // (the fields written above are never read).
  uint32_t expected = kIdle;
  if (!ch.state.compare_exchange_strong(expected, kRequest, std::memory_order_acq_rel)) {
    release_channel(index);
    return fail_lost(call, device_->index);
  }
  futex_wake(&ch.state);
  const uint32_t state =
      wait_state(&ch.state, [](uint32_t v) { return v == kDone || v == kDead; }, kDriverSpinNs);
  if (state == kDead) {
    release_channel(index);
    return fail_lost(call, device_->index);
  }
  const auto status = static_cast<orError_t>(ch.status);
  std::string message = status == orSuccess ? std::string() : std::string(ch.message);
  expected = kDone;
  ch.state.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel);
  release_channel(index);
  if (status != orSuccess) return fail(status, "%s: %s", call, message.c_str());
  return orSuccess;
}

namespace {

// process_vm_readv/writev may move fewer bytes than asked: go on until done.
template <typename Transfer>
orError_t transfer(const char* call, Device* d, Transfer move, char* local, char* remote,
                   size_t count) {
  while (count > 0) {
    iovec l{local, count}, r{remote, count};
    const ssize_t n = move(&l, &r);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ESRCH) return fail_lost(call, d->index);
      if (errno == EFAULT) {
        // The device side lies in the executor's mapping; a fault is the host's.
        return fail(orErrorInvalidPointer, "%s: the host memory [%p, +%zu bytes) is not "
                    "accessible", call, static_cast<void*>(local), count);
      }
      return fail(orErrorInvalidValue, "%s: copy with the executor of device %d failed: %s",
                  call, d->index, std::strerror(errno));
    }
    if (n == 0) return fail_lost(call, d->index);
    local += n;
    remote += n;
    count -= static_cast<size_t>(n);
  }
  return orSuccess;
}

}  // namespace

orError_t Executor::write(const char* call, void* device_dst, const void* host_src,
                          size_t count) {
  std::shared_lock<std::shared_mutex> lock(gone_mutex_);
  if (gone_) return fail_lost(call, device_->index);
  const int pid = pid_.load();
  return transfer(call, device_, [pid](iovec* l, iovec* r) {
    return process_vm_writev(pid, l, 1, r, 1, 0);
  }, static_cast<char*>(const_cast<void*>(host_src)), static_cast<char*>(device_dst), count);
}

orError_t Executor::read(const char* call, void* host_dst, const void* device_src,
                         size_t count) {
  std::shared_lock<std::shared_mutex> lock(gone_mutex_);
  if (gone_) return fail_lost(call, device_->index);
  const int pid = pid_.load();
  return transfer(call, device_, [pid](iovec* l, iovec* r) {
    return process_vm_readv(pid, l, 1, r, 1, 0);
  }, static_cast<char*>(host_dst), static_cast<char*>(const_cast<void*>(device_src)), count);
}

orError_t Executor::write_runs(const char* call, const iovec* local, const iovec* remote,
                               size_t count) {
  std::shared_lock<std::shared_mutex> lock(gone_mutex_);
  if (gone_) return fail_lost(call, device_->index);
  const int pid = pid_.load();
  // At most IOV_MAX runs per call. A short transfer never splits a run
  // (process_vm_writev(2)): go on from the first run not written.
  constexpr size_t kBatch = IOV_MAX;
  size_t i = 0;
  while (i < count) {
    const size_t n = std::min(kBatch, count - i);
    const ssize_t written = process_vm_writev(pid, local + i, n, remote + i, n, 0);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == ESRCH) return fail_lost(call, device_->index);
      return fail(orErrorInvalidValue, "%s: writing back to the executor of device %d failed: %s",
                  call, device_->index, std::strerror(errno));
    }
    if (written == 0) return fail_lost(call, device_->index);
    size_t left = static_cast<size_t>(written);
    while (i < count && left >= local[i].iov_len) left -= local[i++].iov_len;
    if (left > 0) {
      // Not expected (runs are not split), but a partial run is finished by hand.
      if (orError_t e = transfer(call, device_, [pid](iovec* l, iovec* r) {
            return process_vm_writev(pid, l, 1, r, 1, 0);
          }, static_cast<char*>(local[i].iov_base) + left,
          static_cast<char*>(remote[i].iov_base) + left, local[i].iov_len - left)) {
        return e;
      }
      ++i;
    }
  }
  return orSuccess;
}

}  // namespace openreg::runtime
