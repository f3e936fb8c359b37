// The C++ shim: the parts of the "tpu" device that PyTorch's dispatcher ABI forces into C++.
// It knows no op semantics: tensor metadata ops live here, every other aten op goes through
// one boxed fallback to the Rust engine (abi.h).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <unordered_map>
#include <vector>

#include "abi.h"
#include "torch_compat.h"

namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// ---- errors -------------------------------------------------------------------------------

[[noreturn]] void throw_status(int32_t status, const char* message) {
  std::string msg = message ? message : "torchtpu: unknown error";
  switch (status) {
    case TT_ERR_VALUE: throw c10::ValueError({__func__, __FILE__, __LINE__}, msg);
    case TT_ERR_TYPE: throw c10::TypeError({__func__, __FILE__, __LINE__}, msg);
    case TT_ERR_INDEX: throw c10::IndexError({__func__, __FILE__, __LINE__}, msg);
    case TT_ERR_NOT_IMPLEMENTED: throw c10::NotImplementedError({__func__, __FILE__, __LINE__}, msg);
    case TT_ERR_OUT_OF_MEMORY: throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "tpu out of memory. " + msg);
    default: throw c10::Error({__func__, __FILE__, __LINE__}, msg);
  }
}

const TtResult* check(const TtResult* r) {
  if (r->status == TT_ERR_NO_LOWERING) throw_status(TT_ERR_NOT_IMPLEMENTED, r->message);
  if (r->status != TT_OK && r->status != TT_RESIZE) throw_status(r->status, r->message);
  return r;
}

// ---- device guard -------------------------------------------------------------------------

thread_local c10::DeviceIndex current_device = 0;

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

// ---- allocator: a storage's context is a Rust storage cell ---------------------------------
// Its data pointer is an address of the cell's own range in a region that faults on any
// access (abi.h). A DeviceAllocator, so that torch.accelerator's memory functions work on
// "tpu"; nothing is cached here: a device buffer is freed when its last storage dies.

void release_cell(void* cell) { tt_cell_release(cell); }

void* cell_of(const c10::Storage& storage) { return storage.data_ptr().get_context(); }

c10::DataPtr cell_data_ptr(void* cell, c10::Device device) {
  void* address = tt_cell_address(cell);
  if (!address) {
    tt_cell_release(cell);
    throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__},
                                "tpu out of memory: the storage is larger than the device address space");
  }
  return {address, cell, &release_cell, device};
}

// Grows a storage's cell; growing past its address range moves it to a new address.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  void* cell = cell_of(storage);
  check(tt_cell_resize(cell, (int64_t)nbytes));
  auto* impl = storage.unsafeGetStorageImpl();
  void* address = tt_cell_address(cell);
  TORCH_CHECK_WITH(OutOfMemoryError, address, "tpu out of memory: the storage is larger than the device address space");
  if (address != storage.data_ptr().get()) {
    c10::DataPtr old = impl->set_data_ptr(c10::DataPtr(address, cell, &release_cell, storage.device()));
    (void)old.release_context();  // the cell now belongs to the new DataPtr
  }
  impl->set_nbytes(nbytes);
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
    return cell_data_ptr(tt_cell_new((int64_t)nbytes, current_device), device);
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
TpuAllocator allocator;

// ---- generator: (seed, offset); the engine derives each op's random key from both ---------

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
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::kByte);
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

at::Generator make_generator(c10::DeviceIndex index) { return at::make_generator<TpuGenerator>(index); }

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    for (int i = 0; i < std::max(1, tt_device_count()); i++) v.push_back(make_generator(i));
    return v;
  }();
  return gens;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  auto& gens = default_generators();
  if (index < 0) index = current_device;
  TORCH_CHECK(index < (c10::DeviceIndex)gens.size(), "Invalid device index ", (int)index);
  return gens[index];
}

// ---- hooks -----------------------------------------------------------------------------------

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

// ---- tensors from engine outputs -----------------------------------------------------------

