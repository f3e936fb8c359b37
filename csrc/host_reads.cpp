// PyTorch composites that read a tensor argument's elements on the host (through an accessor or
// data_ptr), which for a tpu tensor is not host memory: each reads a host copy instead, then
// does what the composite does, with its errors.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "shim.h"

namespace torchtpu {
namespace {
// The shape is a 1-d int64 tensor; PyTorch reads it element by element.
at::Tensor reshape_from_tensor(const at::Tensor& self, const at::Tensor& shape_tensor) {
  TORCH_CHECK(shape_tensor.dim() == 1);
  auto host = shape_tensor.is_cpu() ? shape_tensor : shape_tensor.cpu();
  auto sizes = host.accessor<int64_t, 1>();
  std::vector<int64_t> dims(sizes.size(0));
  for (int64_t i = 0; i < sizes.size(0); i++) dims[i] = sizes[i];
  return self.reshape(dims);
}
}  // namespace

// For AutogradPrivateUse1 (autograd records the reshape) and PrivateUse1 (inference mode).
void impl_host_reads(torch::Library& m) { m.impl("_reshape_from_tensor", reshape_from_tensor); }
}  // namespace torchtpu
