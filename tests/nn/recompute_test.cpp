// The user-facing recomputation modes (nn/recompute.h) must be invisible to training and must pay
// for themselves: bit-identical gradients and running statistics for every mode on a ResNet-18
// with dropout (default and private generators), a lower allocator peak, an optimal plan whose
// measured peak matches its prediction, and the same result under gradient accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/recompute.h"
#include "nn/recompute_profile.h"
#include "nn/resnet.h"
#include "optim/accumulation.h"
#include "optim/sgd.h"
#include "tests/support/error_of.h"

namespace minidl::nn {
namespace {

using minidl::testing::error_of;

const std::vector<std::string> kModes = {"none", "stages", "sequential:2", "sequential:4", "optimal"};

// ResNet-18 (small input) with two dropout layers added inside the chain: one drawing from a
// private generator (after layer2: its own link "layer2.2"), one from the default generator
// (after layer3: "layer3.2"); sequential and optimal segments then hold them mid-way.
struct Net {
  std::unique_ptr<Generator> drop_gen;  // the private dropout generator (outlives the backward)
  std::shared_ptr<ResNet> model;
  std::map<std::string, Tensor> initial;  // a copy of the initial state, for reset()
  uint64_t seed = 0;
  // Back to the freshly built state (parameters, running statistics, no gradients, private
  // generator): cheaper than building ResNet-18 again (its initialisation dominates these tests).
  void reset() {
    model->load_state_dict(initial);
    model->zero_grad();
    drop_gen->manual_seed(seed + 100);
  }
};

Net make_net(uint64_t seed) {
  Net n;
  n.drop_gen = std::make_unique<Generator>(seed + 100);
  Generator init(seed);
  n.model = resnet18(10, &init, false, true);
  n.model->stage(2)->push_back(std::make_shared<Dropout>(0.3, n.drop_gen.get()));
  n.model->stage(3)->push_back(std::make_shared<Dropout>(0.2));
  n.seed = seed;
  for (const auto& [k, t] : n.model->state_dict()) n.initial[k] = t.clone();
  return n;
}

struct Batch {
  Tensor x, w;
};

Batch make_batch(int64_t batch, int64_t hw, uint64_t seed = 5) {
  Generator data(seed);
  return {randn({batch, 3, hw, hw}, {}, &data), randn({batch, 10}, {}, &data)};
}

Tensor loss_of(const Tensor& out, const Tensor& w) { return mean(out * w); }

void expect_same_grads(const Module& a, const Module& b, const std::string& what) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].second.grad().defined()) << what << " " << pa[i].first;
    ASSERT_TRUE(pb[i].second.grad().defined()) << what << " " << pb[i].first;
    EXPECT_EQ(pa[i].second.grad().to_vector(), pb[i].second.grad().to_vector()) << what << " " << pa[i].first;
  }
}

void expect_same_buffers(const Module& a, const Module& b, const std::string& what) {
  const auto ba = a.named_buffers();
  const auto bb = b.named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) {
    EXPECT_EQ(ba[i].second.to_vector(), bb[i].second.to_vector()) << what << " " << ba[i].first;
  }
}

// A limit that forces the optimal plan to recompute: `fraction` of the way from the least peak
// any plan reaches to the keep-all peak, predicted from a profile of this batch (the profile
// leaves the model untouched).
int64_t limit_at(ResNet& model, const Tensor& x, double fraction) {
  const ChainProfile p = profile_chain(model.chain(), x);
  const int64_t all =
      evaluate(p.stages, p.input_bytes, std::vector<StageMode>(p.stages.size(), StageMode::KeepAll))
          .predicted_peak_bytes;
  const int64_t least = least_peak_bytes(p.stages, p.input_bytes);
  return least + static_cast<int64_t>(fraction * static_cast<double>(all - least));
}

