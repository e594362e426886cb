// RecomputeMode and Recomputer of nn/recompute.h: mode names, the mapping from planner modes to
// run_chain segments, and the optimal mode's profile -> limit -> plan sequence.
#include "nn/recompute.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/error.h"
#include "nn/checkpoint.h"

namespace minidl::nn {
namespace {

const char* kForms = "use none, stages, sequential:N (N >= 1 segments) or optimal";

std::string mib(int64_t bytes) { return format_bytes(static_cast<size_t>(std::max<int64_t>(bytes, 0))); }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

RecomputeMode RecomputeMode::parse(const std::string& s) {
  RecomputeMode m;
  if (s == "none") return m;
  if (s == "stages") {
    m.kind = Kind::Stages;
    return m;
  }
  if (s == "optimal") {
    m.kind = Kind::Optimal;
    return m;
  }
  const std::string prefix = "sequential:";
  if (s.rfind(prefix, 0) == 0) {
    const std::string n = s.substr(prefix.size());
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(n, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MINIDL_CHECK(!n.empty() && used == n.size() && v >= 1, "recompute mode '", s,
                 "': the segment count must be an integer >= 1 (e.g. sequential:4)");
    m.kind = Kind::Sequential;
    m.segments = v;
    return m;
  }
  MINIDL_FAIL("recompute mode '", s, "' is unknown; ", kForms);
}

std::string RecomputeMode::str() const {
  switch (kind) {
    case Kind::None: return "none";
    case Kind::Stages: return "stages";
    case Kind::Sequential: return "sequential:" + std::to_string(segments);
    case Kind::Optimal: return "optimal";
  }
  return "?";
}

std::vector<int> segments_from_modes(const std::vector<StageMode>& modes) {
  std::vector<int> seg(modes.size(), -1);
  int id = -1;
  for (size_t i = 0; i < modes.size(); ++i) {
    switch (modes[i]) {
      case StageMode::KeepAll: break;
      case StageMode::KeepInput: seg[i] = ++id; break;
      case StageMode::KeepNothing:
        MINIDL_CHECK(i > 0 && seg[i - 1] >= 0, "segments_from_modes: stage ", i,
                     " keeps nothing but does not follow a keep-input or keep-nothing stage");
        seg[i] = id;
        break;
    }
  }
  return seg;
}

std::vector<StageMode> modes_from_segments(const std::vector<int>& segments) {
  std::vector<StageMode> modes(segments.size(), StageMode::KeepAll);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i] < 0) continue;
    const bool continues = i > 0 && segments[i - 1] == segments[i];
    modes[i] = continues ? StageMode::KeepNothing : StageMode::KeepInput;
  }
  return modes;
}

Recomputer::Recomputer(ResNet& model, RecomputeMode mode, int64_t memory_limit_bytes)
    : model_(model), mode_(mode), limit_arg_(memory_limit_bytes) {
  MINIDL_CHECK(memory_limit_bytes >= 0, "Recomputer: memory_limit_bytes = ", memory_limit_bytes,
               " is negative; give 0 to derive it from the memory budget");
  switch (mode_.kind) {
    case RecomputeMode::Kind::None: break;
    case RecomputeMode::Kind::Stages: {
      links_ = model_.stages();
      segments_.assign(links_.size(), -1);
      for (size_t i = 0; i + 1 < links_.size(); ++i) segments_[i] = static_cast<int>(i);  // all but the head
      break;
    }
    case RecomputeMode::Kind::Sequential:
      MINIDL_CHECK(mode_.segments >= 1, "Recomputer: sequential needs at least 1 segment, got ", mode_.segments);
      links_ = model_.chain();
      segments_ = sequential_segments(links_.size(), mode_.segments);
      break;
    case RecomputeMode::Kind::Optimal: links_ = model_.chain(); break;
  }
}

void Recomputer::replan(const Tensor& x) {
  device_ = x.device();
  Planned p;   // kept only once whole: a profile that runs out of memory changes nothing
  p.shape = x.shape();
  p.profile = profile_chain(links_, x);
  ++profiles_;
  p.keep_all = evaluate(p.profile.stages, p.profile.input_bytes,
                        std::vector<StageMode>(p.profile.stages.size(), StageMode::KeepAll));
  solve(p, memory_stats(x.device()));
  keep(std::move(p));
}

