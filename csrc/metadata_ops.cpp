// Tensor metadata ops the shim implements itself (empty, views, resize_, set_, copies,
// reading a scalar): they touch storages and strides, never tensor values.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/InferSize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include "shim.h"

namespace torchtpu {
namespace {
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kTpu, current_device)));
  return at::detail::empty_generic(size, allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(c10::Device(kTpu, current_device)));
  return at::detail::empty_strided_generic(size, stride, allocator,
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
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator, true);
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

// Lets go of the storage that a non-blocking copy held (called by the engine when it is done).
void release_storage(void* storage) { delete static_cast<c10::Storage*>(storage); }

// A copy from or into pinned memory comes after the non-blocking copies still reading or
// writing that storage, as copies on one CUDA stream do (an offloaded cache sent to pinned
// memory and brought back).
void wait_for_copies(const at::Tensor& host) {
  if (is_pinned_host(host)) check(tt_host_wait(host.storage().data(), (int64_t)host.storage().nbytes()));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() == 0) return dst;
  if (dst.is_conj() || dst.is_neg()) {
    // Writing v through a conjugate (negative) view stores conj(v) (-v): copy the source with
    // that bit toggled into the view with the bit cleared (the same storage and strides).
    at::Tensor plain = dst.is_conj() ? dst.conj() : at::_neg_view(dst);
    copy_from(dst.is_conj() ? self.conj() : at::_neg_view(self), plain, non_blocking);
    return dst;
  }
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
    wait_for_copies(self);
    at::Tensor src = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    TtTensor d = describe(dst);
    if (non_blocking && is_pinned_host(self)) {
      // As CUDA's: the copy reads pinned memory after returning; the caller leaves it unchanged
      // until a synchronization. The storage stays alive until then.
      check(tt_from_host_async(&d, src.data_ptr(), (int64_t)src.nbytes(), release_storage, new c10::Storage(src.storage())));
    } else {
      check(tt_from_host(&d, src.data_ptr(), (int64_t)src.nbytes()));
    }
  } else {
    TORCH_CHECK(dst.device().is_cpu(), "torchtpu: copy from tpu to ", dst.device(), " is not supported");
    wait_for_copies(dst);
    bool direct = dst.is_contiguous() && dst.scalar_type() == self.scalar_type() && dst.sizes() == self.sizes();
    at::Tensor host = direct ? dst : at::empty(self.sizes(), self.options().device(at::kCPU));
    TtTensor s = describe(self);
    if (direct && non_blocking && is_pinned_host(dst)) {
      // As CUDA's: pinned memory is written after returning, and read after a synchronization.
      check(tt_to_host_async(&s, host.data_ptr(), (int64_t)host.nbytes(), release_storage, new c10::Storage(host.storage())));
    } else {
      check(tt_to_host(&s, host.data_ptr(), (int64_t)host.nbytes()));
      if (!direct) dst.copy_(host);
    }
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor d = dst;
  resize_for_out(d, self.sizes());
  return copy_from(self, d, false);
}
// Which kernel F.scaled_dot_product_attention uses on tpu: the fused "overrideable" one
// (lowered in crates/lowerings/src/ops/attention.rs) for 4-d float32/bf16/f16 inputs without
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
}  // namespace

void resize_for_out(at::Tensor& t, c10::IntArrayRef sizes) {
  if (t.sizes() == sizes) return;
  if (t.numel() != 0) {
    TORCH_WARN("An output with one or more elements was resized since it had shape ",
               t.sizes(), ", which does not match the required output shape ", sizes, ". This behavior is "
               "deprecated, and in a future PyTorch release outputs will not be resized unless they have zero "
               "elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero elements "
               "with t.resize_(0).");
  }
  resize_(t, sizes, std::nullopt);
}

// torch._resize_output_ (PyTorch has it for meta tensors only): resize_for_out behind a device check.
const at::Tensor& resize_output_(const at::Tensor& self, c10::IntArrayRef size, c10::Device device) {
  bool same = self.device().type() == device.type() && (!device.has_index() || device.index() == self.device().index());
  TORCH_CHECK(same, "out Tensor doesn't have the correct device set");
  at::Tensor out = self;
  resize_for_out(out, size);
  return self;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(at::kCPU));
  TtTensor s = describe(self);
  check(tt_to_host(&s, host.data_ptr(), (int64_t)host.nbytes()));
  return host.item();
}

void register_sdp_choice() { at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice); }

// Copies handle the conjugate and negative bits themselves; without these fallthroughs the
// math-bit fallbacks would materialize the source with a copy that comes back here forever.
void impl_copy_fallthrough(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

void impl_metadata_ops(torch::Library& m) {
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
  m.impl("_resize_output_", resize_output_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
}

}  // namespace torchtpu
