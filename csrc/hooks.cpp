// The PrivateUse1 hooks: what PyTorch asks a backend outside any op (availability, current
// device, default generators, resizing storages).
#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "shim.h"

namespace torchtpu {
namespace {
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
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return at::getCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};
}  // namespace

void register_hooks() { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); }

}  // namespace torchtpu
