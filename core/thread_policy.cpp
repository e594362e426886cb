// apply_thread_policy and cpu_load_note (thread_policy.h). The re-execution is the only way a
// program can choose libgomp's wait policy for itself: libgomp parses OMP_WAIT_POLICY in its own
// constructor, which runs before main() and before the constructors of the executable.
#include "core/thread_policy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace minidl {

void apply_thread_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);   // returns only on failure: go on under libgomp's default
}

std::string cpu_load_note() {
  double load[1] = {0.0};
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (::getloadavg(load, 1) != 1 || load[0] <= static_cast<double>(cores)) return "";
  const char* env = std::getenv("OMP_WAIT_POLICY");
  const std::string policy = env == nullptr ? "" : env;
  const bool passive = policy == "passive" || policy == "PASSIVE";
  const std::string how = env == nullptr ? "as libgomp's default (spin, then sleep)" : "as OMP_WAIT_POLICY=" + policy;
  char line[320];
  std::snprintf(line, sizeof(line), "the machine is busy (load average %.1f on %u cores): OpenMP threads wait %s%s",
                load[0], cores, passive ? "passively (OMP_WAIT_POLICY=passive)" : how.c_str(),
                passive ? "" : "; spinning threads slow a busy machine down, unset OMP_WAIT_POLICY or set it to passive");
  return line;
}

}  // namespace minidl
