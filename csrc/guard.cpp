// The DeviceGuardImpl for "tpu": the current device (per thread), device count and
// synchronization; one default stream per device.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "shim.h"

namespace torchtpu {

thread_local constinit c10::DeviceIndex current_device = 0;

namespace {
struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kTpu, current_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "torchtpu: expected a tpu device, got ", d);
    TORCH_CHECK(d.index() >= 0 && d.index() < tt_device_count(), "Invalid device id ", (int)d.index(),
                ": torch.tpu.device_count() is ", tt_device_count());
    current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return (c10::DeviceIndex)tt_device_count(); }
  void synchronizeDevice(const c10::DeviceIndex index) const override { tt_synchronize(index); }
  void synchronizeStream(const c10::Stream& s) const override { tt_synchronize(s.device_index()); }
  bool queryStream(const c10::Stream&) const override { return true; }
};
}  // namespace

void register_guard() { static c10::impl::DeviceGuardImplRegistrar guard(kTpu, new TpuGuardImpl()); }

}  // namespace torchtpu
