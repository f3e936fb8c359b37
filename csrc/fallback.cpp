// The boxed fallback: every aten op without a kernel of its own is encoded into the C ABI
// (abi.h) and run by the Rust engine; its outputs come back as tensors. Also the engine's error
// statuses as PyTorch exceptions, list ops, and the opt-in CPU fallback.
#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "shim.h"

namespace torchtpu {

// ---- errors -------------------------------------------------------------------------------

namespace {
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
}  // namespace

const TtResult* check(const TtResult* r) {
  if (r->status == TT_ERR_NO_LOWERING) throw_status(TT_ERR_NOT_IMPLEMENTED, r->message);
  if (r->status != TT_OK && r->status != TT_RESIZE) throw_status(r->status, r->message);
  return r;
}

// ---- the float32 matmul precision ------------------------------------------------------------

namespace {
// Tells the engine when torch.get_float32_matmul_precision() changed (it keys programs by it).
// PyTorch refuses to answer when the legacy and the new (fp32_precision) settings were mixed;
// then the new CUDA matmul setting decides, as it would for a CUDA matmul.
void sync_float32_matmul_precision() {
  static std::atomic<int32_t> sent{0};
  auto& ctx = at::globalContext();
  int32_t now;
  try {
    now = static_cast<int32_t>(ctx.float32MatmulPrecision());
  } catch (const c10::Error&) {
    now = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) == at::Float32Precision::TF32;
  }
  if (sent.load(std::memory_order_relaxed) != now) {
    sent.store(now, std::memory_order_relaxed);
    tt_set_float32_matmul_precision(now);
  }
}
}  // namespace

// ---- encoding a call --------------------------------------------------------------------------

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

namespace {
at::Tensor wrap_out(const TtOut& o, c10::DeviceIndex device) {
  return wrap_cell(o.cell, (at::ScalarType)o.dtype, c10::IntArrayRef(o.sizes, o.ndim), device);
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
    const at::Tensor& t = v.toTensor();
    // A written argument (out=, self of an in-place op) must live on tpu: a host tensor would
    // be read as a copy and its write lost (0-d tensors pass the dispatcher's device check).
    bool written = schema_arg.alias_info() != nullptr && schema_arg.alias_info()->isWrite();
    TORCH_CHECK(!t.defined() || !written || t.device().type() == kTpu, "Expected out tensor to have device ",
                c10::Device(kTpu, current_device), ", but got ", t.device(), " instead");
    if (t.defined()) a = encode_tensor(f, t);
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
    auto [seed, offset] = next_random(g);
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
}  // namespace

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  uint64_t write_mask = 0;
  bool hidden_generator = false;
  int32_t id = op_id(op, &write_mask, &hidden_generator);
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  auto inputs = torch::jit::last(*stack, nargs);

  sync_float32_matmul_precision();
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
        auto [seed, offset] = next_random(default_generator(f.device));
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
      const auto& args = schema.arguments();
      auto it = std::find_if(args.begin(), args.end(), [&](const c10::Argument& a) {
        return a.alias_info() && a.alias_info()->beforeSets() == alias->beforeSets();
      });
      TORCH_CHECK(it != args.end(), "torchtpu: no argument aliases a return of ", schema.name());
      returns.push_back(inputs[it - args.begin()]);
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

namespace {
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
  for (const auto& v : args) n = v.isTensorList() ? std::max(n, v.toTensorList().size()) : n;
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
}  // namespace

void impl_fallback(torch::Library& m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

void impl_routed_ops(torch::Library& m) {
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
    if (family) m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&list_op>());
    else m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

}  // namespace torchtpu
