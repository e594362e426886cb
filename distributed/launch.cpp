// The environment variables each launcher sets, checked against each other, so that a job started
// with a mismatch (MINIDL_WORLD_SIZE=4 under mpirun -np 2) stops at once with both values named.
#include "distributed/launch.h"

#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace minidl::distributed {
namespace {

std::optional<int> read_int(const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  MINIDL_CHECK(end != nullptr && *end == '\0' && x >= 0 && x < (1L << 30), "dist: environment variable ", name,
               "='", v, "' is not a non-negative integer");
  return static_cast<int>(x);
}

struct Source {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* label;
};

// Launchers in the order they are trusted (an mpirun inside a Slurm allocation sets both Open
// MPI's and Slurm's variables; Open MPI's describe this process).
constexpr Source kLaunchers[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun (OMPI_COMM_WORLD_*)"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI (PMI_RANK, PMI_SIZE)"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm (SLURM_PROCID, SLURM_NTASKS)"},
};

}  // namespace

LaunchInfo launch_info_from_env(const std::function<const char*(const char*)>& getenv_in) {
  const std::function<const char*(const char*)> getenv =
      getenv_in ? getenv_in : [](const char* n) -> const char* { return std::getenv(n); };
  LaunchInfo info;
  for (const Source& s : kLaunchers) {
    const auto rank = read_int(getenv, s.rank);
    const auto size = read_int(getenv, s.size);
    if (!rank || !size) continue;
    info.rank = *rank;
    info.world_size = *size;
    info.local_rank = read_int(getenv, s.local_rank).value_or(*rank);
    info.source = s.label;
    break;
  }
  const auto mrank = read_int(getenv, "MINIDL_RANK");
  const auto msize = read_int(getenv, "MINIDL_WORLD_SIZE");
  MINIDL_CHECK(mrank.has_value() == msize.has_value(), "dist: set both MINIDL_RANK and MINIDL_WORLD_SIZE, or neither (",
               mrank ? "MINIDL_WORLD_SIZE" : "MINIDL_RANK", " is missing)");
  if (mrank) {
    const bool launcher = info.source != LaunchInfo{}.source;
    MINIDL_CHECK(!launcher || (*mrank == info.rank && *msize == info.world_size), "dist: MINIDL_RANK=", *mrank,
                 " MINIDL_WORLD_SIZE=", *msize, " disagree with ", info.source, " (rank ", info.rank, " of ",
                 info.world_size, "); unset the MINIDL_* variables or make them match");
    if (!launcher) {
      info.rank = *mrank;
      info.world_size = *msize;
      info.local_rank = read_int(getenv, "MINIDL_LOCAL_RANK").value_or(*mrank);
      info.source = "MINIDL_RANK, MINIDL_WORLD_SIZE";
    }
  }
  MINIDL_CHECK(info.world_size >= 1, "dist: world size ", info.world_size, " from ", info.source, " must be >= 1");
  MINIDL_CHECK(info.rank < info.world_size, "dist: rank ", info.rank, " from ", info.source,
               " is outside the world of ", info.world_size);
  return info;
}

}  // namespace minidl::distributed