at::Tensor wrap_cell(void* cell, at::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceIndex device) {
  int64_t numel = c10::multiply_integers(sizes);
  size_t nbytes = (size_t)numel * c10::elementSize(dtype);
  c10::DataPtr data = cell_data_ptr(cell, c10::Device(kTpu, device));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &allocator, true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

at::Tensor wrap_out(const TtOut& o, c10::DeviceIndex device) {
  return wrap_cell(o.cell, (at::ScalarType)o.dtype, c10::IntArrayRef(o.sizes, o.ndim), device);
}

// ---- encoding a call --------------------------------------------------------------------------

// Keeps what an encoded call points into alive until the call returns. Inner vectors keep
// their heap buffers when the outer ones grow, so pointers into them stay valid; nothing is
// allocated for calls without lists, strings or host tensors (the common case).
struct CallFrame {
  std::vector<TtArg> args;
  std::vector<std::vector<TtArg>> lists;
  std::vector<at::Tensor> host_copies;
  std::vector<std::vector<int64_t>> ints;
  std::vector<std::vector<double>> floats;
  std::vector<std::vector<uint8_t>> bools;
  c10::DeviceIndex device = -1;
};

TtArg encode_tensor(CallFrame& f, const at::Tensor& t_in) {
  // Ops the math-bit keys fall through for (mm, ...) can see conjugate or negative views: the
  // engine reads plain values, so resolve the bits first (a copy that applies them).
  at::Tensor t = t_in;
  if (t.is_conj() || t.is_neg()) {
    t = t.resolve_conj().resolve_neg();
    f.host_copies.push_back(t);  // keeps the resolved copy alive for the call
  }
  TtArg a{};
  a.kind = TT_TENSOR;
  TtTensor& e = a.t;
  e.dtype = (int8_t)t.scalar_type();
  e.ndim = (int32_t)t.dim();
  e.sizes = t.sizes().data();
  e.strides = t.strides().data();
  e.offset = t.storage_offset();
  if (t.device().type() == kTpu) {
    e.cell = cell_of(t.storage());
    if (f.device < 0) f.device = t.device().index();
  } else {
    TORCH_CHECK(t.device().is_cpu(), "torchtpu: cannot mix device ", t.device(), " with tpu tensors");
    at::Tensor c = t.contiguous();
    f.host_copies.push_back(c);
    e.host = c.data_ptr();
    e.sizes = c.sizes().data();
    e.strides = c.strides().data();
    e.offset = 0;
    e.flags = TT_HOST | (t.unsafeGetTensorImpl()->is_wrapped_number() ? TT_WRAPPED_NUMBER : 0);
  }
  return a;
}

TtArg encode_scalar(const c10::Scalar& s) {
  TtArg a{};
  if (s.isBoolean()) {
    a.kind = TT_BOOL;
    a.n.i = s.toBool();
  } else if (s.isIntegral(false)) {
    a.kind = TT_INT;
    a.n.i = s.toLong();
  } else if (s.isComplex()) {
    a.kind = TT_COMPLEX;
    auto c = s.toComplexDouble();
    a.c.re = c.real();
    a.c.im = c.imag();
  } else {
    a.kind = TT_FLOAT;
    a.f = s.toDouble();
  }
  return a;
}

TtArg encode(CallFrame& f, const c10::IValue& v, const c10::Argument& schema_arg) {
  TtArg a{};
  if (v.isNone()) {
    if (schema_arg.type()->kind() == c10::TypeKind::OptionalType &&
        schema_arg.type()->castRaw<c10::OptionalType>()->getElementType()->kind() ==
            c10::TypeKind::GeneratorType) {
      a.kind = TT_GENERATOR;  // filled in by the caller once the device is known
      a.n.i = -1;
    } else {
      a.kind = TT_NONE;
    }
  } else if (v.isTensor()) {
    // Autograd passes undefined tensors for gradients that are zero: they mean None.
    if (v.toTensor().defined()) a = encode_tensor(f, v.toTensor());
    else a.kind = TT_NONE;
  } else if (v.isBool()) {
    a.kind = TT_BOOL;
    a.n.i = v.toBool();
  } else if (v.isInt()) {
    a.kind = TT_INT;
    a.n.i = v.toInt();
    // real_type: a ScalarType argument's type() is plain int.
    const auto& ty = schema_arg.real_type();
    auto k = ty->kind();
    if (k == c10::TypeKind::OptionalType) k = ty->castRaw<c10::OptionalType>()->getElementType()->kind();
    if (k == c10::TypeKind::ScalarTypeType) a.kind = TT_SCALAR_TYPE;
    else if (k == c10::TypeKind::LayoutType || k == c10::TypeKind::MemoryFormatType) a.kind = TT_OTHER;
  } else if (v.isDouble()) {
    a.kind = TT_FLOAT;
    a.f = v.toDouble();
  } else if (v.isComplexDouble()) {
    a.kind = TT_COMPLEX;
    auto c = v.toComplexDouble();
    a.c.re = c.real();
    a.c.im = c.imag();
  } else if (v.isScalar()) {
    a = encode_scalar(v.toScalar());
  } else if (v.isIntList()) {
    f.ints.push_back(v.toIntVector());
    a.kind = TT_INT_LIST;
    a.list.ptr = f.ints.back().data();
    a.list.len = f.ints.back().size();
  } else if (v.isDoubleList()) {
    f.floats.push_back(v.toDoubleVector());
    a.kind = TT_FLOAT_LIST;
    a.list.ptr = f.floats.back().data();
    a.list.len = f.floats.back().size();
  } else if (v.isBoolList()) {
    auto bl = v.toBoolList();
    f.bools.emplace_back(bl.begin(), bl.end());
    a.kind = TT_BOOL_LIST;
    a.list.ptr = f.bools.back().data();
    a.list.len = f.bools.back().size();
  } else if (v.isTensorList() || v.isOptionalTensorList() || v.isList()) {
    auto items = v.toListRef();
    f.lists.emplace_back();
    auto& out = f.lists.back();
    out.reserve(items.size());
    for (const auto& item : items) {
      if (item.isTensor() && item.toTensor().defined()) out.push_back(encode_tensor(f, item.toTensor()));
      else if (item.isTensor()) out.push_back(TtArg{});
      else if (item.isNone()) out.push_back(TtArg{});
      else if (item.isScalar() || item.isDouble() || item.isInt()) out.push_back(encode_scalar(item.toScalar()));
      else TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: unsupported list item ", item.tagKind());
    }
    a.kind = TT_TENSOR_LIST;
    a.list.ptr = out.data();
    a.list.len = out.size();
  } else if (v.isString()) {
    // The string lives in the IValue on the stack for the whole call.
    const std::string& str = v.toStringRef();
    a.kind = TT_STR;
    a.list.ptr = str.data();
    a.list.len = str.size();
  } else if (v.isGenerator()) {
    a.kind = TT_GENERATOR;
    auto g = v.toGenerator();
    auto [seed, offset] = g.get<TpuGenerator>()->next();
    a.n.i = (int64_t)seed;
    a.n.i2 = (int64_t)offset;
  } else if (v.isDevice()) {
    a.kind = TT_OTHER;
  } else {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: unsupported argument kind ", v.tagKind(), " for ",
                                schema_arg.name());
  }
  return a;
}

