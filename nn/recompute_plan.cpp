// The rotor-style dynamic program and the schedule simulator of nn/recompute_plan.h. The
// simulator walks the schedule step by step (allocations and frees), independently of the DP's
// unit decomposition, so the brute-force test really checks the DP.
#include "nn/recompute_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace minidl::nn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void validate(const std::vector<ChainStage>& chain, int64_t input_bytes, const char* who) {
  MINIDL_CHECK(!chain.empty(), who, ": the chain is empty; profile at least one stage");
  MINIDL_CHECK(input_bytes >= 0, who, ": input_bytes = ", input_bytes, " is negative");
  for (size_t i = 0; i < chain.size(); ++i) {
    const ChainStage& s = chain[i];
    MINIDL_CHECK(std::isfinite(s.forward_time) && s.forward_time >= 0.0, who, ": stage ", i,
                 " has forward_time = ", s.forward_time, "; times must be finite and >= 0");
    MINIDL_CHECK(std::isfinite(s.backward_time) && s.backward_time >= 0.0, who, ": stage ", i,
                 " has backward_time = ", s.backward_time, "; times must be finite and >= 0");
    MINIDL_CHECK(s.saved_bytes >= 0, who, ": stage ", i, " has saved_bytes = ", s.saved_bytes, " (negative)");
    MINIDL_CHECK(s.output_bytes >= 0, who, ": stage ", i, " has output_bytes = ", s.output_bytes, " (negative)");
    MINIDL_CHECK(s.param_grad_bytes >= 0 && s.backward_extra_bytes >= 0, who, ": stage ", i,
                 " has negative param_grad_bytes or backward_extra_bytes");
  }
}

// a[0] = input, a[k+1] = output of stage k (0-based stages).
std::vector<int64_t> activation_sizes(const std::vector<ChainStage>& chain, int64_t input_bytes) {
  std::vector<int64_t> a(chain.size() + 1);
  a[0] = input_bytes;
  for (size_t k = 0; k < chain.size(); ++k) a[k + 1] = chain[k].output_bytes;
  return a;
}

// One unit of the schedule: a KeepAll stage (first == last, keep_all) or a checkpointed segment.
struct Unit {
  size_t first = 0, last = 0;
  bool keep_all = false;
  int64_t local_peak = 0;  // peak above what earlier units keep, over the unit's forward/rerun/backward
  int64_t keep = 0;        // bytes the unit keeps from its forward until its backward
  double time = 0.0;
};

// g_after: the parameter gradients of the stages after the unit, live during its rerun and backward.
Unit make_unit(const std::vector<ChainStage>& c, const std::vector<int64_t>& a, size_t k, size_t e, bool keep_all,
               int64_t g_after) {
  Unit u;
  u.first = k;
  u.last = e;
  u.keep_all = keep_all;
  if (keep_all) {
    u.keep = c[k].saved_bytes;
    const int64_t fwd = a[k] + a[k + 1] + c[k].saved_bytes;
    u.local_peak = std::max(fwd, g_after + fwd + c[k].param_grad_bytes + c[k].backward_extra_bytes);
    u.time = c[k].forward_time + c[k].backward_time;
    return u;
  }
  u.keep = a[k];
  int64_t peak = a[k] + a[k + 1];                                                  // forward of stage k
  for (size_t j = k + 1; j <= e; ++j) peak = std::max(peak, a[k] + a[j] + a[j + 1]);  // no-grad forwards
  int64_t cum = 0;
  for (size_t j = k; j <= e; ++j) {  // reruns with grad, the output gradient a[e+1] live
    peak = std::max(peak, g_after + a[k] + a[e + 1] + cum + (j > k ? a[j] : 0) + a[j + 1] + c[j].saved_bytes);
    cum += c[j].saved_bytes;
  }
  int64_t grads = g_after;
  for (size_t j = e + 1; j-- > k;) {  // backwards e..k
    peak = std::max(peak, grads + a[k] + cum + a[j + 1] + a[j] + c[j].param_grad_bytes + c[j].backward_extra_bytes);
    cum -= c[j].saved_bytes;
    grads += c[j].param_grad_bytes;
  }
  u.local_peak = peak;
  double t = 0.0;
  for (size_t j = k; j <= e; ++j) t += 2.0 * c[j].forward_time + c[j].backward_time;
  u.time = t;
  return u;
}

// units_from[i]: every unit starting at stage i.
std::vector<std::vector<Unit>> all_units(const std::vector<ChainStage>& chain, const std::vector<int64_t>& a) {
  const size_t L = chain.size();
  std::vector<int64_t> g_from(L + 1, 0);  // parameter gradients of stages i..L-1
  for (size_t i = L; i-- > 0;) g_from[i] = g_from[i + 1] + chain[i].param_grad_bytes;
  std::vector<std::vector<Unit>> units_from(L);
  for (size_t k = 0; k < L; ++k) {
    units_from[k].push_back(make_unit(chain, a, k, k, true, g_from[k + 1]));
    for (size_t e = k; e < L; ++e) units_from[k].push_back(make_unit(chain, a, k, e, false, g_from[e + 1]));
  }
  return units_from;
}

