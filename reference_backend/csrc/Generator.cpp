#include "Generator.h"

#include "DeviceManagement.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <memory>
#include <mutex>
#include <vector>

namespace openreg {

namespace {

class OpenRegGeneratorImpl final : public c10::GeneratorImpl {
 public:
  OpenRegGeneratorImpl(c10::DeviceIndex index, at::Generator cpu)
      : c10::GeneratorImpl(
            c10::Device(c10::DeviceType::PrivateUse1, index),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_offset(uint64_t offset) override {
    TORCH_CHECK(false, "OpenReg generators do not support offsets: their state "
                "is a Mersenne Twister (as on CPU). Use get_state()/set_state().");
  }
  uint64_t get_offset() const override {
    TORCH_CHECK(false, "OpenReg generators do not support offsets: their state "
                "is a Mersenne Twister (as on CPU). Use get_state()/set_state().");
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> lock(cpu_.unsafeGetGeneratorImpl()->mutex_);
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_.unsafeGetGeneratorImpl()->mutex_);
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }

  const at::Generator& cpu() const { return cpu_; }

 private:
  OpenRegGeneratorImpl* clone_impl() const override {
    std::lock_guard<std::mutex> lock(cpu_.unsafeGetGeneratorImpl()->mutex_);
    return new OpenRegGeneratorImpl(device().index(), cpu_.clone());
  }

  at::Generator cpu_;
};

at::Generator make(c10::DeviceIndex index) {
  return at::make_generator<OpenRegGeneratorImpl>(
      index, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve_device_index(index, "device_index");
  struct Slot {
    std::once_flag once;
    at::Generator generator;
  };
  // Generators are returned by reference and must live forever.
  static auto* slots = [] {
    auto* v = new std::vector<std::unique_ptr<Slot>>();
    for (int i = 0; i < device_count(); ++i) v->push_back(std::make_unique<Slot>());
    return v;
  }();
  Slot& slot = *(*slots)[index];
  std::call_once(slot.once, [&] { slot.generator = make(index); });
  return slot.generator;
}

at::Generator new_generator(c10::DeviceIndex index) {
  index = resolve_device_index(index, "device_index");
  return make(index);
}

at::Generator cpu_state_of(const at::Generator& generator) {
  TORCH_CHECK(generator.defined(), "OpenReg: the generator is undefined");
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "OpenReg: expected a generator of an OpenReg device, but got one of ",
              generator.device());
  return generator.get<OpenRegGeneratorImpl>()->cpu();
}

namespace {

bool same_engine(const at::mt19937& a, const at::mt19937& b) {
  const at::mt19937_data_pod x = a.data(), y = b.data();
  return x.left_ == y.left_ && x.next_ == y.next_ && x.state_ == y.state_;
}

}  // namespace

KernelGenerator kernel_generator(const at::Generator& generator) {
  at::Generator cpu = cpu_state_of(generator);
  auto* source = at::check_generator<at::CPUGeneratorImpl>(cpu);
  at::mt19937_data_pod data{};
  at::mt19937 before, after;
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    before = source->engine();
    for (uint32_t& word : data.state_) word = source->random();
    after = source->engine();
  }
  // As the reference seeding does: the top bit of the first word set, so
  // that the state is never all zeros.
  data.state_[0] |= 0x80000000u;
  data.seed_ = generator.current_seed();
  data.seeded_ = true;
  data.left_ = 1;  // the first draw twists the state
  data.next_ = 0;
  at::mt19937 engine;
  engine.set_data(data);
  at::Generator result = at::make_generator<at::CPUGeneratorImpl>();
  result.get<at::CPUGeneratorImpl>()->set_engine(engine);
  auto undo = [cpu, before, after]() mutable {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    auto* impl = at::check_generator<at::CPUGeneratorImpl>(cpu);
    if (same_engine(impl->engine(), after)) impl->set_engine(before);
  };
  return {std::move(result), std::move(undo)};
}

}  // namespace openreg
