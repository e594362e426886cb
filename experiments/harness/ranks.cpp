// run_program (see ranks.h): the experiment programs' error rule for one process and for N ranks.
#include "experiments/harness/ranks.h"

#include <cstdio>
#include <exception>

#include "distributed/run.h"
#include "train/config.h"

namespace minidl::harness {

using namespace ::minidl::train;

std::string rank_device(const std::string& device, const Ranks& ranks) {
  return ranks.world_size > 1 && device == "cuda" ? "cuda:" + std::to_string(ranks.local_rank) : device;
}

int run_program(const std::string& program, const bool& verbose, const std::function<int(const Ranks&)>& body) {
  distributed::ProcessGroup* group = nullptr;
  try {
    group = &distributed::world();   // reads the launcher's variables; starts MPI only for a world above 1
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), user_message(e, verbose).c_str());
    return 2;
  }
  const Ranks ranks{group->rank(), group->world_size(), group->local_rank()};
  if (ranks.world_size == 1) {
    try {
      return body(ranks);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "%s: error: %s\n", program.c_str(), user_message(e, verbose).c_str());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", program.c_str(), user_message(e, verbose).c_str());
      return 1;
    }
  }
  return distributed::run_or_abort(
      [&] {
        std::fflush(stdout);
        try {
          const int rc = body(ranks);
          std::fflush(stdout);
          return rc;
        } catch (const UsageError& e) {
          std::fflush(stdout);
          group->abort(program + ": error: " + user_message(e, verbose), 2);
        } catch (const std::exception& e) {
          std::fflush(stdout);
          group->abort(program + ": error: " + user_message(e, verbose), 1);
        }
      },
      *group);
}

}  // namespace minidl::harness