// Least achievable peak (exact, in bytes).
int64_t least_peak_of(const std::vector<std::vector<Unit>>& units_from) {
  const size_t L = units_from.size();
  std::vector<int64_t> min_peak(L + 1, 0);
  for (size_t i = L; i-- > 0;) {
    int64_t best = std::numeric_limits<int64_t>::max();
    for (const Unit& u : units_from[i]) best = std::min(best, std::max(u.local_peak, u.keep + min_peak[u.last + 1]));
    min_peak[i] = best;
  }
  return min_peak[0];
}

int64_t ceil_div(int64_t x, int64_t d) { return (x + d - 1) / d; }

}  // namespace

const char* stage_mode_name(StageMode m) {
  switch (m) {
    case StageMode::KeepAll: return "keep-all";
    case StageMode::KeepInput: return "keep-input";
    case StageMode::KeepNothing: return "keep-nothing";
  }
  return "?";
}

std::string RecomputePlan::str() const {
  std::ostringstream os;
  os << "stage  mode\n";
  for (size_t i = 0; i < modes.size(); ++i) {
    char line[64];
    std::snprintf(line, sizeof line, "%5zu  %s\n", i, stage_mode_name(modes[i]));
    os << line;
  }
  if (feasible) {
    os << "predicted time " << predicted_time << ", predicted peak " << predicted_peak_bytes << " bytes\n";
  } else {
    os << "infeasible: " << reason << "\n";
  }
  return os.str();
}

RecomputePlan evaluate(const std::vector<ChainStage>& chain, int64_t input_bytes, const std::vector<StageMode>& modes,
                       int64_t memory_limit) {
  validate(chain, input_bytes, "recompute evaluate");
  MINIDL_CHECK(modes.size() == chain.size(), "recompute evaluate: ", modes.size(), " modes for a chain of ",
               chain.size(), " stages");
  RecomputePlan plan;
  plan.modes = modes;
  const size_t L = chain.size();
  for (size_t k = 0; k < L; ++k) {
    if (modes[k] == StageMode::KeepNothing && (k == 0 || modes[k - 1] == StageMode::KeepAll)) {
      plan.feasible = false;
      plan.predicted_time = kInf;
      plan.predicted_peak_bytes = -1;
      plan.reason = "stage " + std::to_string(k) +
                    " keeps nothing but no earlier keep-input stage lets its input be recomputed";
      return plan;
    }
  }
  const std::vector<int64_t> a = activation_sizes(chain, input_bytes);
  int64_t live = a[0], peak = a[0];
  auto moment = [&](int64_t extra) { peak = std::max(peak, live + extra); };
  double time = 0.0;
  // Forward.
  for (size_t k = 0; k < L; ++k) {
    const ChainStage& s = chain[k];
    time += s.forward_time;
    if (modes[k] == StageMode::KeepAll) {
      moment(a[k + 1] + s.saved_bytes);
      live += a[k + 1] + s.saved_bytes - a[k];
    } else if (modes[k] == StageMode::KeepInput) {
      moment(a[k + 1]);
      live += a[k + 1];
    } else {
      moment(a[k + 1]);
      live += a[k + 1] - a[k];
    }
  }
  // x_L is replaced by its gradient of the same size: live unchanged. Backward, unit by unit.
  size_t end = L;  // one past the last stage not yet backpropagated
  while (end > 0) {
    size_t k = end - 1;
    if (modes[k] == StageMode::KeepAll) {
      moment(a[k] + chain[k].param_grad_bytes + chain[k].backward_extra_bytes);
      live += a[k] + chain[k].param_grad_bytes - chain[k].saved_bytes - a[k + 1];
      time += chain[k].backward_time;
      end = k;
      continue;
    }
    while (modes[k] == StageMode::KeepNothing) --k;  // segment [k..end-1], k is KeepInput
    const size_t e = end - 1;
    for (size_t j = k; j <= e; ++j) {  // rerun with grad
      time += chain[j].forward_time;
      moment(a[j + 1] + chain[j].saved_bytes);
      live += a[j + 1] + chain[j].saved_bytes;
      if (j > k) live -= a[j];
    }
    live -= a[e + 1];
    for (size_t j = e + 1; j-- > k;) {
      time += chain[j].backward_time;
      moment(a[j] + chain[j].param_grad_bytes + chain[j].backward_extra_bytes);
      live += a[j] + chain[j].param_grad_bytes - chain[j].saved_bytes - a[j + 1];
    }
    live -= a[k];  // the checkpoint
    end = k;
  }
  plan.predicted_time = time;
  plan.predicted_peak_bytes = peak;
  plan.feasible = memory_limit < 0 || peak <= memory_limit;
  if (!plan.feasible) {
    plan.reason = "peak " + std::to_string(peak) + " bytes exceeds the limit of " + std::to_string(memory_limit);
  }
  return plan;
}