TEST(RecomputeModeTest, ParsesAndPrintsEveryForm) {
  for (const std::string s : {"none", "stages", "sequential:1", "sequential:8", "optimal"}) {
    EXPECT_EQ(RecomputeMode::parse(s).str(), s);
  }
  EXPECT_EQ(RecomputeMode::parse("sequential:4").kind, RecomputeMode::Kind::Sequential);
  EXPECT_EQ(RecomputeMode::parse("sequential:4").segments, 4);
  for (const std::string bad : {"", "rotor", "sequential", "sequential:", "sequential:0", "sequential:2x",
                                 "sequential:-1", "Optimal"}) {
    const std::string msg = error_of([&] { RecomputeMode::parse(bad); });
    EXPECT_NE(msg.find("recompute mode '" + bad + "'"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { RecomputeMode::parse("fast"); }).find("sequential:N"), std::string::npos);
}

TEST(RecomputeModeTest, SegmentsAndModesRoundTrip) {
  using M = StageMode;
  const std::vector<M> modes{M::KeepInput, M::KeepNothing, M::KeepAll, M::KeepInput, M::KeepInput, M::KeepNothing};
  const std::vector<int> seg{0, 0, -1, 1, 2, 2};
  EXPECT_EQ(segments_from_modes(modes), seg);
  EXPECT_EQ(modes_from_segments(seg), modes);
  EXPECT_NE(error_of([] { segments_from_modes({M::KeepAll, M::KeepNothing}); }).find("keeps nothing"),
            std::string::npos);
}

TEST(RecomputeTest, PrivateGeneratorDropoutReplays) {
  auto make = [](Generator& drop) {
    Generator init(3);
    return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
        std::make_shared<Linear>(6, 16, true, &init), std::make_shared<Dropout>(0.5, &drop), std::make_shared<ReLU>(),
        std::make_shared<Linear>(16, 4, true, &init)});
  };
  Generator drop_a(77), drop_b(77);
  auto plain = make(drop_a);
  auto ckpt = make(drop_b);
  const Tensor x = randn({5, 6});
  const uint64_t default_before = default_generator().offset();
  sum((*plain)(x)).backward();
  Tensor out = checkpoint([&](const Tensor& in) { return (*ckpt)(in); }, x);
  const uint64_t after_forward = drop_b.offset();
  sum(out).backward();
  EXPECT_EQ(drop_b.offset(), after_forward);  // put back after the rerun
  EXPECT_EQ(drop_a.offset(), drop_b.offset());
  EXPECT_EQ(default_generator().offset(), default_before);  // never touched
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_EQ(plain->parameters()[i].grad().to_vector(), ckpt->parameters()[i].grad().to_vector()) << i;
  }
}

TEST(RecomputeTest, ProfileMeasuresEveryLinkAndLeavesTheModelAlone) {
  Net n = make_net(21);
  const Batch b = make_batch(4, 16);
  manual_seed(9);
  const auto buffers = n.model->ordered_state_dict();
  std::vector<std::vector<double>> before;
  for (const auto& [k, t] : buffers) before.push_back(t.to_vector());
  const uint64_t off_default = default_generator().offset(), off_private = n.drop_gen->offset();
  const int64_t alloc_before = memory_stats().allocated_bytes;
  // No gradient hook hears of the profile's backwards (DataParallel starts averaging there).
  int hook_calls = 0;
  std::vector<std::pair<Tensor, uint64_t>> hooks;
  for (Tensor prm : n.model->parameters())
    hooks.emplace_back(prm, prm.register_post_accumulate_grad_hook([&](const Tensor&) { ++hook_calls; }));

  const ChainProfile p = profile_chain(n.model->chain(), b.x);
  EXPECT_EQ(hook_calls, 0);
  for (auto& [prm, id] : hooks) prm.remove_post_accumulate_grad_hook(id);
  ASSERT_EQ(p.stages.size(), n.model->chain().size());
  EXPECT_EQ(p.names.front(), "stem");
  EXPECT_EQ(p.names.back(), "head");
  EXPECT_EQ(p.input_bytes, static_cast<int64_t>(b.x.nbytes()));
  // The stem's output: batch 4, 64 channels, 16x16, f32.
  EXPECT_EQ(p.stages[0].output_bytes, 4 * 64 * 16 * 16 * 4);
  for (size_t i = 0; i < p.stages.size(); ++i) {
    EXPECT_GT(p.stages[i].forward_time, 0.0) << p.names[i];
    EXPECT_GT(p.stages[i].backward_time, 0.0) << p.names[i];
    EXPECT_GT(p.stages[i].output_bytes, 0) << p.names[i];
  }
  // A basic block keeps several activation-sized tensors (conv and bn outputs, its input).
  EXPECT_GE(p.stages[1].saved_bytes, 4 * p.stages[1].output_bytes);
  // The times are modelled: 1 s per 10 GB written and per 10^12 flops. The stem is one 3x3
  // convolution from 3 to 64 channels at 16x16 (stride 1), and its batch norm and ReLU.
  const double stem_flops = 2.0 * 4 * 64 * 16 * 16 * (3 * 3 * 3);
  const ChainStage& stem = p.stages[0];
  EXPECT_DOUBLE_EQ(stem.forward_time, static_cast<double>(stem.output_bytes + stem.saved_bytes) * 1e-10 +
                                          stem_flops * 1e-12);
  EXPECT_DOUBLE_EQ(stem.backward_time, 2 * stem.forward_time);
  // A link of many channels on small images costs more per byte than one of few on large ones.
  const auto per_byte = [&](size_t i) {
    return p.stages[i].forward_time / static_cast<double>(p.stages[i].output_bytes + p.stages[i].saved_bytes);
  };
  const auto at = [&](const std::string& name) {
    return static_cast<size_t>(std::find(p.names.begin(), p.names.end(), name) - p.names.begin());
  };
  EXPECT_GT(per_byte(at("layer4.0")), 2 * per_byte(at("layer1.0")));
  EXPECT_EQ(memory_stats().allocated_bytes, alloc_before);
  EXPECT_EQ(default_generator().offset(), off_default);
  EXPECT_EQ(n.drop_gen->offset(), off_private);
  for (const Tensor& prm : n.model->parameters()) EXPECT_FALSE(prm.grad().defined());
  size_t i = 0;
  for (const auto& [k, t] : n.model->ordered_state_dict()) EXPECT_EQ(t.to_vector(), before[i++]) << k;
}

