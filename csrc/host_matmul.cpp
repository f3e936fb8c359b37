// Matrix products of programs on XLA's CPU plugin through PyTorch's own CPU kernel (MKL or
// OpenBLAS): XLA calls the custom call's handler (crates/torchtpu/src/host_matmul.rs), which
// describes the operands and calls this. Views and the choice of product are the handler's.
#include <ATen/Parallel.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include <exception>
#include <string>

// c = a @ b (mm for rank 2, bmm for rank 3); each `*_layout` holds its rank sizes, then its
// rank strides. Null on success, else the error's message (valid until this thread's next call).
extern "C" const char* tt_host_matmul(int64_t rank, const float* a, const int64_t* a_layout, const float* b,
                                      const int64_t* b_layout, float* c, const int64_t* c_layout) {
  thread_local std::string error;
  auto view = [rank](const float* data, const int64_t* layout) {
    return at::from_blob(const_cast<float*>(data), c10::IntArrayRef(layout, rank),
                         c10::IntArrayRef(layout + rank, rank), at::TensorOptions().dtype(at::kFloat));
  };
  try {
    at::init_num_threads();  // XLA's worker threads are not torch's: give them torch's count
    auto out = view(c, c_layout);
    rank == 2 ? at::cpu::mm_out(out, view(a, a_layout), view(b, b_layout))
              : at::cpu::bmm_out(out, view(a, a_layout), view(b, b_layout));
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}
