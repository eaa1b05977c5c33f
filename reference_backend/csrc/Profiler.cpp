// Profiler support: device time for torch.autograd.profiler.profile(
// use_device="openreg").
//
// That profiler (use_kineto=False, ProfilerState::KINETO_PRIVATEUSE1_FALLBACK)
// asks the PrivateUse1 ProfilerStubs (torch/csrc/profiler/stubs/base.h) to
// record a device event when every operator starts and ends, on the calling
// thread, CPU-only operators included, and later for the time between the
// two in microseconds. PyTorch's default stubs throw, and nothing catches that
// throw: every operator would then log an exception with a backtrace, fail an
// internal assert at its exit, and keep an uninitialized start time.
//
// OpenReg's stubs record runtime events on the current device's current
// stream. They never throw (the profiler's callbacks have no try/catch), and
// they never initialize a device: before the current device is initialized,
// no event is recorded, and the operator gets no device time.
#include "DeviceManagement.h"
#include "Stream.h"

#include <c10/util/ApproximateClock.h>
#include <openreg/runtime.h>
#include <torch/csrc/profiler/stubs/base.h>

namespace openreg {

namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

void destroy_event(void* event) {
  orEventDestroy(static_cast<orEvent_t>(event));
}

struct OpenRegProfilerStubs final : ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    try {
      const c10::DeviceIndex index = current_device();
      if (device != nullptr) *device = index;
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
      if (event == nullptr || !is_device_initialized(index)) return;
      orEvent_t created = nullptr;
      if (orEventCreate(&created) != orSuccess) return;
      event->reset(created, &destroy_event);
      const c10::Stream stream = current_stream(index);
      if (orEventRecord(created, native_stream(stream)) != orSuccess) event->reset();
    } catch (...) {
      if (event != nullptr) event->reset();  // the operator gets no device time
    }
  }

  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    auto* first = static_cast<orEvent_t>(start->get());
    auto* second = static_cast<orEvent_t>(end->get());
    float ms = 0.0f;
    if (orEventSynchronize(first) != orSuccess || orEventSynchronize(second) != orSuccess ||
        orEventElapsedTime(&ms, first, second) != orSuccess) {
      return 0.0f;  // e.g. the current device changed inside the operator
    }
    return ms * 1000.0f;
  }

  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = current_device();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      set_device(i);
      op(i);
    }
    set_device(previous);
  }

  void synchronize() const override {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      if (is_device_initialized(i)) orDeviceSynchronize(i);
    }
  }
};

struct Registration {
  Registration() {
    static OpenRegProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registration;

}  // namespace

}  // namespace openreg