// One training step's forward+backward with the given mode; returns the recomputer's description.
std::string step(Net& n, const Batch& b, const std::string& mode, int64_t limit = 0) {
  manual_seed(1234);
  Recomputer rc(*n.model, RecomputeMode::parse(mode), limit);
  Tensor out = rc.forward(b.x);
  loss_of(out, b.w).backward();
  if (mode == "optimal") {
    EXPECT_NE(rc.plan(), nullptr);
  } else {
    EXPECT_EQ(rc.plan(), nullptr);
  }
  return rc.describe();
}

TEST(RecomputeTest, EveryModeGivesBitIdenticalGradientsAndRunningStats) {
  const Batch b = make_batch(2, 16);
  Net ref = make_net(42);
  step(ref, b, "none");
  const uint64_t off_default = default_generator().offset(), off_private = ref.drop_gen->offset();
  Net n = make_net(42);
  for (const std::string& mode : kModes) {
    n.reset();
    const int64_t limit = mode == "optimal" ? limit_at(*n.model, b.x, 0.5) : 0;
    const std::string plan = step(n, b, mode, limit);
    expect_same_grads(*ref.model, *n.model, mode);
    expect_same_buffers(*ref.model, *n.model, mode);
    EXPECT_EQ(default_generator().offset(), off_default) << mode;
    EXPECT_EQ(n.drop_gen->offset(), off_private) << mode;
    if (mode == "optimal") {
      EXPECT_NE(plan.find("keep-input"), std::string::npos) << plan;  // it does recompute
      EXPECT_NE(plan.find("predicted peak"), std::string::npos) << plan;
    }
  }
}

// The step memory the planner models, measured: the peak of allocated bytes during one
// forward+backward (parameters' gradients dropped before it, as zero_grad does) above what was
// allocated before it, plus the input batch. It covers the input, activations, saved tensors,
// activation gradients, backward temporaries and the parameter gradients the backward makes.
struct StepPeak {
  int64_t activation_peak = 0;
  std::string plan;
  int64_t predicted = 0;
};

StepPeak measure_step(Net& n, const std::string& mode, int64_t batch, int64_t hw, double fraction) {
  n.reset();
  const Batch b = make_batch(batch, hw);
  Recomputer rc(*n.model, RecomputeMode::parse(mode));
  if (mode == "optimal") {
    (void)rc.forward(b.x);  // profiles (no budget: keep-all); the graph is dropped unused
    const ChainProfile& p = *rc.profile();
    const int64_t all = rc.plan()->predicted_peak_bytes;
    const int64_t least = least_peak_bytes(p.stages, p.input_bytes);
    rc.set_memory_limit(least + static_cast<int64_t>(fraction * static_cast<double>(all - least)));
  }
  n.model->zero_grad();
  const int64_t start = memory_stats().allocated_bytes;
  reset_peak_stats();
  loss_of(rc.forward(b.x), b.w).backward();
  StepPeak r;
  r.activation_peak = memory_stats().peak_allocated_bytes - start + static_cast<int64_t>(b.x.nbytes());
  r.plan = rc.describe();
  if (rc.plan()) r.predicted = rc.plan()->predicted_peak_bytes;
  return r;
}

