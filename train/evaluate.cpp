// Evaluation over a batch source, reduced over the ranks (see evaluate.h).
#include "train/evaluate.h"

#include "core/autograd.h"

namespace minidl::train {

void sum_over_ranks(distributed::ProcessGroup* group, std::initializer_list<double*> values) {
  if (group == nullptr) return;
  Tensor t = empty({static_cast<int64_t>(values.size())}, {DType::f64, Device::cpu(), false});
  double* d = t.data<double>();
  for (double* v : values) *d++ = *v;
  group->allreduce(t, distributed::ReduceOp::Sum);
  d = t.data<double>();
  for (double* v : values) *v = *d++;
}

EvalResult evaluate(Model& m, BatchSource* src, distributed::ProcessGroup* group, GraphedStep* graphed) {
  EvalResult r;
  double loss = 0.0, correct = 0.0, n = 0.0;
  if (src != nullptr && src->size() > 0) {
    NoGradGuard no_grad;
    struct TrainingModeBack {   // also when a batch runs out of memory
      Model& m;
      ~TrainingModeBack() { m.module->train(); }
    } back{m};
    m.module->eval();
    src->start_epoch(0);
    while (auto b = src->next()) {
      const int64_t bn = b->labels.size(0);
      std::optional<GraphedStep::EvalOutput> o;
      if (graphed != nullptr && graphed->eval_replayable(b->images, b->labels)) o = graphed->eval_step(b->images, b->labels);
      if (o) {
        loss += o->loss.item() * static_cast<double>(bn);
        correct += static_cast<double>(static_cast<int64_t>(o->correct.item()));
      } else {   // eager (its capture may just have fallen back)
        double batch_loss = 0.0, batch_correct = 0.0;
        const auto work = [&] {   // beside graphs it may run twice (GraphedStep::eval_eagerly)
          const Tensor logits = m.forward(b->images);
          batch_loss = m.loss(logits, b->labels).item();
          batch_correct = static_cast<double>(m.correct(logits, b->labels));
        };
        if (graphed != nullptr) graphed->eval_eagerly(b->images, work);
        else work();
        loss += batch_loss * static_cast<double>(bn);
        correct += batch_correct;
      }
      n += static_cast<double>(bn);
    }
  }
  sum_over_ranks(group, {&loss, &correct, &n});
  if (n > 0) r = {loss / n, correct / n};
  return r;
}

}  // namespace minidl::train
