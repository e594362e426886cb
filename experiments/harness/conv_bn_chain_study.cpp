// The conv-bn-chain study: does training with batch norm carried by the convolutions
// (--conv-bn-chain, docs/conv_bn.md) follow the same loss curve as training with batch norm?
// The chain computes the same function in another order, and on a GPU through cuDNN's fused
// graphs, whose rounding is their own; what a user needs to know before switching it on is
// whether that changes training more than a change of seed does. So each seed trains the same
// ResNet twice, with batch norm and with the chain (same initial weights, same batches), for a
// few hundred steps; the outputs put the chain's training loss after each epoch beside the batch
// norm runs' spread over the seeds, with the paired (same seed) differences, and say how many of
// the chain's convolution calls ran as fused graphs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "experiments/harness/results.h"
#include "experiments/harness/sweep.h"

namespace minidl::harness {
namespace {

const char* const kBatchNorm = "batch norm";
const char* const kChain = "conv-bn chain";

// One group's training loss after each epoch, per seed (the runs that finished; only the epochs
// every one of them has), and the optimizer steps at each epoch's end (the first run's).
struct Losses {
  std::map<uint64_t, std::vector<double>> by_seed;
  std::vector<double> steps;
  int64_t fused = 0, calls = 0;   // conv2d_stats calls, forward and backward, over the group's runs
  size_t epochs() const {
    size_t n = std::numeric_limits<size_t>::max();
    for (const auto& [seed, v] : by_seed) n = std::min(n, v.size());
    return by_seed.empty() ? 0 : n;
  }
  std::vector<double> at(size_t k) const {
    std::vector<double> v;
    for (const auto& [seed, l] : by_seed) v.push_back(l[k]);
    return v;
  }
};

std::map<std::string, Losses> losses(const Study& st, const std::map<std::string, nlohmann::json>& runs) {
  std::map<std::string, Losses> out;
  for (const auto& run : st.runs) {
    auto it = runs.find(run.id);
    if (it == runs.end() || it->second.value("status", "") != "ok" || !it->second.contains("result")) continue;
    const nlohmann::json& r = it->second["result"];
    Losses& g = out[run.group];
    std::vector<double>& v = g.by_seed[run.config.seed];
    std::vector<double> steps;
    for (const auto& e : r.value("epochs", nlohmann::json::array())) {
      v.push_back(e["train_loss"].is_number() ? e["train_loss"].get<double>() : std::nan(""));
      steps.push_back(e.value("steps", 0.0));
    }
    if (g.steps.size() < steps.size()) g.steps = steps;
    const nlohmann::json k = r.value("conv_stats", nlohmann::json::object());
    g.fused += k.value("fused_forward", int64_t{0}) + k.value("fused_backward", int64_t{0});
    g.calls += k.value("fused_forward", int64_t{0}) + k.value("fused_backward", int64_t{0}) +
               k.value("composed_forward", int64_t{0}) + k.value("composed_backward", int64_t{0});
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? std::nan("") : s / static_cast<double>(v.size());
}

double sd(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

// The loss curves: mean over the seeds with +-sd error bars, against the optimizer steps.
std::string loss_plot(const Study& st, const std::map<std::string, Losses>& by_group,
                      const std::filesystem::path& out) {
  PlotSpec plot;
  plot.title = st.name + ": " + run_setting(st, st.runs.empty() ? "cpu" : st.runs.front().config.device) +
               (st.quick ? ", a scaled-down check" : "");
  plot.xlabel = "optimizer steps (end of each epoch)";
  plot.ylabel = "training loss (mean and sd over seeds)";
  plot.logx = false;
  for (const char* g : {kBatchNorm, kChain}) {
    auto it = by_group.find(g);
    if (it == by_group.end()) continue;
    Series s{g, {}, {}, 0};
    for (size_t k = 0; k < it->second.epochs(); ++k) {
      const auto v = it->second.at(k);
      s.points.emplace_back(it->second.steps[k], mean(v));
      s.errors.push_back(sd(v));
    }
    plot.series.push_back(s);
  }
  const std::string png = st.name + "-loss.png";
  const std::string note = plot_png(plot, out / png);
  return note.empty() ? "![training loss against steps](" + png + ")\n\n" : "No plot: " + note + "\n\n";
}

std::string outputs(const Study& st, const CsvTable&, const std::map<std::string, nlohmann::json>& runs,
                    const std::filesystem::path& out) {
  const auto by_group = losses(st, runs);
  std::string md = loss_plot(st, by_group, out);
  const auto bn = by_group.find(kBatchNorm), chain = by_group.find(kChain);
  if (bn == by_group.end() || chain == by_group.end())
    return md + "No finished pair of runs yet (batch norm and chain): no comparison.\n\n";
  // Per epoch: each group's mean, sd and range over its seeds, and the paired differences of the
  // seeds both finished.
  const size_t epochs = std::min(bn->second.epochs(), chain->second.epochs());
  std::vector<Row> rows;
  int within = 0, judged = 0;
  double largest_paired = 0, largest_sd = 0;
  for (size_t k = 0; k < epochs; ++k) {
    const auto a = bn->second.at(k), b = chain->second.at(k);
    std::vector<double> paired;
    for (const auto& [seed, l] : chain->second.by_seed) {
      auto p = bn->second.by_seed.find(seed);
      if (p != bn->second.by_seed.end()) paired.push_back(l[k] - p->second[k]);
    }
    double largest = 0;
    for (double d : paired) largest = std::max(largest, std::fabs(d));
    largest_paired = std::max(largest_paired, largest);
    largest_sd = std::max(largest_sd, sd(a));
    const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
    std::string verdict = "-";
    if (a.size() >= 2) {
      ++judged;
      const bool in = mean(b) >= *lo && mean(b) <= *hi;
      within += in;
      verdict = in ? "yes" : "**no**";
    }
    rows.push_back({std::to_string(k + 1), fmt(bn->second.steps[k], 0),
                    fmt(mean(a)) + " +- " + fmt(sd(a)) + " [" + fmt(*lo) + ", " + fmt(*hi) + "]",
                    fmt(mean(b)) + " +- " + fmt(sd(b)), paired.empty() ? "-" : fmt(mean(paired)),
                    paired.empty() ? "-" : fmt(largest), verdict});
  }
  md += "Training loss after each epoch, mean +- sd over the seeds [the batch norm runs' range]; the paired "
        "difference is chain - batch norm for the same seed (same initial weights and batches):\n\n";
  md += markdown_table({"epoch", "steps", kBatchNorm, kChain, "paired difference (mean)", "largest |paired|",
                        "chain's mean within batch norm's range"},
                       rows) +
        "\n";
  if (judged > 0) {
    md += "The chain's mean loss lies within the batch norm runs' range over " +
          std::to_string(bn->second.by_seed.size()) + " seeds at " + std::to_string(within) + " of " +
          std::to_string(judged) + " epochs; the largest paired difference is " + fmt(largest_paired) +
          " against a seed-to-seed sd of up to " + fmt(largest_sd) + ".\n\n";
  } else {
    md += "One seed per path so far: no seed-to-seed spread to compare with.\n\n";
  }
  const Losses& c = chain->second;
  md += "The chain's convolution calls (forward and backward, every run): " + std::to_string(c.fused) + " of " +
        std::to_string(c.calls) + " ran as the backend's fused graphs, the others composed of minidl's own ops" +
        (c.fused == 0 ? " (no backend here fuses: the CPU composes every call, so this table compares the "
                        "chain's order of operations, not cuDNN's fused kernels)"
                      : "") +
        ".\n\n";
  return md;
}

}  // namespace

Study conv_bn_chain_study(bool quick, const TrainConfig& base) {
  Study s;
  s.name = "conv-bn-chain";
  s.title = "Batch norm carried by the convolutions (--conv-bn-chain) against batch norm: the training loss";
  s.seeds = 3;
  s.summary_columns = {"run_id", "group", "test_acc", "best_val_acc", "steps", "images_per_s", "peak_allocated_mib",
                       "status"};
  const StudyScale scale =
      quick ? StudyScale{"resnet18-small", 16, "128,64,64", 5} : StudyScale{"resnet50", 224, "600,200,200", 8};
  s.notes = "What it checks: whether --conv-bn-chain changes training more than a change of seed does. Each seed "
            "trains the same ResNet with batch norm and with the chain, from the same initial weights on the same "
            "batches (" +
            std::string(quick ? "80 steps: 256 training images at batch 16, 5 epochs"
                              : "about 300 steps: 1200 training photos at batch 32, 8 epochs") +
            "). The chain computes the same function in another order (the batch variance as E[y^2] - E[y]^2), and "
            "on a CUDA device with channels-last data through cuDNN's fused graphs, so its losses differ from batch "
            "norm's by rounding. It passes where its curve lies within the batch norm runs' seed-to-seed spread. "
            "Settings as the techniques study's (SGD, momentum 0.9, lr 0.001, weight decay 1e-4), with --amp (f16; "
            "--amp bf16 in the sweep makes it bf16); the --quick check in f32 unless the sweep sets --amp.";
  for (int k = 0; k < s.seeds; ++k) {
    for (const bool chain : {false, true}) {
      SweepRun& r = add_study_run(s, base, scale);
      TrainConfig& c = r.config;
      use_article_sgd(c);
      c.batch_size = quick ? 16 : 32;
      c.amp = !quick || base.amp;   // --quick (sized for a CPU) in f32 unless the sweep sets --amp
      c.amp_dtype = base.amp ? base.amp_dtype : "f16";
      c.conv_bn_chain = chain;
      c.seed = base.seed + static_cast<uint64_t>(k);
      c.progress_every = 0;
      r.id = std::string(chain ? "chain" : "bn") + "-s" + std::to_string(c.seed);
      r.group = chain ? kChain : kBatchNorm;
    }
  }
  s.extra_outputs = outputs;
  return s;
}

}  // namespace minidl::harness