TEST(RecomputeTest, EveryModeLowersThePeakAndOptimalMatchesItsPrediction) {
  Net n = make_net(7);
  const StepPeak none = measure_step(n, "none", 8, 32, 0);
  for (const std::string& mode : kModes) {
    if (mode == "none") continue;
    const StepPeak m = measure_step(n, mode, 8, 32, 0.5);
    std::printf("[recompute] ResNet-18 small-input + dropout, batch 8, 32x32: activation peak %s %lld bytes "
                "(none %lld)\n",
                mode.c_str(), static_cast<long long>(m.activation_peak), static_cast<long long>(none.activation_peak));
    EXPECT_LT(m.activation_peak, none.activation_peak) << mode;
    if (mode == "optimal") {
      std::printf("%s", m.plan.c_str());
      const double err = std::abs(static_cast<double>(m.activation_peak - m.predicted)) / static_cast<double>(m.predicted);
      std::printf("[recompute] optimal measured %lld predicted %lld (%.1f%%)\n",
                  static_cast<long long>(m.activation_peak), static_cast<long long>(m.predicted), 100.0 * err);
      RecordProperty("optimal_measured_bytes", std::to_string(m.activation_peak));
      RecordProperty("optimal_predicted_bytes", std::to_string(m.predicted));
      EXPECT_LE(err, 0.10) << m.plan;
    }
  }
}

TEST(RecomputeTest, OptimalNeverSlowerThanSequentialAtTheSameMemory) {
  Net n = make_net(8);
  const Batch b = make_batch(2, 16);
  const ChainProfile p = profile_chain(n.model->chain(), b.x);
  const size_t L = p.stages.size();
  for (int N = 1; N <= static_cast<int>(L); ++N) {
    // Both flavours: every segment checkpointed (our sequential:N) and PyTorch's (last one kept).
    for (const auto& modes : {modes_from_segments(sequential_segments(L, N)), sequential_modes(L, N)}) {
      const RecomputePlan seq = evaluate(p.stages, p.input_bytes, modes);
      ASSERT_TRUE(seq.feasible);
      // The planner rounds sizes up to slots of limit/65536 (a few slots per plan), so a plan
      // exactly at the limit can be lost to rounding: 0.1% more memory absorbs it.
      const int64_t memory = seq.predicted_peak_bytes + seq.predicted_peak_bytes / 1000;
      const RecomputePlan opt = solve_optimal(p.stages, p.input_bytes, memory);
      ASSERT_TRUE(opt.feasible) << "N=" << N;
      EXPECT_LE(opt.predicted_peak_bytes, memory) << "N=" << N;
      EXPECT_LE(opt.predicted_time, seq.predicted_time * (1.0 + 1e-9)) << "N=" << N;
    }
  }
}

TEST(RecomputeTest, LimitFromTheBudgetAndBelowTheLeastPeak) {
  Net n = make_net(9);
  const Batch b = make_batch(2, 8);
  {  // no budget, no limit: keep everything
    Recomputer rc(*n.model, RecomputeMode::parse("optimal"));
    EXPECT_NE(rc.describe().find("first forward"), std::string::npos);
    loss_of(rc.forward(b.x), b.w).backward();
    for (StageMode m : rc.plan()->modes) EXPECT_EQ(m, StageMode::KeepAll);
  }
  {  // a budget: the limit is 90% of what is left, plus the input
    const int64_t reserved = memory_stats().reserved_bytes;
    const int64_t budget = reserved + 64 * 1024 * 1024;
    set_memory_budget(Device::cpu(), static_cast<size_t>(budget));
    Recomputer rc(*n.model, RecomputeMode::parse("optimal"));
    Tensor out;
    try {
      out = rc.forward(b.x);
    } catch (...) {
      set_memory_budget(Device::cpu(), 0);
      throw;
    }
    set_memory_budget(Device::cpu(), 0);
    EXPECT_GT(rc.memory_limit(), static_cast<int64_t>(b.x.nbytes()));
    EXPECT_LT(rc.memory_limit(), 64 * 1024 * 1024);
    EXPECT_NE(rc.describe().find("from the memory budget"), std::string::npos);
  }
  {  // a limit below what any plan needs: the least-memory plan, said so
    Recomputer rc(*n.model, RecomputeMode::parse("optimal"), 1);
    loss_of(rc.forward(b.x), b.w).backward();
    ASSERT_NE(rc.plan(), nullptr);
    EXPECT_TRUE(rc.plan()->feasible);
    EXPECT_NE(rc.describe().find("least-memory plan"), std::string::npos) << rc.describe();
  }
}

