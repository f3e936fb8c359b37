// torch.autocast("tpu"): CUDA's policy, from PyTorch's own op lists (autocast_mode.h): matmuls
// and convolutions run in the autocast dtype, reductions and losses in float32, mixed inputs of
// a few ops promote; every other op passes through.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "shim.h"
#include "torch_compat.h"

namespace torchtpu {

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

}  // namespace torchtpu
