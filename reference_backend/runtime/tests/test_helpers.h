// Helpers shared by the OpenReg runtime tests: error assertions, kernels built
// from lambdas, a gate that holds a stream back, and checks run in child
// processes (fork or death tests).
#pragma once

#include <openreg/runtime.h>

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace openreg_test {

// Leaves a known message as this thread's last error, so that a later check
// cannot be satisfied by a stale message of an earlier failing call.
inline void StampLastError() {
  orGetDebugCounters(nullptr);  // "orGetDebugCounters: counters is null"
}

// A call's result and the message it left, captured on the thread that made
// it (kernels run on stream threads, each with its own last error).
struct CallOutcome {
  orError_t code;
  std::string message;
};

template <typename Call>
CallOutcome CaptureCall(Call&& call) {
  StampLastError();
  const orError_t code = call();
  return {code, orGetLastErrorMessage()};
}

// The outcome is `expected`, with a message that mentions every fragment.
inline testing::AssertionResult FailedWith(
    const CallOutcome& outcome, orError_t expected,
    std::initializer_list<std::string_view> fragments) {
  if (outcome.code != expected) {
    return testing::AssertionFailure()
           << "returned " << orGetErrorName(outcome.code) << ", expected "
           << orGetErrorName(expected) << " (last error: \"" << outcome.message
           << "\")";
  }
  if (outcome.message.rfind("orGetDebugCounters", 0) == 0) {
    return testing::AssertionFailure() << "the failing call left no message";
  }
  for (std::string_view fragment : fragments) {
    if (outcome.message.find(fragment) == std::string::npos) {
      return testing::AssertionFailure()
             << "message \"" << outcome.message << "\" does not mention \""
             << fragment << "\"";
    }
  }
  return testing::AssertionSuccess();
}

// `actual` is `expected`, and this thread's last error message mentions every
// fragment.
inline testing::AssertionResult FailsWith(
    orError_t actual, orError_t expected,
    std::initializer_list<std::string_view> fragments) {
  return FailedWith({actual, orGetLastErrorMessage()}, expected, fragments);
}

}  // namespace openreg_test

// EXPECT_FAILS(call, code, "fragment", ...): `call` fails with `code` and its
// message names every fragment (the call, the argument, the valid range).
#define EXPECT_FAILS(call, code, ...)                                        \
  do {                                                                       \
    ::openreg_test::StampLastError();                                        \
    const orError_t or_result_ = (call);                                     \
    EXPECT_TRUE(::openreg_test::FailsWith(or_result_, code, {__VA_ARGS__})) \
        << "call: " #call;                                                   \
  } while (0)

#define OR_CHECK_OK_(call, assertion)                                  \
  do {                                                                 \
    const orError_t or_result_ = (call);                               \
    assertion(or_result_, orSuccess)                                   \
        << #call << " -> " << orGetErrorName(or_result_) << ": "       \
        << orGetLastErrorMessage();                                    \
  } while (0)
#define EXPECT_OK(call) OR_CHECK_OK_(call, EXPECT_EQ)
#define ASSERT_OK(call) OR_CHECK_OK_(call, ASSERT_EQ)

namespace openreg_test {

inline int DeviceCount() {
  int count = 0;
  orGetDeviceCount(&count);
  return count;
}

// "[0, N)": how the runtime spells the valid device range.
inline std::string ValidDeviceRange() {
  return "[0, " + std::to_string(DeviceCount()) + ")";
}

// Device indexes that every per-device call must reject.
inline std::vector<int> InvalidDeviceIndexes() {
  const int count = DeviceCount();
  return {-1, count, count + 1000};
}

inline std::string DeviceArg(int device) {
  return "device=" + std::to_string(device);
}

inline int CurrentDevice() {
  int device = -1;
  orGetDevice(&device);
  return device;
}

inline bool IsInitialized(int device) {
  int initialized = -1;
  orDeviceIsInitialized(device, &initialized);
  return initialized != 0;
}

// Launches `body` as a kernel on `stream`; the kernel owns (and frees) it.
inline orError_t LaunchFn(orStream_t stream, std::function<orError_t()> body) {
  using Body = std::function<orError_t()>;
  auto* owned = new Body(std::move(body));
  const orError_t result = orLaunchKernel(
      stream,
      [](void* arg) -> orError_t {
        std::unique_ptr<Body> fn(static_cast<Body*>(arg));
        return (*fn)();
      },
      owned);
  if (result != orSuccess) delete owned;
  return result;
}

// Holds a stream back: work queued behind Block() stays pending until Open().
// The kernel keeps its own reference to the shared state, so the gate may die
// before the kernel has finished waiting.
class Gate {
 public:
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { Open(); }