void Recomputer::keep(Planned p) {
  if (planned_.size() >= kPlannedShapes) planned_.erase(planned_.begin());
  planned_.push_back(std::move(p));
}

void Recomputer::set_memory_limit(int64_t bytes) {
  MINIDL_CHECK(bytes >= 0, "Recomputer::set_memory_limit: ", bytes, " bytes is negative; give 0 for the budget");
  limit_arg_ = bytes;
  if (!planned_.empty()) solve(planned_.back(), memory_stats(device_));
}

void Recomputer::solve(Planned& p, const MemoryStats& ms) {
  p.limit_arg = limit_arg_;
  p.lowered = 0;
  int64_t limit = p.keep_all.predicted_peak_bytes;  // nothing to fit into: keep everything
  if (limit_arg_ > 0) {
    limit = limit_arg_;
  } else if (ms.budget_bytes > 0) {
    const int64_t free = ms.budget_bytes - ms.reserved_bytes;
    limit = std::max<int64_t>(0, free - free / 10) + p.profile.input_bytes;
  }
  solve_under(p, limit);
}

void Recomputer::solve_under(Planned& p, int64_t limit) {
  const ChainProfile& pr = p.profile;
  p.limit = limit;
  p.rehearsed = false;
  p.below_least_peak = false;
  if (p.keep_all.predicted_peak_bytes <= p.limit) {
    p.plan = p.keep_all;  // no recomputation needed (and no slot rounding to lose it)
  } else {
    p.plan = solve_optimal(pr.stages, pr.input_bytes, p.limit);
    p.below_least_peak = !p.plan.feasible;
  }
  if (p.below_least_peak) {
    // The least-memory plan: bisect (to 0.1%) the smallest limit the planner accepts, so the
    // allocator, not the model's estimate, has the last word.
    int64_t lo = std::max(p.limit, least_peak_bytes(pr.stages, pr.input_bytes) - 1);
    int64_t hi = p.keep_all.predicted_peak_bytes;
    RecomputePlan best = p.keep_all;
    while (hi - lo > std::max<int64_t>(1, hi / 1000)) {
      const int64_t mid = lo + (hi - lo) / 2;
      RecomputePlan cand = solve_optimal(pr.stages, pr.input_bytes, mid);
      if (cand.feasible) {
        hi = mid;
        best = std::move(cand);
      } else {
        lo = mid;
      }
    }
    p.plan = std::move(best);
  }
  p.segments = segments_from_modes(p.plan.modes);
}

Tensor Recomputer::forward(const Tensor& x) {
  if (mode_.kind == RecomputeMode::Kind::None || !grad_enabled()) return model_(x);
  if (mode_.kind == RecomputeMode::Kind::Optimal) {
    const Planned* c = current();
    if (c == nullptr || !c->serves(x)) switch_plan(x);
    if (!planned_.back().rehearsed) rehearse(x);
  }
  return run_chain(links_, x, segments());
}

void Recomputer::rehearse(const Tensor& x) {
  Planned& p = planned_.back();
  const Device d = x.device();
  if (memory_stats(d).budget_bytes == 0) {   // no budget: nothing refuses the step's memory
    p.rehearsed = true;
    return;
  }
  for (;;) {
    try {
      // From an empty cache, as the step after it starts: the two allocate alike.
      empty_cache(d);
      rehearse_chain(links_, x, p.segments);
      empty_cache(d);
      p.rehearsed = true;
      return;
    } catch (const OutOfMemoryError& e) {
      if (p.below_least_peak) throw;   // not even the least-memory plan fits: the step's OOM
      ++p.lowered;
      const int64_t peak = p.plan.predicted_peak_bytes;
      const int64_t short_by = static_cast<int64_t>(e.in_use() + e.requested()) - static_cast<int64_t>(e.budget());
      // A shortfall above the plan's whole peak (one large request) goes straight to the least-memory plan.
      solve_under(p, p.lowered > kLowerings ? 0 : std::max<int64_t>(0, peak - std::max(short_by, peak / 20)));
    }
  }
}

