// A user of the installed package's data-parallel library (minidl::dist): built by the install
// check to prove the target is exported with its MPI/NCCL link dependencies. As a plain process it
// is a world of one, where an allreduce leaves the tensor as it is.
#include <cstdio>

#include "core/tensor.h"
#include "dist/process_group.h"

int main() {
  minidl::dist::ProcessGroup& g = minidl::dist::world();
  minidl::Tensor t = minidl::full({3}, 2.0);
  g.allreduce(t, minidl::dist::ReduceOp::Mean);
  std::printf("%s: %g\n", g.describe().c_str(), t.to_vector()[0]);
  return t.to_vector()[0] == 2.0 ? 0 : 1;
}
