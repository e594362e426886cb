// Where a process stands in a multi-process job, read from the environment its launcher set:
// mpirun (Open MPI's OMPI_COMM_WORLD_*), PMI launchers (MPICH's hydra, Slurm's PMI2), Slurm's srun,
// or a plain MINIDL_RANK / MINIDL_WORLD_SIZE for schedulers that start the processes themselves.
#pragma once
#include <functional>
#include <string>

namespace minidl::distributed {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // rank among the processes on this machine: picks the GPU
  std::string source = "default (no launcher: a world of 1)";  // which variables said so
};

// Reads the variables through `getenv` (std::getenv by default; tests pass their own). When both
// MINIDL_* and a launcher's variables are set they must agree; a rank outside [0, world) or a
// world below 1 throws naming the variable and the value.
LaunchInfo launch_info_from_env(const std::function<const char*(const char*)>& getenv = {});

}  // namespace minidl::distributed
