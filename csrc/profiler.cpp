// torch.profiler's device lane for tpu: a kineto child profiler. Under
// `profile(activities=[CPU, PrivateUse1])` each program the engine ran becomes a kernel
// activity linked to the aten call that launched it, so key_averages() gives each op its device
// time and export_chrome_trace() draws a tpu lane. The engine keeps the runs
// (crates/engine/src/trace.rs); this file turns them into kineto's activities.
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include "shim.h"

namespace torchtpu {
namespace {

// A trace's lane: the device's index is its process id in the trace, this its thread.
constexpr int64_t kLane = 0;

// The profiler's correlation ids of the aten calls open on this thread, innermost last.
thread_local std::vector<uint64_t> open_calls;

class TpuProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override { tt_trace_record(true); }
  void stop() override { tt_trace_record(false); }
  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    struct Sink {
      TpuProfilerSession* session;
      libkineto::ActivityLogger* logger;
      libkineto::getLinkedActivityCallback* linked;
    } sink{this, &logger, &linked};
    tt_trace_take(
        [](void* ctx, const char* name, int64_t name_len, int32_t device, int32_t host_thread, uint64_t correlation,
           int64_t start_ns, int64_t end_ns) {
          auto* s = static_cast<Sink*>(ctx);
          bool compile = host_thread >= 0;
          auto type = compile ? libkineto::ActivityType::PRIVATEUSE1_RUNTIME : libkineto::ActivityType::CONCURRENT_KERNEL;
          auto& a = s->session->activities_.emplace_back(s->session->span_, type, std::string(name, (size_t)name_len));
          a.startTime = start_ns;
          a.endTime = end_ns;
          a.id = (int32_t)correlation;
          if (compile) {
            // A host event on the compiling thread's lane.
            a.device = libkineto::processId();
            a.resource = host_thread;
          } else {
            a.device = device;
            a.resource = kLane;
            // The link makes it the device time of the aten call that launched it.
            a.linked = correlation ? (*s->linked)((int32_t)correlation) : nullptr;
            s->session->devices_.insert(device);
          }
          s->logger->handleGenericActivity(a);
        },
        &sink);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 1000, "tpu", "tpu:0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> lanes;
    devices_.insert(0);
    for (int32_t device : devices_) {
      lanes.push_back(libkineto::ResourceInfo{kLane, kLane, device, "tpu:" + std::to_string(device) + " programs"});
    }
    return lanes;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override {
    open_calls.push_back(id);
    tt_trace_correlation(id);
  }
  void popCorrelationId() override {
    if (!open_calls.empty()) open_calls.pop_back();
    tt_trace_correlation(open_calls.empty() ? 0 : open_calls.back());
  }

 private:
  libkineto::TraceSpan span_{0, 0, "tpu"};
  // The logger keeps pointers to what it is given only while the trace is processed; the
  // session outlives that.
  std::deque<libkineto::GenericTraceActivity> activities_;
  std::set<int32_t> devices_;
};

class TpuProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                  const libkineto::Config&) override {
    // PrivateUse1's device activity; a CPU-only profile starts no session.
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<TpuProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                  const std::set<libkineto::ActivityType>& types,
                                                                  const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"torchtpu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};
}  // namespace

void register_profiler() {
  libkineto::api().registerProfilerFactory([] { return std::make_unique<TpuProfiler>(); });
}

}  // namespace torchtpu