// ---- the boxed fallback ---------------------------------------------------------------------

struct OpEntry {
  int32_t id;
  uint64_t write_mask;
  bool hidden_generator;
};

// A random op without a Generator argument (native_dropout): the engine gets the device's
// default generator as one extra trailing argument named "generator".
bool needs_hidden_generator(const c10::OperatorHandle& op) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  for (const auto& a : op.schema().arguments()) {
    auto t = a.type();
    if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) return false;
  }
  return true;
}

int32_t op_id(const c10::OperatorHandle& op, uint64_t* write_mask, bool* hidden_generator) {
  static std::mutex mu;
  static std::unordered_map<const void*, OpEntry> ids;
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(mu);
  auto it = ids.find(key);
  if (it != ids.end()) {
    *write_mask = it->second.write_mask;
    *hidden_generator = it->second.hidden_generator;
    return it->second.id;
  }
  const auto& schema = op.schema();
  std::string names;
  uint64_t mask = 0;
  const auto& args = schema.arguments();
  TORCH_CHECK(args.size() < 64, "torchtpu: too many arguments in ", schema.name());
  for (size_t i = 0; i < args.size(); i++) {
    names += args[i].name();
    names.push_back('\0');
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) mask |= (1ULL << i);
  }
  bool hidden = needs_hidden_generator(op);
  if (hidden) {
    names += "generator";
    names.push_back('\0');
  }
  int32_t id = tt_op_register(schema.name().c_str(), schema.overload_name().c_str(), names.data(),
                              (int32_t)(args.size() + hidden), mask);
  ids[key] = {id, mask, hidden};
  *write_mask = mask;
  *hidden_generator = hidden;
  return id;
}

