// How minidl's programs make OpenMP's threads wait: libgomp's default lets an idle thread spin
// for milliseconds before it sleeps, and on a machine whose cores other processes also want
// (a shared or oversubscribed one) the spinning threads take the time slices the working ones
// need; a ResNet-18 run then took 8x as long (docs/experiments.md, "CPU threads"). The programs
// therefore wait passively unless the user chose a policy.
#pragma once
#include <string>

namespace minidl {

// Call first in main(), before anything else runs. When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT
// is set, sets OMP_WAIT_POLICY=passive and re-executes the program with the same arguments:
// libgomp reads its environment once, when the library is loaded, before main() or any of the
// program's constructors, so setting it later has no effect. When the re-execution fails the
// program goes on under libgomp's default (the variable still reaches its child processes).
void apply_thread_policy(char** argv);

// One line for the start of a run: "" on a machine whose load average (over the last minute) is
// within its cores, else what was found and how the threads wait, e.g. "the machine is busy (load
// average 5.2 on 2 cores): OpenMP threads wait passively (OMP_WAIT_POLICY=passive)".
std::string cpu_load_note();

}  // namespace minidl
