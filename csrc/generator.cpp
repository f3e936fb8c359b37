// The tpu random generator: (seed, offset); the engine derives each op's random key from both.
// Also the device's default generators, and the seed/state entry points Rust calls.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>
#include <vector>

#include "shim.h"

namespace torchtpu {
namespace {
struct TpuGenerator final : c10::GeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t s) override { seed_ = s; offset_ = 0; }
  void set_offset(uint64_t o) override { offset_ = o; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  // State: 16 bytes (seed, offset) in a uint8 CPU tensor, like CUDA's philox state.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == at::kByte,
                "RNG state must be a torch.ByteTensor of 16 bytes");
    auto* p = static_cast<const uint64_t*>(state.data());
    seed_ = p[0];
    offset_ = p[1];
  }
  // Allocated on the host directly, not through the dispatcher: under a Python mode (a
  // FakeTensorMode tracing for torch.compile or export) at::empty gives a tensor without data.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::detail::empty_cpu({16}, at::kByte, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    auto* p = static_cast<uint64_t*>(t.data_ptr());
    p[0] = seed_;
    p[1] = offset_;
    return t.getIntrusivePtr();
  }
  // Each random op takes the current (seed, offset) and advances the offset by one.
  std::pair<uint64_t, uint64_t> next() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {seed_, offset_++};
  }
  static c10::DeviceType device_type() { return kTpu; }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = 67280421310721ULL;  // c10::default_rng_seed_val
  uint64_t offset_ = 0;
};

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    for (int i = 0; i < std::max(1, tt_device_count()); i++) v.push_back(make_generator(i));
    return v;
  }();
  return gens;
}
}  // namespace

at::Generator make_generator(c10::DeviceIndex index) { return at::make_generator<TpuGenerator>(index); }

const at::Generator& default_generator(c10::DeviceIndex index) {
  auto& gens = default_generators();
  if (index < 0) index = current_device;
  TORCH_CHECK(index < (c10::DeviceIndex)gens.size(), "Invalid device index ", (int)index);
  return gens[index];
}

std::pair<uint64_t, uint64_t> next_random(const at::Generator& generator) {
  return generator.get<TpuGenerator>()->next();
}

}  // namespace torchtpu

// Called from Rust (the Python module) for torch.tpu.manual_seed and the RNG state.
extern "C" void tt_generator_set(int32_t device, uint64_t seed, uint64_t offset) {
  at::Generator g = torchtpu::default_generator((c10::DeviceIndex)device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
  g.set_offset(offset);
}

extern "C" void tt_generator_get(int32_t device, uint64_t* seed, uint64_t* offset) {
  at::Generator g = torchtpu::default_generator((c10::DeviceIndex)device);
  std::lock_guard<std::mutex> lock(g.mutex());
  *seed = g.current_seed();
  *offset = g.get_offset();
}