void resize_for_out(at::Tensor& t, c10::IntArrayRef sizes);
at::Scalar local_scalar_dense(const at::Tensor& self);

bool cpu_fallback_enabled() {
  static bool on = [] {
    const char* v = std::getenv("TORCHTPU_CPU_FALLBACK");
    return v && std::string(v) != "0" && std::string(v) != "";
  }();
  return on;
}

// Runs an op with no lowering on the host (TORCHTPU_CPU_FALLBACK=1), warning once per op.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static std::mutex mu;
  static std::unordered_set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(op.schema().operator_name().name + "." + op.schema().overload_name()).second) {
      TORCH_WARN("torchtpu: the operator '", op.schema().operator_name(), "' has no tpu lowering; running it on the "
                 "CPU (TORCHTPU_CPU_FALLBACK=1). This copies its tensors to the host and back.");
    }
  }
  at::native::cpu_fallback(op, stack);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  uint64_t write_mask = 0;
  bool hidden_generator = false;
  int32_t id = op_id(op, &write_mask, &hidden_generator);
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  auto inputs = torch::jit::last(*stack, nargs);

  const TtResult* r = nullptr;
  // Each retry resizes one out= argument; there are at most nargs of them.
  for (size_t attempt = 0; attempt <= nargs; attempt++) {
    CallFrame f;
    f.args.reserve(nargs + 1);
    for (size_t i = 0; i < nargs; i++) f.args.push_back(encode(f, inputs[i], schema.arguments()[i]));
    if (hidden_generator) {
      TtArg g{};
      g.kind = TT_GENERATOR;
      g.n.i = -1;
      f.args.push_back(g);
    }
    for (auto& a : f.args) {
      if (a.kind == TT_GENERATOR && a.n.i == -1) {
        auto [seed, offset] = default_generator(f.device).get<TpuGenerator>()->next();
        a.n.i = (int64_t)seed;
        a.n.i2 = (int64_t)offset;
      }
    }
    r = tt_op_call(id, f.args.data(), f.args.size());
    if (r->status == TT_ERR_NO_LOWERING && cpu_fallback_enabled()) {
      run_on_cpu(op, stack);
      return;
    }
    check(r);
    if (r->status != TT_RESIZE) break;
    // An out= argument has the wrong size: resize it like PyTorch's resize_output, then retry.
    at::Tensor out = inputs[r->resize_arg].toTensor();
    resize_for_out(out, c10::IntArrayRef(r->outs[0].sizes, r->outs[0].ndim));
  }
  TORCH_CHECK(r->status == TT_OK, "torchtpu: ", schema.name(), ": out= argument could not be resized");

  c10::DeviceIndex device = current_device;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kTpu) {
      device = v.toTensor().device().index();
      break;
    }
  }
  // Returns: an aliased return (a!) is the argument itself; the rest come from the engine.
  std::vector<c10::IValue> returns;
  size_t next = 0;
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    if (alias && alias->isWrite()) {
      bool found = false;
      for (size_t i = 0; i < nargs && !found; i++) {
        const auto* a = schema.arguments()[i].alias_info();
        if (a && a->beforeSets() == alias->beforeSets()) {
          returns.push_back(inputs[i]);
          found = true;
        }
      }
      TORCH_CHECK(found, "torchtpu: no argument aliases a return of ", schema.name());
      continue;
    }
    TORCH_CHECK(next < r->nouts, "torchtpu: ", schema.name(), " returned too few values");
    const TtOut& o = r->outs[next++];
    switch (o.kind) {
      case TT_OUT_TENSOR: returns.emplace_back(wrap_out(o, device)); break;
      case TT_OUT_UNDEFINED: returns.emplace_back(at::Tensor()); break;
      case TT_OUT_LIST: {
        std::vector<at::Tensor> items;
        for (int64_t k = 0; k < o.i; k++) items.push_back(wrap_out(r->outs[next++], device));
        returns.emplace_back(std::move(items));
        break;
      }
    }
  }
  // A number return (equal -> bool, max_q -> int) comes back as a 0-d tensor: read it, after
  // every output is wrapped (a read reuses the engine's result buffer).
  for (size_t i = 0; i < returns.size(); i++) {
    if (!returns[i].isTensor()) continue;
    switch (schema.returns()[i].real_type()->kind()) {
      case c10::TypeKind::BoolType: returns[i] = local_scalar_dense(returns[i].toTensor()).toBool(); break;
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType: returns[i] = local_scalar_dense(returns[i].toTensor()).toLong(); break;
      case c10::TypeKind::FloatType: returns[i] = local_scalar_dense(returns[i].toTensor()).toDouble(); break;
      default: break;
    }
  }
  torch::jit::drop(*stack, nargs);
  for (auto& v : returns) stack->push_back(std::move(v));
}

