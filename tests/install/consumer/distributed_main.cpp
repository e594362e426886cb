// A user of the installed package's data-parallel library (minidl::distributed): built by the install
// check to prove the target is exported with its MPI/NCCL link dependencies. As a plain process it
// is a world of one, where an allreduce leaves the tensor as it is.
#include <cstdio>

#include <minidl/core/tensor.h>
#include <minidl/distributed/process_group.h>

int main() {
  minidl::distributed::ProcessGroup& g = minidl::distributed::world();
  minidl::Tensor t = minidl::full({3}, 2.0);
  g.allreduce(t, minidl::distributed::ReduceOp::Mean);
  std::printf("%s: %g\n", g.describe().c_str(), t.to_vector()[0]);
  return t.to_vector()[0] == 2.0 ? 0 : 1;
}
