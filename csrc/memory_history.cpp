// Memory history (torch.tpu.memory._record_memory_history and _snapshot): what CUDA's caching
// allocator records, for tpu storages. Every storage is one block in a segment of its own (the
// allocator caches nothing), so its allocation is a segment_alloc and an alloc, its release a
// free_requested, a free_completed and a segment_free. Stacks are PyTorch's own captured
// tracebacks, symbolized only when a snapshot asks, as CUDA's are.
#include <torch/csrc/profiler/combined_traceback.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "shim.h"

namespace torchtpu {
namespace {

using Traceback = std::shared_ptr<torch::CapturedTraceback>;

struct HistoryEvent {
  const char* action;
  uintptr_t address;
  int64_t size;
  int device;
  int64_t time_us;
  Traceback frames;
};

struct LiveBlock {
  uintptr_t address;
  int64_t size;
  int device;
  Traceback frames;
};

struct History {
  std::mutex mutex;
  bool live = false;          // blocks are tracked ("state" or "all")
  bool trace = false;         // events are kept ("all")
  bool alloc_stacks = false;  // allocations carry a traceback
  bool free_stacks = false;   // releases carry one too (context "all")
  bool cpp_frames = false;    // stacks "all": C++ frames as well as Python's
  size_t max_entries = SIZE_MAX;
  std::deque<HistoryEvent> events;
  std::unordered_map<void*, LiveBlock> blocks;
};

History history;
std::atomic<bool> history_on{false};

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

Traceback capture(bool wanted, bool cpp) {
  return wanted ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, cpp) : nullptr;
}

void keep(History& h, const char* action, const LiveBlock& b, const Traceback& frames) {
  if (!h.trace) return;
  h.events.push_back({action, b.address, b.size, b.device, now_us(), frames});
  while (h.events.size() > h.max_entries) h.events.pop_front();
}

// Stacks are captured outside the lock: gathering Python frames takes the GIL.
Traceback capture_for(History& h, bool History::*wanted) {
  bool stacks, cpp;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    stacks = h.*wanted;
    cpp = h.cpp_frames;
  }
  return capture(stacks, cpp);
}

void record_alloc(History& h, void* cell, uintptr_t address, int64_t size, int device) {
  Traceback frames = capture_for(h, &History::alloc_stacks);
  std::lock_guard<std::mutex> lock(h.mutex);
  if (!h.live) return;
  LiveBlock b{address, size, device, frames};
  keep(h, "segment_alloc", b, frames);
  keep(h, "alloc", b, frames);
  h.blocks[cell] = std::move(b);
}

void record_free(History& h, void* cell) {
  Traceback frames = capture_for(h, &History::free_stacks);
  std::lock_guard<std::mutex> lock(h.mutex);
  auto it = h.blocks.find(cell);
  if (it == h.blocks.end()) return;
  for (const char* action : {"free_requested", "free_completed", "segment_free"}) keep(h, action, it->second, frames);
  h.blocks.erase(it);
}

// JSON text: the snapshot crosses to Python as one string (python/torchtpu/memory.py).
void json_string(std::ostream& out, const std::string& s) {
  out << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out << buf;
    } else {
      out << c;
    }
  }
  out << '"';
}

}  // namespace

void memory_history_alloc(void* cell, const void* address, size_t nbytes, c10::DeviceIndex device) {
  if (history_on.load(std::memory_order_relaxed)) record_alloc(history, cell, (uintptr_t)address, (int64_t)nbytes, device);
}

void memory_history_free(void* cell) {
  if (history_on.load(std::memory_order_relaxed)) record_free(history, cell);
}

}  // namespace torchtpu

using torchtpu::history;

// enabled: 0 stops and forgets everything, 1 tracks live blocks ("state"), 2 also keeps events
// ("all"). context: 0 none, 1 "state" (stacks of live blocks), 2 "alloc", 3 "all" (releases too).
extern "C" void tt_memory_history_record(int32_t enabled, int32_t context, int32_t cpp_frames, uint64_t max_entries) {
  std::lock_guard<std::mutex> lock(history.mutex);
  history.live = enabled >= 1;
  history.trace = enabled >= 2;
  history.alloc_stacks = enabled >= 1 && context >= 1;
  history.free_stacks = enabled >= 1 && context >= 3;
  history.cpp_frames = cpp_frames != 0;
  history.max_entries = max_entries;
  if (enabled == 0) {
    history.events.clear();
    history.blocks.clear();
  }
  while (history.events.size() > history.max_entries) history.events.pop_front();
  torchtpu::history_on.store(history.live, std::memory_order_relaxed);
}

// Calls `take` once with the snapshot as JSON: {"frames": [[filename, name, line], ...],
// "blocks": [[device, address, size, stack], ...], "events": [[device, action, address, size,
// time_us, stack], ...]}, a stack being indices into frames, innermost first (-1: none taken).
extern "C" void tt_memory_history_snapshot(void (*take)(void* ctx, const char* json, size_t len), void* ctx) {
  std::vector<torchtpu::LiveBlock> blocks;
  std::vector<torchtpu::HistoryEvent> events;
  {
    std::lock_guard<std::mutex> lock(history.mutex);
    for (const auto& [cell, b] : history.blocks) blocks.push_back(b);
    events.assign(history.events.begin(), history.events.end());
  }
  // Each distinct traceback is symbolized once.
  std::vector<torch::CapturedTraceback*> to_symbolize;
  std::unordered_map<torch::CapturedTraceback*, size_t> index;
  auto note = [&](const torchtpu::Traceback& t) {
    if (t && index.emplace(t.get(), to_symbolize.size()).second) to_symbolize.push_back(t.get());
  };
  for (const auto& b : blocks) note(b.frames);
  for (const auto& e : events) note(e.frames);
  torch::SymbolizedTracebacks symbolized = torch::symbolize(to_symbolize);

  std::ostringstream out;
  auto stack = [&](const torchtpu::Traceback& t) {
    if (!t) {
      out << -1;
      return;
    }
    out << '[';
    const auto& frames = symbolized.tracebacks.at(index.at(t.get()));
    for (size_t i = 0; i < frames.size(); i++) out << (i ? "," : "") << frames[i];
    out << ']';
  };
  out << "{\"frames\":[";
  for (size_t i = 0; i < symbolized.all_frames.size(); i++) {
    const auto& f = symbolized.all_frames[i];
    out << (i ? ",[" : "[");
    torchtpu::json_string(out, f.filename);
    out << ',';
    torchtpu::json_string(out, f.funcname);
    out << ',' << f.lineno << ']';
  }
  out << "],\"blocks\":[";
  for (size_t i = 0; i < blocks.size(); i++) {
    const auto& b = blocks[i];
    out << (i ? ",[" : "[") << b.device << ',' << b.address << ',' << b.size << ',';
    stack(b.frames);
    out << ']';
  }
  out << "],\"events\":[";
  for (size_t i = 0; i < events.size(); i++) {
    const auto& e = events[i];
    out << (i ? ",[" : "[") << e.device << ",\"" << e.action << "\"," << e.address << ',' << e.size << ',' << e.time_us << ',';
    stack(e.frames);
    out << ']';
  }
  out << "]}";
  std::string json = out.str();
  take(ctx, json.data(), json.size());
}
