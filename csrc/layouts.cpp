// Layouts that cannot live on tpu (sparse COO and compressed, quantized, strided nested):
// NotImplementedError naming the op and the layout, in place of the dispatcher's list of
// backends or a tensor that no kernel can read. tpu holds dense (strided) tensors, and jagged
// nested tensors (Python subclasses over dense ones).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <regex>

#include "shim.h"

namespace torchtpu {
namespace {
struct Layout {
  const char* name;
  const char* instead;
};
constexpr Layout coo{"sparse (torch.sparse_coo)", "keep it on the CPU, or call to_dense() first"};
constexpr Layout compressed{"sparse compressed (torch.sparse_csr, csc, bsr or bsc)",
                            "keep it on the CPU, or call to_dense() first"};
constexpr Layout quantized{"quantized", "keep it on the CPU, or call dequantize() first"};
constexpr Layout nested{"strided nested", "use layout=torch.jagged in torch.nested.nested_tensor"};

template <const Layout* L>
void refuse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torchtpu: ", op.schema().operator_name(), " with a ", L->name,
                              " tensor on tpu: tpu holds dense (strided) tensors only; ", L->instead, ".");
}

// The compressed layouts' constructors are composites that take dense tensors (crow, col,
// values): on tpu they would build a tensor no sparse kernel serves, so they refuse instead.
bool builds_compressed(const std::string& name) {
  static const std::regex pattern("aten::_?sparse_(compressed|csr|csc|bsr|bsc)_tensor(_unsafe)?");
  return std::regex_match(name, pattern);
}
}  // namespace

void impl_sparse_refusal(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse<&coo>>());
}
void impl_sparse_csr_refusal(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse<&compressed>>());
}
void impl_quantized_refusal(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse<&quantized>>());
}
void impl_nested_refusal(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse<&nested>>());
}
void impl_compressed_constructor_refusal(torch::Library& m) {
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (!builds_compressed(name.name)) continue;
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&refuse<&compressed>>());
  }
}
}  // namespace torchtpu