void Recomputer::switch_plan(const Tensor& x) {
  const auto it = std::find_if(planned_.begin(), planned_.end(), [&](const Planned& p) { return p.serves(x); });
  if (it == planned_.end()) {
    // The nearest larger batch of the same image shape planned so far, whose plan this one runs.
    const Shape& s = x.shape();
    const Planned* larger = nullptr;
    for (const Planned& p : planned_) {
      const Shape& q = p.shape;
      if (p.profile.input_dtype == x.dtype() && q.size() == s.size() && !s.empty() && q[0] > s[0] &&
          std::equal(s.begin() + 1, s.end(), q.begin() + 1) && (larger == nullptr || q[0] < larger->shape[0]))
        larger = &p;
    }
    if (larger == nullptr) {
      replan(x);
      return;
    }
    Planned p = *larger;
    p.shape = s;
    keep(std::move(p));
    if (planned_.back().limit_arg != limit_arg_) solve(planned_.back(), memory_stats(device_));
    return;
  }
  std::rotate(it, it + 1, planned_.end());   // the kept plan becomes the current one, the last
  // set_memory_limit came in between: the kept plan is solved again from its profile.
  if (planned_.back().limit_arg != limit_arg_) solve(planned_.back(), memory_stats(device_));
}

const RecomputePlan* Recomputer::plan() const { return current() ? &current()->plan : nullptr; }
const ChainProfile* Recomputer::profile() const { return current() ? &current()->profile : nullptr; }
int64_t Recomputer::memory_limit() const { return current() ? current()->limit : 0; }
const std::vector<int>& Recomputer::segments() const {
  return mode_.kind == RecomputeMode::Kind::Optimal && current() ? current()->segments : segments_;
}

std::string Recomputer::describe() const {
  std::ostringstream os;
  os << "recompute: " << mode_.str();
  switch (mode_.kind) {
    case RecomputeMode::Kind::None: os << " (every activation kept)\n"; return os.str();
    case RecomputeMode::Kind::Stages:
      os << " (stem, layer1..layer4 each one checkpoint; the head kept)\n";
      return os.str();
    case RecomputeMode::Kind::Sequential: {
      os << " over the block chain (" << links_.size() << " links), checkpoint segments:";
      for (size_t i = 0; i < links_.size(); ++i) {
        if (i == 0 || segments_[i] != segments_[i - 1]) os << (i ? "] [" : " [");
        else os << " ";
        os << links_[i].name;
      }
      os << "]\n";
      return os.str();
    }
    case RecomputeMode::Kind::Optimal: break;
  }
  const Planned* c = current();
  if (c == nullptr) {
    os << " (profiled and planned at the first forward with grad on)\n";
    return os.str();
  }
  const ChainProfile& p = c->profile;
  os << " over the block chain (" << links_.size() << " links), batch " << shape_str(c->shape);
  if (c->borrowed())
    os << ": the plan of batch " << shape_str(p.input_shape) << " (a smaller batch keeps no more), profiled at it";
  os << ", limit " << mib(c->limit) << (limit_arg_ > 0 ? " (given)" : " (from the memory budget)") << "\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-10s %-13s %9s %9s %11s %11s\n", "link", "mode", "fwd ms", "bwd ms",
                "saved MiB", "out MiB");
  os << line;
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const ChainStage& s = p.stages[i];
    std::snprintf(line, sizeof line, "  %-10s %-13s %9.3f %9.3f %11.3f %11.3f\n", p.names[i].c_str(),
                  stage_mode_name(c->plan.modes[i]), s.forward_time * 1e3, s.backward_time * 1e3,
                  static_cast<double>(s.saved_bytes) / 1048576.0, static_cast<double>(s.output_bytes) / 1048576.0);
    os << line;
  }
  const double base = c->keep_all.predicted_time;
  std::snprintf(line, sizeof line,
                "  modelled time %.3f ms (keep-all %.3f ms, +%.1f%% recompute; times modelled from bytes and flops)\n",
                c->plan.predicted_time * 1e3, base * 1e3,
                base > 0 ? 100.0 * (c->plan.predicted_time / base - 1.0) : 0.0);
  os << "  predicted peak " << mib(c->plan.predicted_peak_bytes) << " (keep-all "
     << mib(c->keep_all.predicted_peak_bytes) << ")\n"
     << line;
  if (c->lowered > 0) {
    os << "  the limit lowered " << c->lowered << (c->lowered == 1 ? " time" : " times")
       << " after a rehearsal of the plan ran out of memory\n";
  }
  if (c->below_least_peak) {
    os << "  the limit is below the least peak any plan reaches: this is the least-memory plan\n";
  }
  return os.str();
}

}  // namespace minidl::nn