// A plan the model says fits but the allocator refuses: the limit given keeps everything, the
// budget leaves room for a third of the way from the least-memory plan to that. The plan runs out
// of memory in its rehearsal, is solved again under lower limits until one runs, and the step
// under it trains as the plain step does (the rehearsals changed no gradient, running statistic
// or generator). Under a budget nothing fits, the least-memory plan's rehearsal fails and its
// OutOfMemoryError is the step's.
TEST(RecomputeTest, APlanWhoseRehearsalRunsOutOfMemoryIsLowered) {
  Net ref = make_net(12), n = make_net(12);
  const Batch b = make_batch(8, 32);   // activations outweigh the parameters' gradients
  manual_seed(1234);
  loss_of(ref.model->forward(b.x), b.w).backward();
  const ChainProfile p = profile_chain(n.model->chain(), b.x);
  const int64_t all = evaluate(p.stages, p.input_bytes, std::vector<StageMode>(p.stages.size(), StageMode::KeepAll))
                          .predicted_peak_bytes;
  const int64_t least = least_peak_bytes(p.stages, p.input_bytes);
  const auto step_under = [&](int64_t room) {
    empty_cache();
    const int64_t budget = memory_stats().reserved_bytes + room;
    set_memory_budget(Device::cpu(), static_cast<size_t>(budget));
    struct NoBudget {
      ~NoBudget() { set_memory_budget(Device::cpu(), 0); }
    } no_budget;
    manual_seed(1234);
    Recomputer rc(*n.model, RecomputeMode::parse("optimal"), all);
    loss_of(rc.forward(b.x), b.w).backward();
    return rc.describe();
  };
  const std::string plan = step_under(least + (all - least) / 3);
  EXPECT_NE(plan.find("lowered"), std::string::npos) << plan;
  EXPECT_NE(plan.find("keep-input"), std::string::npos) << plan;
  expect_same_grads(*n.model, *ref.model, "lowered plan");
  expect_same_buffers(*n.model, *ref.model, "lowered plan");
  n.model->zero_grad();
  EXPECT_THROW(step_under(least / 4), OutOfMemoryError);
}

TEST(RecomputeTest, ReplansWhenTheBatchShapeChangesAndSkipsWithoutGrad) {
  Net n = make_net(10);
  Recomputer rc(*n.model, RecomputeMode::parse("optimal"), 1);
  loss_of(rc.forward(make_batch(2, 8).x), make_batch(2, 8).w).backward();
  EXPECT_EQ(rc.profile()->input_shape, (Shape{2, 3, 8, 8}));
  loss_of(rc.forward(make_batch(3, 8).x), make_batch(3, 8).w).backward();
  EXPECT_EQ(rc.profile()->input_shape, (Shape{3, 3, 8, 8}));
  NoGradGuard no_grad;
  const Tensor y = rc.forward(make_batch(4, 8).x);
  EXPECT_EQ(y.shape(), (Shape{4, 10}));
  EXPECT_EQ(rc.profile()->input_shape, (Shape{3, 3, 8, 8}));  // no profile without grad
  EXPECT_EQ(rc.profiles(), 2);
}

