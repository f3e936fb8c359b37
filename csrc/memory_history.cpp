// Stacks for the memory history (crates/torchtpu/src/memory_history.rs keeps the history):
// PyTorch's own captured tracebacks, gathered at an allocation and symbolized for a snapshot,
// as CUDA's allocator does.
#include <torch/csrc/profiler/combined_traceback.h>

#include <memory>
#include <vector>

using Traceback = std::shared_ptr<torch::CapturedTraceback>;

extern "C" void* tt_traceback_capture(int32_t cpp) {
  return new Traceback(torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, cpp != 0));
}

extern "C" void tt_traceback_release(void* traceback) { delete static_cast<Traceback*>(traceback); }

// Calls `frame` once per distinct frame, then `stack` once per traceback with the indices of
// its frames (innermost first).
extern "C" void tt_traceback_symbolize(void* const* tracebacks, size_t n,
                                       void (*frame)(void* ctx, const char* file, const char* name, uint64_t line),
                                       void (*stack)(void* ctx, const uint64_t* frames, size_t n), void* ctx) {
  std::vector<torch::CapturedTraceback*> all;
  for (size_t i = 0; i < n; i++) all.push_back(static_cast<Traceback*>(tracebacks[i])->get());
  torch::SymbolizedTracebacks s = torch::symbolize(all);
  for (const auto& f : s.all_frames) frame(ctx, f.filename.c_str(), f.funcname.c_str(), f.lineno);
  for (const auto& t : s.tracebacks) stack(ctx, t.data(), t.size());
}
