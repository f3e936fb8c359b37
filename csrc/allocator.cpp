// The tpu allocator: a storage's context is a Rust storage cell. Also growing a storage, the
// memory statistics torch.accelerator reads, and tensors over the engine's output cells.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>

#include "shim.h"

namespace torchtpu {
namespace {
// Its data pointer is an address of the cell's own range in a region that faults on any
// access (abi.h). A DeviceAllocator, so that torch.accelerator's memory functions work on
// "tpu"; nothing is cached here: a device buffer is freed when its last storage dies.

void release_cell(void* cell) {
  tt_history_free(cell);
  tt_cell_release(cell);
}

c10::DataPtr cell_data_ptr(void* cell, size_t nbytes, c10::Device device) {
  void* address = tt_cell_address(cell);
  if (!address) {
    tt_cell_release(cell);
    throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__},
                                "tpu out of memory: the storage is larger than the device address space");
  }
  tt_history_alloc(cell, address, nbytes, device.index());
  return {address, cell, &release_cell, device};
}

void copy_stat(const TtStat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    auto device = c10::Device(kTpu, current_device);
    return cell_data_ptr(tt_cell_new((int64_t)nbytes, current_device), nbytes, device);
  }
  // raw_allocate/raw_deallocate hand out bare data pointers, which cannot carry the cell.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    void* d = tt_cell_at(dest);
    void* s = tt_cell_at(src);
    TORCH_CHECK(d && s, "torchtpu: copy_data between pointers that are not tpu storages");
    check(tt_cell_copy_bytes(d, s, (int64_t)count));
  }
  bool initialized() override { return tt_is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one stream per device
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    TtMemoryStats m{};
    tt_memory_stats(device, &m);
    c10::CachingDeviceAllocator::DeviceStats s;
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    // Every buffer is its own allocation, active while it lives, in one segment of its own
    // (on the CPU plugin; on GPU and TPU the plugin's pool is the reserved memory).
    copy_stat(m.buffers, s.allocation[all]);
    copy_stat(m.buffers, s.active[all]);
    copy_stat(m.buffers, s.segment[all]);
    copy_stat(m.bytes, s.allocated_bytes[all]);
    copy_stat(m.bytes, s.active_bytes[all]);
    copy_stat(m.bytes, s.requested_bytes[all]);
    copy_stat(m.reserved, s.reserved_bytes[all]);
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { tt_memory_reset(device, false, true); }
  void resetPeakStats(c10::DeviceIndex device) override { tt_memory_reset(device, true, false); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    int64_t free_bytes = 0, total_bytes = 0;
    check(tt_memory_info(device, &free_bytes, &total_bytes));
    return {(size_t)free_bytes, (size_t)total_bytes};
  }
};
TpuAllocator tpu_allocator;
}  // namespace

c10::Allocator* const allocator = &tpu_allocator;

void register_allocator() { c10::SetAllocator(kTpu, allocator); }

void* cell_of(const c10::Storage& storage) { return storage.data_ptr().get_context(); }

// Grows a storage's cell; growing past its address range moves it to a new address.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  void* cell = cell_of(storage);
  check(tt_cell_resize(cell, (int64_t)nbytes));
  auto* impl = storage.unsafeGetStorageImpl();
  void* address = tt_cell_address(cell);
  TORCH_CHECK_WITH(OutOfMemoryError, address, "tpu out of memory: the storage is larger than the device address space");
  if (address != storage.data_ptr().get() || nbytes != storage.nbytes()) {
    tt_history_free(cell);
    tt_history_alloc(cell, address, nbytes, storage.device().index());
  }
  if (address != storage.data_ptr().get()) {
    c10::DataPtr old = impl->set_data_ptr(c10::DataPtr(address, cell, &release_cell, storage.device()));
    (void)old.release_context();  // the cell now belongs to the new DataPtr
  }
  impl->set_nbytes(nbytes);
}

at::Tensor wrap_cell(void* cell, at::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceIndex device) {
  int64_t numel = c10::multiply_integers(sizes);
  size_t nbytes = (size_t)numel * c10::elementSize(dtype);
  c10::DataPtr data = cell_data_ptr(cell, nbytes, c10::Device(kTpu, device));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), allocator, true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

}  // namespace torchtpu
