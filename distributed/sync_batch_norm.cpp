// The differentiable sum over ranks that synchronised batch norm is built from, and the switch
// that turns it on for a whole model.
#include "distributed/sync_batch_norm.h"

#include "core/autograd.h"
#include "nn/layers.h"

namespace minidl::distributed {

Tensor allreduce_sum(ProcessGroup& group, const Tensor& t) {
  Tensor out = t.detach().contiguous().clone();
  group.allreduce(out, ReduceOp::Sum);
  ProcessGroup* g = &group;
  record("dist_allreduce_sum", {t}, {out}, [g](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
    Tensor grad = grads[0].contiguous().clone();
    g->allreduce(grad, ReduceOp::Sum);
    return {grad};
  });
  return out;
}

int64_t convert_sync_batch_norm(nn::Module& module, ProcessGroup& group) {
  int64_t n = 0;
  ProcessGroup* g = &group;
  for (auto& [name, m] : module.named_modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) {
      bn->set_stats_reducer([g](const Tensor& t) { return allreduce_sum(*g, t); });
      ++n;
    }
  }
  return n;
}

}  // namespace minidl::distributed
