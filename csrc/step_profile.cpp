// The step profile of the composite entry points (registry.h): where the time of
// encoder_forward / encoder_layer (and their int8 forms) goes, step by step, inside
// the one native call that no Python profiler sees into. Off by default; while off a
// step costs one relaxed atomic load.
#include <atomic>
#include <mutex>

#include "registry.h"

namespace bertfast {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mutex;
std::vector<StepTime> g_steps;  // first-seen order

}  // namespace

bool step_profile_on() { return g_on.load(std::memory_order_relaxed); }

void step_profile_start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_steps.clear();
  g_on.store(true, std::memory_order_relaxed);
}

std::vector<StepTime> step_profile_stop() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_on.store(false, std::memory_order_relaxed);
  std::vector<StepTime> out;
  out.swap(g_steps);
  return out;
}

void step_profile_record(const std::string& name, double seconds) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_on.load(std::memory_order_relaxed)) return;
  for (StepTime& s : g_steps)
    if (s.name == name) {
      s.seconds += seconds;
      ++s.calls;
      return;
    }
  g_steps.push_back({name, seconds, 1});
}

}  // namespace bertfast
