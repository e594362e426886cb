// Reading rank and world size from each launcher's variables, and refusing inconsistent ones:
// a job started with a mismatch must stop at once, naming both sides, not hang in a collective.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "distributed/launch.h"
#include "tests/support/error_of.h"

namespace minidl::distributed {
namespace {
using minidl::testing::error_of;

LaunchInfo from(const std::map<std::string, std::string>& env) {
  return launch_info_from_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistLaunch, NoVariablesIsAWorldOfOne) {
  const LaunchInfo i = from({});
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world_size, 1);
}

TEST(DistLaunch, ReadsMpirunPmiSlurmAndMinidlVariables) {
  LaunchInfo i = from({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_NE(i.source.find("mpirun"), std::string::npos);
  i = from({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(i.local_rank, 1);  // no local rank variable: the rank
  i = from({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  i = from({{"MINIDL_RANK", "2"}, {"MINIDL_WORLD_SIZE", "3"}, {"MINIDL_LOCAL_RANK", "0"}});
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.world_size, 3);
  EXPECT_EQ(i.local_rank, 0);
  // Open MPI's variables win over Slurm's inside an allocation.
  i = from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(i.world_size, 2);
}

TEST(DistLaunch, RefusesInconsistentOrInvalidVariables) {
  EXPECT_NE(error_of([] { from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"MINIDL_RANK", "0"}, {"MINIDL_WORLD_SIZE", "4"}}); })
                .find("disagree"),
            std::string::npos);
  EXPECT_NE(error_of([] { from({{"MINIDL_RANK", "2"}, {"MINIDL_WORLD_SIZE", "2"}}); }).find("outside the world"),
            std::string::npos);
  EXPECT_NE(error_of([] { from({{"MINIDL_RANK", "x"}, {"MINIDL_WORLD_SIZE", "2"}}); }).find("MINIDL_RANK='x'"),
            std::string::npos);
  EXPECT_NE(error_of([] { from({{"MINIDL_RANK", "0"}}); }).find("MINIDL_WORLD_SIZE is missing"), std::string::npos);
  // Agreeing values are fine.
  EXPECT_EQ(from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MINIDL_RANK", "1"},
                  {"MINIDL_WORLD_SIZE", "2"}})
                .rank,
            1);
}

}  // namespace
}  // namespace minidl::distributed
