// A program whose last rank fails after the first collective while the others wait in the next
// one: run by tests/distributed/run_fail_probe.cmake under mpirun, which checks that the whole job ends
// in bounded time with one message naming the rank and the cause, and a non-zero status.
#include <cstdio>

#include "core/error.h"
#include "distributed/run.h"

int main() {
  using namespace minidl;
  return distributed::run_or_abort([] {
    distributed::ProcessGroup& g = distributed::world();
    g.barrier();
    if (g.rank() == g.world_size() - 1) MINIDL_FAIL("cannot open the data folder /nonexistent/catsdogs");
    g.barrier();  // the other ranks block here until the failure ends the job
    std::printf("rank %d: unreachable with a failing rank\n", g.rank());
    return 0;
  });
}