// A list op (_foreach_*) runs as one program reading every input first; PyTorch's loop runs
// item by item. When an item it writes shares a storage with an item at another position,
// the order shows: run those calls item by item too.
bool list_items_alias(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  std::unordered_map<const void*, size_t> written;
  for (size_t i = 0; i < args.size(); i++) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (!alias || !alias->isWrite() || !args[i].isTensorList()) continue;
    auto items = args[i].toTensorList();
    for (size_t k = 0; k < items.size(); k++) {
      auto [it, fresh] = written.emplace(items.get(k).storage().unsafeGetStorageImpl(), k);
      if (!fresh && it->second != k) return true;
    }
  }
  for (const auto& v : args) {
    if (!v.isTensorList()) continue;
    auto items = v.toTensorList();
    for (size_t k = 0; k < items.size(); k++) {
      auto it = written.find(items.get(k).storage().unsafeGetStorageImpl());
      if (it != written.end() && it->second != k) return true;
    }
  }
  return false;
}

void list_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  if (!list_items_alias(schema, torch::jit::last(*stack, nargs))) return fallback(op, stack);
  TORCH_CHECK(schema.returns().empty(), "torchtpu: ", schema.name(), ": aliased list items in an op with results");
  std::vector<c10::IValue> args(stack->end() - nargs, stack->end());
  torch::jit::drop(*stack, nargs);
  size_t n = 0;
  for (const auto& v : args) {
    if (v.isTensorList()) n = std::max(n, v.toTensorList().size());
  }
  for (size_t k = 0; k < n; k++) {
    for (const auto& v : args) {
      if (v.isList() && v.toList().size() == n) {
        c10::impl::GenericList item(v.toList().elementType());
        item.push_back(v.toList().get(k));
        stack->emplace_back(std::move(item));
      } else {
        stack->push_back(v);
      }
    }
    fallback(op, stack);
  }
}

// ---- metadata ops ------------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kTpu, current_device)));
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kTpu, current_device)));
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()));
}

at::Tensor make_view(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(self.storage()),
                                                    self.key_set(), self.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return t;
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  int64_t off = offset.value_or(self.storage_offset());
  TORCH_CHECK(size.size() == stride.size(), "mismatch in length of strides and shape");
  for (auto s : stride) TORCH_CHECK(s >= 0, "as_strided: Negative strides are not supported at the moment, got strides: ", stride);
  TORCH_CHECK(off >= 0, "Tensor: invalid storage offset ", off);
  size_t needed = at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), off);
  TORCH_CHECK(needed <= self.storage().nbytes(), "setStorage: sizes ", size, ", strides ", stride,
              ", storage offset ", off, ", and itemsize ", self.dtype().itemsize(), " requiring a storage size of ",
              needed, " are out of bounds for storage of size ", self.storage().nbytes());
  return make_view(self, size, stride, off);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  auto inferred = at::infer_size_dv(size, self.numel());
  auto stride = at::detail::computeStride(self.sizes(), self.strides(), inferred);
  TORCH_CHECK(stride.has_value(),
              "view size is not compatible with input tensor's size and stride (at least one dimension spans "
              "across two contiguous subspaces). Use .reshape(...) instead.");
  return make_view(self, inferred, *stride, self.storage_offset());
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return make_view(self, size, stride, self.storage_offset());
}