int64_t least_peak_bytes(const std::vector<ChainStage>& chain, int64_t input_bytes) {
  validate(chain, input_bytes, "recompute least_peak_bytes");
  return least_peak_of(all_units(chain, activation_sizes(chain, input_bytes)));
}

RecomputePlan solve_optimal(const std::vector<ChainStage>& chain, int64_t input_bytes, int64_t memory_limit) {
  validate(chain, input_bytes, "recompute solve_optimal");
  MINIDL_CHECK(memory_limit >= 0, "recompute solve_optimal: memory_limit = ", memory_limit, " is negative");
  const size_t L = chain.size();
  const std::vector<int64_t> a = activation_sizes(chain, input_bytes);

  // units_from[i]: every unit starting at stage i.
  const std::vector<std::vector<Unit>> units_from = all_units(chain, a);
  const int64_t least = least_peak_of(units_from);
  if (least > memory_limit) {
    RecomputePlan plan;
    plan.feasible = false;
    plan.predicted_time = kInf;
    plan.predicted_peak_bytes = -1;
    plan.reason = "memory limit " + std::to_string(memory_limit) +
                  " bytes is below the least peak any plan can reach (" + std::to_string(least) + " bytes)";
    return plan;
  }

  // Slot size: gcd of all sizes (exact) unless that gives too many slots.
  int64_t slot = 0;
  for (int64_t v : a) slot = std::gcd(slot, v);
  for (const ChainStage& s : chain) {
    slot = std::gcd(slot, s.saved_bytes);
    slot = std::gcd(slot, s.param_grad_bytes);
    slot = std::gcd(slot, s.backward_extra_bytes);
  }
  if (slot == 0) slot = 1;
  if (memory_limit / slot > kMaxSlots) slot = ceil_div(memory_limit, kMaxSlots);
  const int64_t R = memory_limit / slot;
  const size_t W = static_cast<size_t>(R) + 1;

  // best[i][r]: least time for stages i..L-1 with r free slots; pick[i][r]: index into units_from[i].
  std::vector<double> best((L + 1) * W, kInf);
  std::vector<int> pick(L * W, -1);
  for (size_t r = 0; r < W; ++r) best[L * W + r] = 0.0;
  for (size_t i = L; i-- > 0;) {
    for (size_t ui = 0; ui < units_from[i].size(); ++ui) {
      const Unit& u = units_from[i][ui];
      const int64_t need = ceil_div(u.local_peak, slot), keep = ceil_div(u.keep, slot);
      const size_t next = u.last + 1;
      for (int64_t r = need; r <= R; ++r) {
        const double rest = best[next * W + static_cast<size_t>(r - keep)];
        if (rest == kInf) continue;
        double& cur = best[i * W + static_cast<size_t>(r)];
        if (u.time + rest < cur) {
          cur = u.time + rest;
          pick[i * W + static_cast<size_t>(r)] = static_cast<int>(ui);
        }
      }
    }
  }
  const double optimum = best[static_cast<size_t>(R)];
  if (optimum == kInf) {
    RecomputePlan plan;
    plan.feasible = false;
    plan.predicted_time = kInf;
    plan.predicted_peak_bytes = -1;
    plan.reason = "no plan fits in " + std::to_string(memory_limit) + " bytes at the slot size of " +
                  std::to_string(slot) + " bytes (rounding); the least peak is " + std::to_string(least) +
                  " bytes";
    return plan;
  }
  std::vector<StageMode> modes(L, StageMode::KeepAll);
  size_t i = 0;
  int64_t r = R;
  while (i < L) {
    const Unit& u = units_from[i][static_cast<size_t>(pick[i * W + static_cast<size_t>(r)])];
    if (!u.keep_all) {
      modes[u.first] = StageMode::KeepInput;
      for (size_t j = u.first + 1; j <= u.last; ++j) modes[j] = StageMode::KeepNothing;
    }
    r -= ceil_div(u.keep, slot);
    i = u.last + 1;
  }
  RecomputePlan plan = evaluate(chain, input_bytes, modes, memory_limit);
  MINIDL_CHECK(plan.feasible, "recompute solve_optimal: internal error, the plan does not fit: ", plan.reason);
  plan.predicted_time = optimum;  // the DP's own sum; equals the simulated time up to rounding
  return plan;
}

std::vector<StageMode> sequential_modes(size_t L, int N) {
  MINIDL_CHECK(L > 0, "sequential_modes: the chain is empty");
  MINIDL_CHECK(N >= 1 && static_cast<size_t>(N) <= L, "sequential_modes: N = ", N, " segments for ", L,
               " stages; need 1 <= N <= L");
  std::vector<StageMode> modes(L, StageMode::KeepAll);
  const size_t seg = L / static_cast<size_t>(N);
  for (size_t s = 0; s + 1 < static_cast<size_t>(N); ++s) {
    modes[s * seg] = StageMode::KeepInput;
    for (size_t j = s * seg + 1; j < (s + 1) * seg; ++j) modes[j] = StageMode::KeepNothing;
  }
  return modes;
}

}  // namespace minidl::nn