  orError_t Block(orStream_t stream) {
    return LaunchFn(stream, [released = released_] {
      released.wait();
      return orSuccess;
    });
  }
  void Open() {
    if (!opened_) {
      opened_ = true;
      promise_.set_value();
    }
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> released_ = promise_.get_future().share();
  bool opened_ = false;
};

// Reads `size` bytes of device memory back to the host (synchronously).
inline std::vector<unsigned char> ReadDevice(const void* device_ptr,
                                             size_t size) {
  std::vector<unsigned char> host(size, 0);
  const orError_t result =
      orMemcpy(host.data(), device_ptr, size, orMemcpyDeviceToHost);
  EXPECT_EQ(result, orSuccess) << orGetLastErrorMessage();
  return host;
}

// Bytes 0, 1, 2, ... offset by `seed`, so that different buffers differ.
inline std::vector<unsigned char> Pattern(size_t size, unsigned seed = 0) {
  std::vector<unsigned char> bytes(size);
  for (size_t i = 0; i < size; ++i) {
    bytes[i] = static_cast<unsigned char>((i * 31 + seed) & 0xff);
  }
  return bytes;
}

// Restores the current device to 0 after each test: it is per thread and the
// tests all run on the main thread.
class RuntimeTest : public testing::Test {
 protected:
  void TearDown() override { orSetDevice(0); }
};

#define REQUIRE_DEVICES(n)                                                   \
  do {                                                                       \
    if (::openreg_test::DeviceCount() < (n)) {                               \
      GTEST_SKIP() << "needs " << (n) << " OpenReg devices, have "          \
                   << ::openreg_test::DeviceCount();                         \
    }                                                                        \
  } while (0)

// Collects failures in a child process (gtest assertions do not travel back
// from a fork), then reports them through a file descriptor and exits:
// status 0 when every check passed.
class ChildReport {
 public:
  void Expect(bool ok, const std::string& what) {
    if (!ok) failures_ += "FAILED: " + what + "\n";
  }
  void ExpectOk(orError_t result, const std::string& what) {
    Expect(result == orSuccess, what + " -> " + orGetErrorName(result) + ": " +
                                    orGetLastErrorMessage());
  }
  void ExpectFails(orError_t result, orError_t expected,
                   std::initializer_list<std::string_view> fragments,
                   const std::string& what) {
    testing::AssertionResult check = FailsWith(result, expected, fragments);
    Expect(static_cast<bool>(check), what + ": " + check.message());
  }
  [[noreturn]] void Finish(int fd = STDERR_FILENO) {
    if (!failures_.empty()) {
      ssize_t ignored = write(fd, failures_.data(), failures_.size());
      (void)ignored;
    }
    // _exit: skip static destructors of a process that is only half ours.
    _exit(failures_.empty() ? 0 : 1);
  }

 private:
  std::string failures_;
};

// Forks; the child runs `checks` and exits. Returns "" when the child passed,
// else what failed (or how the child ended).
inline std::string RunInForkedChild(
    const std::function<void(ChildReport&)>& checks) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    close(fds[0]);
    ChildReport report;
    checks(report);
    report.Finish(fds[1]);
  }
  close(fds[1]);
  std::string output;
  char buffer[512];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) output.append(buffer, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) {
    output += "child did not exit normally (status " + std::to_string(status) + ")";
  } else if (WEXITSTATUS(status) != 0 && output.empty()) {
    output = "child exited with " + std::to_string(WEXITSTATUS(status));
  }
  return output;
}

// Death tests re-execute the test binary ("threadsafe" style) so that the
// child starts with a fresh runtime: the configuration is read from the
// environment once per process, and the parent has threads of its own.
class FreshProcessDeathTest : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Runs `statement` in a fresh process; it must call ChildReport::Finish.
#define EXPECT_IN_FRESH_PROCESS(statement) \
  EXPECT_EXIT(statement, testing::ExitedWithCode(0), "")

// Core dumps of a process with large device mappings only cost time.
inline void DisableCoreDumps() {
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

}  // namespace openreg_test