at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  int64_t nd = std::max<int64_t>(self.dim(), 1);
  dim = c10::maybe_wrap_dim(dim, nd);
  int64_t dim_size = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(size <= dim_size, "maximum size for tensor at dimension ", dim, " is ", dim_size, " but size is ", size);
  TORCH_CHECK(step > 0, "step is ", step, " but must be > 0");
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  std::vector<int64_t> strides(self.strides().begin(), self.strides().end());
  int64_t dim_stride = self.dim() == 0 ? 1 : strides[dim];
  if (self.dim() > 0) {
    sizes[dim] = (dim_size - size) / step + 1;
    strides[dim] = step * dim_stride;
  }
  sizes.push_back(size);
  strides.push_back(dim_stride);
  return make_view(self, sizes, strides, self.storage_offset());
}

void resize_storage_to(const at::Tensor& self, size_t nbytes) {
  auto storage = self.storage();
  if (nbytes > storage.nbytes()) resize_storage_bytes(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  for (auto s : size) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (format.has_value() && *format != at::MemoryFormat::Preserve && *format != at::MemoryFormat::Contiguous) {
    impl->empty_tensor_restride(*format);
  }
  resize_storage_to(self, at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                           self.storage_offset()));
  return self;
}

void resize_for_out(at::Tensor& t, c10::IntArrayRef sizes) {
  if (t.sizes() == sizes) return;
  if (t.numel() != 0) {
    TORCH_WARN_ONCE("An output with one or more elements was resized since it had shape ",
                     t.sizes(), ", which does not match the required output shape ", sizes, ". This behavior is "
                     "deprecated, and in a future PyTorch release outputs will not be resized unless they have zero "
                     "elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero elements "
                     "with t.resize_(0).");
  }
  resize_(t, sizes, std::nullopt);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  if (!(impl->storage().is_alias_of(source))) impl->set_storage_keep_dtype(std::move(source));
  std::optional<c10::IntArrayRef> st = stride.empty() ? std::nullopt : std::optional<c10::IntArrayRef>(stride);
  if (st) impl->set_sizes_and_strides(size, *st, offset);
  else {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  }
  resize_storage_to(self, at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                           self.storage_offset()));
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = (int64_t)(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return self;
  return set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &allocator, true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

TtTensor describe(const at::Tensor& t) {
  TtTensor e{};
  e.cell = cell_of(t.storage());
  e.sizes = t.sizes().data();
  e.strides = t.strides().data();
  e.offset = t.storage_offset();
  e.ndim = (int32_t)t.dim();
  e.dtype = (int8_t)t.scalar_type();
  return e;
}

int32_t copy_op_id() {
  static int32_t id = [] {
    const char names[] = "self\0src\0non_blocking\0";
    return tt_op_register("aten::copy_", "", names, 3, 1);
  }();
  return id;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() == 0) return dst;
  TORCH_CHECK_NOT_IMPLEMENTED(!dst.is_conj() && !dst.is_neg(), "torchtpu: copying into a conjugate or negative view");
  if (self.is_conj() || self.is_neg()) {
    // Copy the stored values, then apply the pending conjugation / negation to the copy
    // (the Conjugate and Negative keys fall through to here, see below).
    at::Tensor raw = self.is_conj() ? self.conj() : self;
    raw = raw.is_neg() ? at::_neg_view(raw) : raw;
    copy_from(raw, dst, non_blocking);
    at::Tensor d = dst;
    // conj_physical_ is a composite over a CPU-only kernel stub: on tpu use the functional op.
    if (self.is_conj()) d.device().is_cpu() ? d.conj_physical_() : d.copy_(at::conj_physical(d));
    if (self.is_neg()) d.neg_();
    return dst;
  }
  if (dst.device().type() == kTpu && self.device().type() == kTpu) {
    CallFrame f;
    TtArg args[3]{};
    args[0] = encode_tensor(f, dst);
    args[1] = encode_tensor(f, self);
    args[2].kind = TT_BOOL;
    check(tt_op_call(copy_op_id(), args, 3));
  } else if (dst.device().type() == kTpu) {
    TORCH_CHECK(self.device().is_cpu(), "torchtpu: copy from ", self.device(), " to tpu is not supported");
    at::Tensor src = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    TtTensor d = describe(dst);
    check(tt_from_host(&d, src.data_ptr(), (int64_t)src.nbytes()));
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "torchtpu: copy from tpu to ", dst.device(), " is not supported");
    bool direct = dst.is_contiguous() && dst.scalar_type() == self.scalar_type() && dst.sizes() == self.sizes();
    at::Tensor host = direct ? dst : at::empty(self.sizes(), self.options().device(at::kCPU));
    TtTensor s = describe(self);
    check(tt_to_host(&s, host.data_ptr(), (int64_t)host.nbytes()));
    if (!direct) dst.copy_(host);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor d = dst;
  resize_for_out(d, self.sizes());
  return copy_from(self, d, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(at::kCPU));
  TtTensor s = describe(self);
  check(tt_to_host(&s, host.data_ptr(), (int64_t)host.nbytes()));
  return host.item();
}

