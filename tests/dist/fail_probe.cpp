// A program whose last rank fails after the first collective while the others wait in the next
// one: run by tests/dist/run_fail_probe.cmake under mpirun, which checks that the whole job ends
// in bounded time with one message naming the rank and the cause, and a non-zero status.
#include <cstdio>

#include "core/error.h"
#include "dist/run.h"

int main() {
  using namespace minidl;
  return dist::run_or_abort([] {
    dist::ProcessGroup& g = dist::world();
    g.barrier();
    if (g.rank() == g.world_size() - 1) MINIDL_FAIL("cannot open the data folder /nonexistent/catsdogs");
    g.barrier();  // the other ranks block here until the failure ends the job
    std::printf("rank %d: unreachable with a failing rank\n", g.rank());
    return 0;
  });
}
