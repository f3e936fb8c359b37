// What the parts of the C++ shim (csrc/*.cpp) share; everything else is internal to its file.
// The shim knows no op semantics: those live in the Rust engine, behind the C ABI (abi.h).
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <utility>
#include <vector>

#include "abi.h"

namespace c10 { class OperatorHandle; }
namespace torch { class Library; }

namespace torchtpu {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// What tt_register_device (register.cpp) registers, part by part.
void register_guard();                                    // guard.cpp
void register_allocator();                                // allocator.cpp
void register_profiler();                                 // profiler.cpp
void register_hooks();                                    // hooks.cpp
bool is_pinned_host(const at::Tensor& t);                  // hooks.cpp: memory from pin_memory()
void install_fault_handler();                             // faults.cpp
void register_sdp_choice();                               // metadata_ops.cpp
void impl_metadata_ops(torch::Library& m);                // metadata_ops.cpp
void impl_copy_fallthrough(torch::Library& m);            // metadata_ops.cpp
void impl_fallback(torch::Library& m);                    // fallback.cpp
void impl_sparse_refusal(torch::Library& m);              // layouts.cpp
void impl_sparse_csr_refusal(torch::Library& m);          // layouts.cpp
void impl_quantized_refusal(torch::Library& m);           // layouts.cpp
void impl_nested_refusal(torch::Library& m);              // layouts.cpp
void impl_compressed_constructor_refusal(torch::Library& m);  // layouts.cpp
void impl_routed_ops(torch::Library& m);                  // fallback.cpp
void impl_autocast_fallthrough(torch::Library& m);        // autocast.cpp
void impl_autocast(torch::Library& m);                    // autocast.cpp
void impl_composite_checks(torch::Library& m);            // composite_checks.cpp
void impl_host_reads(torch::Library& m);                  // host_reads.cpp

// guard.cpp: the current device of this thread (constinit: read without a TLS init wrapper).
extern thread_local constinit c10::DeviceIndex current_device;

// allocator.cpp: storages whose context is a Rust storage cell.
extern c10::Allocator* const allocator;
void* cell_of(const c10::Storage& storage);
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);
at::Tensor wrap_cell(void* cell, at::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceIndex device);


// generator.cpp: a device's default generator; each random op takes its (seed, offset).
at::Generator make_generator(c10::DeviceIndex index);
const at::Generator& default_generator(c10::DeviceIndex index);
std::pair<uint64_t, uint64_t> next_random(const at::Generator& generator);

// fallback.cpp: an engine status as PyTorch's exception; encoding a call; the boxed fallback.
const TtResult* check(const TtResult* r);
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
TtArg encode_tensor(CallFrame& f, const at::Tensor& t);
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// metadata_ops.cpp
void resize_for_out(at::Tensor& t, c10::IntArrayRef sizes);
at::Scalar local_scalar_dense(const at::Tensor& self);

}  // namespace torchtpu