// An epoch's partial batch and the full batch after it, epoch after epoch: the partial batch runs
// the full batch's plan without a profile of its own, and each comes back to its plan (the same
// segments and limit); a limit set in between is applied to a kept plan when its shape comes back,
// from the kept profile. A larger batch gets a profile and a plan of its own.
TEST(RecomputeTest, KeepsThePlanOfEachBatchShape) {
  Net n = make_net(10);
  Recomputer rc(*n.model, RecomputeMode::parse("optimal"), 1);
  const auto step = [&](int64_t b) { loss_of(rc.forward(make_batch(b, 8).x), make_batch(b, 8).w).backward(); };
  step(4);
  const std::vector<int> full = rc.segments();
  const std::string full_plan = rc.describe();
  step(2);
  const std::string partial_plan = rc.describe();
  EXPECT_EQ(rc.segments(), full) << "the partial batch runs the full batch's plan";
  EXPECT_NE(partial_plan.find("batch [2,3,8,8]: the plan of batch [4,3,8,8]"), std::string::npos)
      << partial_plan;
  for (int epoch = 0; epoch < 2; ++epoch) {
    step(4);
    EXPECT_EQ(rc.profile()->input_shape, (Shape{4, 3, 8, 8}));
    EXPECT_EQ(rc.segments(), full);
    EXPECT_EQ(rc.describe(), full_plan);
    step(2);
    EXPECT_EQ(rc.describe(), partial_plan);
  }
  EXPECT_EQ(rc.profiles(), 1) << "one profile, the full batch's";
  step(6);
  EXPECT_EQ(rc.profiles(), 2) << "a larger batch is profiled";
  EXPECT_EQ(rc.profile()->input_shape, (Shape{6, 3, 8, 8}));
  step(2);   // still the plan it ran (the kept entry)
  EXPECT_EQ(rc.describe(), partial_plan);
  const int64_t keep_all = int64_t{1} << 40;   // far above any plan's peak
  rc.set_memory_limit(keep_all);   // solved again for the current (partial) shape
  EXPECT_EQ(rc.memory_limit(), keep_all);
  step(4);   // the full batch's kept plan, solved again for the new limit
  EXPECT_EQ(rc.memory_limit(), keep_all);
  EXPECT_NE(rc.describe(), full_plan);
  for (const int s : rc.segments()) EXPECT_EQ(s, -1) << "everything kept under the new limit";
  EXPECT_EQ(rc.profiles(), 2);
}

// The partial batch's step under the full batch's plan peaks below the full batch's step: every
// tensor of it is smaller.
TEST(RecomputeTest, ASmallerBatchUnderTheLargerBatchsPlanPeaksBelowIt) {
  Net n = make_net(11);
  const Batch full = make_batch(16, 32), partial = make_batch(12, 32);
  Recomputer rc(*n.model, RecomputeMode::parse("optimal"), limit_at(*n.model, full.x, 0.3));
  const auto peak_of = [&](const Batch& b) {
    n.model->zero_grad();
    const int64_t before = memory_stats().allocated_bytes;
    reset_peak_stats(Device::cpu());
    loss_of(rc.forward(b.x), b.w).backward();
    return memory_stats().peak_allocated_bytes - before;
  };
  peak_of(full);   // the profile's own peaks are not the step's
  const int64_t full_peak = peak_of(full);
  const std::vector<int> plan = rc.segments();
  ASSERT_TRUE(std::any_of(plan.begin(), plan.end(), [](int s) { return s >= 0; })) << rc.describe();
  const int64_t partial_peak = peak_of(partial);
  EXPECT_EQ(rc.segments(), plan);
  EXPECT_EQ(rc.profiles(), 1);
  EXPECT_LT(partial_peak, full_peak);
}

// k micro-batches through AccumulatingTrainer: the parameters after the optimizer step are the
// same with recomputation as without.
TEST(RecomputeTest, GradientAccumulationMatchesWithoutRecompute) {
  const Batch b = make_batch(4, 8);
  Net n = make_net(11);
  auto train = [&](const std::string& mode) {
    n.reset();
    manual_seed(5);
    optim::SGD opt(n.model->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::AccumulatingTrainer trainer(opt);
    Recomputer rc(*n.model, RecomputeMode::parse(mode), mode == "optimal" ? limit_at(*n.model, b.x.slice(0, 0, 2), 0.5) : 0);
    const auto plan = optim::plan_accumulation({2, 2}, 2);
    for (int64_t i = 0; i < 2; ++i) {
      const Tensor x = b.x.slice(0, 2 * i, 2 * i + 2), w = b.w.slice(0, 2 * i, 2 * i + 2);
      trainer.micro_batch(loss_of(rc.forward(x), w), plan[static_cast<size_t>(i)]);
    }
    EXPECT_EQ(trainer.optimizer_steps(), 1);
    std::vector<std::vector<double>> state;
    for (const auto& [k, t] : n.model->ordered_state_dict()) state.push_back(t.to_vector());
    return state;
  };
  const auto ref = train("none");
  for (const std::string mode : {"stages", "optimal"}) EXPECT_EQ(train(mode), ref) << mode;
}

}  // namespace
}  // namespace minidl::nn