// Which kernel F.scaled_dot_product_attention uses on tpu: the fused "overrideable" one
// (lowered in crates/lowerings/src/attention.rs) for 4-d float32/bf16/f16 inputs without
// dropout, unless the user disabled it (torch.nn.attention.sdpa_kernel); PyTorch's math
// composite otherwise.
int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                   double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  auto dt = q.scalar_type();
  bool fused = ctx.userEnabledOverrideableSDP() && dropout_p == 0.0 && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
               (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf) && k.scalar_type() == dt &&
               v.scalar_type() == dt && !q.is_nested() && (enable_gqa || q.size(1) == k.size(1));
  if (fused) return static_cast<int64_t>(at::SDPBackend::overrideable);
  return static_cast<int64_t>(ctx.userEnabledMathSDP() ? at::SDPBackend::math : at::SDPBackend::error);
}

// A compiled graph (torch.compile) runs as one op; its kernel is the boxed fallback. A graph
// that mutates inputs runs as run_graph_, which writes them in place.
void def_torchtpu_ops(torch::Library& m) {
  m.def("run_graph(int graph, Tensor[] inputs) -> Tensor[]");
  m.def("run_graph_(int graph, Tensor(a!)[] mutated, Tensor[] inputs) -> Tensor[]");
}

void impl_fallback(torch::Library& m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// torch.autocast("tpu"): CUDA's policy, from PyTorch's own op lists (autocast_mode.h): matmuls
// and convolutions run in the autocast dtype, reductions and losses in float32, mixed inputs of
// a few ops promote; every other op passes through.
#define TT_AUTOCAST(POLICY, ...) KERNEL(c10::DeviceType::PrivateUse1, __VA_ARGS__, POLICY)
#define TT_AUTOCAST_LOWER(...) TT_AUTOCAST(lower_precision_fp, __VA_ARGS__)
#define TT_AUTOCAST_FP32(...) TT_AUTOCAST(fp32, __VA_ARGS__)
#define TT_AUTOCAST_FP32_SET_OPT_DTYPE(...) TT_AUTOCAST(fp32_set_opt_dtype, __VA_ARGS__)
#define TT_AUTOCAST_PROMOTE(...) TT_AUTOCAST(promote, __VA_ARGS__)
#define TT_AUTOCAST_APPEND_DTYPE(FUNC, NAME, SIGNATURE, REDISPATCH, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(c10::DeviceType::PrivateUse1, FUNC, NAME, SIGNATURE, REDISPATCH, POLICY)
void impl_autocast_fallthrough(torch::Library& m) { m.fallback(torch::CppFunction::makeFallthrough()); }
void impl_autocast(torch::Library& m) {
  using at::Tensor;
  using at::Scalar;
  using at::IntArrayRef;
  using at::ScalarType;
  TT_USING_DIMNAME_LIST
  AT_FORALL_LOWER_PRECISION_FP(TT_AUTOCAST_LOWER)
  AT_FORALL_FP32(TT_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TT_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(TT_AUTOCAST_APPEND_DTYPE)
  AT_FORALL_PROMOTE(TT_AUTOCAST_PROMOTE)
}

// Copies handle the conjugate and negative bits themselves; without these fallthroughs the
// math-bit fallbacks would materialize the source with a copy that comes back here forever.
void impl_copy_fallthrough(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

void impl_aten(torch::Library& m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  // Views with another dtype over the same storage (the engine reinterprets the bytes):
  // PyTorch's own device-generic metadata functions, with its checks and messages.
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  // Ops whose composite kernels would shadow the fallback; the list lives with the lowerings.
  for (const char* name = tt_routed_ops(); *name; name += std::strlen(name) + 1) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
  // Structured ops (add.Tensor, mul_.Tensor, ...) get a generated composite kernel that
  // allocates an output and calls the op's out= form. When the op has a lowering, run the
  // functional and in-place forms directly instead: one call, no empty output to fill.
  // Families such as _foreach_* (a composite that loops one op per tensor) go there too.
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || !tt_route_structured(name.name.c_str(), name.overload_name.c_str())) {
      continue;
    }
    auto op = dispatcher.findOp(name);
    bool family = tt_route_family(name.name.c_str());
    bool composite = op && (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) || family);
    if (!composite || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (family) {
      m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&list_op>());
    } else {
      m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
    }
  }
}

