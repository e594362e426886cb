// The job-wide failure rule: an exception on one rank ends every rank, at once, with one message
// naming the rank and the cause, instead of leaving the others blocked in their next collective.
#pragma once
#include <functional>

#include "distributed/process_group.h"

namespace minidl::distributed {

// Runs `body` and returns its result. An exception escaping it (or std::terminate, e.g. from a
// worker thread) prints "minidl: rank R of W failed: <what>" on stderr and aborts the job through
// the group (MPI_Abort: mpirun then stops every rank and exits non-zero); in a world of one the
// process exits with status 1. Signals (a killed rank) are mpirun's to handle: it ends the job too.
int run_or_abort(const std::function<int()>& body, ProcessGroup& group = world());

}  // namespace minidl::distributed
