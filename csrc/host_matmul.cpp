// Matrix products of programs on XLA's CPU plugin through PyTorch's own CPU kernel (MKL or
// OpenBLAS, what torch on CPU and inductor call): XLA runs them as a custom call whose handler
// (crates/torchtpu/src/host_matmul.rs) calls tt_host_gemm with the operands' host addresses.
#include <ATen/Parallel.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include <exception>
#include <string>

#include "shim.h"

// c[batch, m, n] = a[batch, m, k] @ b[batch, k, n], each row-major; a is stored [batch, k, m]
// when trans_a, b as [batch, n, k] when trans_b. Null on success, else the error's message
// (valid until this thread's next call).
extern "C" const char* tt_host_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                    const float* a, const float* b, float* c) {
  // XLA's worker threads are not torch's: give each torch's thread count once.
  thread_local bool threads_set = false;
  thread_local std::string error;
  try {
    if (!threads_set) {
      at::init_num_threads();
      threads_set = true;
    }
    // A [rows, cols] matrix (per batch) stored row-major, or as its transpose when `trans`.
    auto matrix = [&](const float* p, int64_t rows, int64_t cols, bool trans) {
      auto f32 = at::TensorOptions().dtype(at::kFloat);
      auto data = const_cast<float*>(p);
      if (batch == 1) {
        return trans ? at::from_blob(data, {rows, cols}, {1, rows}, f32) : at::from_blob(data, {rows, cols}, f32);
      }
      return trans ? at::from_blob(data, {batch, rows, cols}, {rows * cols, 1, rows}, f32)
                   : at::from_blob(data, {batch, rows, cols}, f32);
    };
    auto A = matrix(a, m, k, trans_a), B = matrix(b, k, n, trans_b), C = matrix(c, m, n, false);
    if (batch == 1) {
      at::cpu::mm_out(C, A, B);
    } else {
      at::cpu::bmm_out(C, A, B);
    }
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}
