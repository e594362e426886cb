// The experiment programs under mpirun -np N (or MINIDL_RANK / MINIDL_WORLD_SIZE): one helper that
// starts the process group, runs a program's body and turns an error on any rank into the end of
// the whole job (one line naming the rank and the cause, a non-zero status), so that no rank is
// left waiting in a collective; in a world of one it is the programs' usual error handling.
#pragma once
#include <functional>
#include <string>

namespace minidl::harness {

struct Ranks {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;                       // among the ranks on this machine: picks the GPU
  bool lead() const { return rank == 0; }   // the rank that prints and writes files
};

// The device a rank trains on: with several ranks a bare "cuda" becomes "cuda:<local rank>" (one
// GPU per rank on each machine); anything else ("cpu", "cuda:1") is kept as given.
std::string rank_device(const std::string& device, const Ranks& ranks);

// Runs body(ranks). World 1: a UsageError prints "<program>: error: <message>" and returns 2, any
// other exception returns 1 (source locations removed unless `verbose` is true when it is thrown).
// World > 1: the same errors end every rank through distributed::run_or_abort, printing
// "minidl: rank R of W failed: <program>: error: <message>" once; mpirun exits non-zero (2 for a
// usage error, 1 otherwise). A std::terminate on any thread ends the job the same way.
int run_program(const std::string& program, const bool& verbose, const std::function<int(const Ranks&)>& body);

}  // namespace minidl::harness
