// Checks in front of two PyTorch composites that index past the gates they chunk (a crash, on
// CPU too) when the gates are malformed; a well-formed call runs PyTorch's composite unchanged.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/_thnn_differentiable_gru_cell_backward_native.h>
#include <ATen/ops/_thnn_differentiable_lstm_cell_backward_native.h>
#include <torch/library.h>

#include "shim.h"

namespace torchtpu {
namespace {
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The shape of gates plus a bias as the composite's sum broadcasts it (or PyTorch's error).
at::DimVector with_bias(at::IntArrayRef gates, const std::optional<at::Tensor>& bias) {
  return defined(bias) ? at::infer_size_dimvector(gates, bias->sizes()) : at::DimVector(gates);
}

// The composites index the n chunks of gates.unsafe_chunk(n, 1), which are fewer unless
// dimension 1 is a multiple of n (n * hidden_size). Under 2 dims unsafe_chunk raises itself.
void check_gates(const char* op, const char* gates, at::IntArrayRef sizes, int64_t n) {
  TORCH_CHECK(sizes.size() < 2 || sizes[1] % n == 0, op, ": expected ", gates, " size at dimension 1 to be a "
              "multiple of ", n, " (", n, " * hidden_size), got ", sizes[1]);
}

Grads lstm_cell_backward(const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
                         const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                         const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias,
                         const at::Tensor& cx, const at::Tensor& cy) {
  if (defined(grad_hy) || defined(grad_cy)) {  // without them it returns before chunking
    auto gates = with_bias(with_bias(input_gates.sizes(), hidden_gates), input_bias);
    check_gates("_thnn_differentiable_lstm_cell_backward", "the gates'", with_bias(gates, hidden_bias), 4);
  }
  return at::native::_thnn_differentiable_lstm_cell_backward(grad_hy, grad_cy, input_gates, hidden_gates,
                                                             input_bias, hidden_bias, cx, cy);
}

Grads gru_cell_backward(const at::Tensor& grad_hy, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                        const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                        const std::optional<at::Tensor>& hidden_bias) {
  const char* op = "_thnn_differentiable_gru_cell_backward";
  auto in_g = with_bias(input_gates.sizes(), input_bias);
  auto h_g = with_bias(hidden_gates.sizes(), hidden_bias);
  check_gates(op, "the input gates'", in_g, 3);
  check_gates(op, "the hidden gates'", h_g, 3);
  // It adds their chunks pairwise (reset, update and new gates).
  TORCH_CHECK(in_g.size() < 2 || h_g.size() < 2 || in_g[1] == h_g[1], op, ": expected the input and hidden "
              "gates to have the same size at dimension 1 (3 * hidden_size), got ", in_g[1], " and ", h_g[1]);
  return at::native::_thnn_differentiable_gru_cell_backward(grad_hy, input_gates, hidden_gates, hx, input_bias,
                                                            hidden_bias);
}
}  // namespace

// For AutogradPrivateUse1, where autograd records the composite's ops as before (double
// backward), and PrivateUse1, which inference mode reaches without autograd.
void impl_composite_checks(torch::Library& m) {
  m.impl("_thnn_differentiable_lstm_cell_backward", lstm_cell_backward);
  m.impl("_thnn_differentiable_gru_cell_backward", gru_cell_backward);
}

}  // namespace torchtpu
