// The PrivateUse1 hooks: what PyTorch asks a backend outside any op (availability, current
// device, default generators, resizing storages).
#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <mutex>
#include <unordered_set>

#include "shim.h"

namespace torchtpu {
namespace {
// Host memory handed out as pinned (`pin_memory=True`): ordinary CPU memory, remembered so that
// `is_pinned()` is true for it, as PyTorch's users (DDP's staging buffers, DataLoader) expect; also
// tpu's host allocator (empty_host_cache, stats): it caches nothing, and copies read it when queued.
std::mutex pinned_lock;
std::unordered_set<const void*> pinned_blocks;  // guarded by pinned_lock

struct PinnedAllocator final : at::HostAllocator {
  static void release(void* p) {
    {
      std::lock_guard<std::mutex> g(pinned_lock);
      pinned_blocks.erase(p);
    }
    c10::free_cpu(p);
  }
  static bool holds(const void* p) {
    std::lock_guard<std::mutex> g(pinned_lock);
    return pinned_blocks.count(p) > 0;
  }
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    std::lock_guard<std::mutex> g(pinned_lock);
    if (p) pinned_blocks.insert(p);
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator pinned_allocator;

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return tt_device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return (c10::DeviceIndex)tt_device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { current_device = d; }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device;
    current_device = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return make_generator(index); }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kTpu, current_device); }
  bool isPinnedPtr(const void* p) const override { return p && PinnedAllocator::holds(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};
}  // namespace

bool is_pinned_host(const at::Tensor& t) {
  return t.device().is_cpu() && t.has_storage() && PinnedAllocator::holds(t.storage().data());
}

void register_hooks() {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  at::setHostAllocator(kTpu, &pinned_allocator);
}

}  // namespace torchtpu
