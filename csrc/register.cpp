// tt_register_device: registers the device's parts (guard, allocator, hooks, kernels) with
// PyTorch, once, when Python asks.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "shim.h"

namespace torchtpu {
namespace {
// A compiled graph (torch.compile) runs as one op; its kernel is the boxed fallback. A graph
// that mutates inputs runs as run_graph_, which writes them in place; one that draws random
// numbers as the .random overloads (the generator None means the device's default one).
void def_torchtpu_ops(torch::Library& m) {
  m.def("run_graph(int graph, Tensor[] inputs) -> Tensor[]");
  // A user's kernel (StableHLO text or a serialized module) registered by torchtpu.kernels.
  m.def("stablehlo_kernel(int kernel, Tensor[] inputs) -> Tensor[]");
  m.def("run_graph_(int graph, Tensor(a!)[] mutated, Tensor[] inputs) -> Tensor[]");
  m.def("run_graph.random(int graph, Tensor[] inputs, Generator? generator) -> Tensor[]");
  m.def("run_graph_.random(int graph, Tensor(a!)[] mutated, Tensor[] inputs, Generator? generator) -> Tensor[]");
}

// The PrivateUse1 aten kernels: metadata ops first, then the ops routed to the fallback
// (which skips any op that has a PrivateUse1 kernel by then).
void impl_aten(torch::Library& m) {
  impl_metadata_ops(m);
  impl_routed_ops(m);
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
}  // namespace torchtpu

extern "C" void tt_register_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    using namespace torchtpu;
    register_guard();
    register_allocator();
    register_profiler();
    install_fault_handler();
    register_hooks();
    register_sdp_choice();
    using K = c10::DispatchKey;
    add_library(torch::Library::DEF, "torchtpu", std::nullopt, def_torchtpu_ops);
    add_library(torch::Library::IMPL, "_", K::PrivateUse1, impl_fallback);
    add_library(torch::Library::IMPL, "_", K::SparsePrivateUse1, impl_sparse_refusal);
    add_library(torch::Library::IMPL, "_", K::SparseCsrPrivateUse1, impl_sparse_csr_refusal);
    add_library(torch::Library::IMPL, "_", K::QuantizedPrivateUse1, impl_quantized_refusal);
    add_library(torch::Library::IMPL, "_", K::NestedTensorPrivateUse1, impl_nested_refusal);
    add_library(torch::Library::IMPL, "_", K::AutocastPrivateUse1, impl_autocast_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::AutocastPrivateUse1, impl_autocast);
    add_library(torch::Library::IMPL, "aten", K::Conjugate, impl_copy_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::Negative, impl_copy_fallthrough);
    add_library(torch::Library::IMPL, "aten", K::PrivateUse1, impl_aten);
    add_library(torch::Library::IMPL, "aten", K::AutogradPrivateUse1, impl_composite_checks);
    add_library(torch::Library::IMPL, "aten", K::PrivateUse1, impl_composite_checks);
    add_library(torch::Library::IMPL, "aten", K::AutogradPrivateUse1, impl_host_reads);
    add_library(torch::Library::IMPL, "aten", K::PrivateUse1, impl_host_reads);
    add_library(torch::Library::IMPL, "aten", K::AutogradPrivateUse1, impl_compressed_constructor_refusal);
    add_library(torch::Library::IMPL, "aten", K::PrivateUse1, impl_compressed_constructor_refusal);
  });
}

// Every aten overload's argument names, for the lowerings' check that a lowering reads only
// names some overload of its ops has (crates/torchtpu/src/schemas.rs).
extern "C" void tt_each_aten_schema(void (*visit)(void* ctx, const char* name, const char* const* args, size_t n),
                                    void* ctx) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = name.name.rfind("aten::", 0) == 0 ? dispatcher.findOp(name) : std::nullopt;
    if (!op || !op->hasSchema()) continue;
    std::vector<const char*> args;
    for (const auto& a : op->schema().arguments()) args.push_back(a.name().c_str());
    visit(ctx, name.name.c_str(), args.data(), args.size());
  }
}