// ---- faults at tpu addresses --------------------------------------------------------------
// A kernel that reads or writes a tpu tensor's data pointer as host memory faults in the
// reserved region (abi.h). Say so, then hand the fault to the handler installed before ours
// (Python's faulthandler prints the Python stack) or to the default action: returning re-runs
// the faulting access, which faults again into that handler.

struct sigaction previous_segv, previous_bus;
size_t region_base = 0, region_len = 0;

void on_fault(int sig, siginfo_t* info, void*) {
  auto address = reinterpret_cast<size_t>(info->si_addr);
  if (region_len && address - region_base < region_len) {
    static const char message[] =
        "\ntorchtpu: a kernel read or wrote the data of a tpu tensor as host memory (the address is a "
        "tpu device address; tpu tensors have no host memory). The op needs a tpu kernel: report it, "
        "or move its inputs to the CPU to run it there.\n";
    (void)!write(2, message, sizeof message - 1);
  }
  sigaction(sig, sig == SIGBUS ? &previous_bus : &previous_segv, nullptr);
}

void install_fault_handler() {
  tt_address_region(&region_base, &region_len);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous_segv);
  sigaction(SIGBUS, &action, &previous_bus);
}

// Registration is explicit, not by static initializers: Python calls tt_register_device()
// once it has checked that the running torch is the one this shim was built for (a shim
// loaded into another torch would register with the wrong DispatchKey numbers).
std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  return libs;
}

void add_library(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
                 void (*init)(torch::Library&)) {
  auto lib = std::make_unique<torch::Library>(kind, ns, key, __FILE__, __LINE__);
  init(*lib);
  libraries().push_back(std::move(lib));
}

}  // namespace

extern "C" void tt_register_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    static c10::impl::DeviceGuardImplRegistrar guard(kTpu, new TpuGuardImpl());
    c10::SetAllocator(kTpu, &allocator);
    install_fault_handler();
    at::RegisterPrivateUse1HooksInterface(new TpuHooks());
    at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice);
    using K = c10::DispatchKey;
    add_library(torch::Library::DEF, "torchtpu", std::nullopt, def_torchtpu_ops);
    add_library(torch::Library::IMPL, "_", K::PrivateUse1, impl_fallback);
    add_library(torch::Library::IMPL, "_", K::AutocastPrivateUse1, impl_autocast_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::AutocastPrivateUse1, impl_autocast);
    add_library(torch::Library::IMPL, "aten", K::Conjugate, impl_copy_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::Negative, impl_copy_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::PrivateUse1, impl_aten);
  });
}

// Called from Rust (the Python module) for torch.tpu.manual_seed and the RNG state.
extern "C" void tt_generator_set(int32_t device, uint64_t seed, uint64_t offset) {
  at::Generator g = default_generator((c10::DeviceIndex)device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
  g.set_offset(offset);
}

extern "C" void tt_generator_get(int32_t device, uint64_t* seed, uint64_t* offset) {
  at::Generator g = default_generator((c10::DeviceIndex)device);
  std::lock_guard<std::mutex> lock(g.mutex());
  *seed = g.current_seed();
  *offset = g.get_offset();
}
