// The planning half of the `optimal` recomputation mode (DESIGN.md "Recomputation"): a
// pure dynamic program over a profiled chain of stages, in the spirit of rotor (Beaumont et al.
// 2019), plus a simulator of the same cost model so plans can be checked and compared.
//
// THE MODEL (used identically by solve_optimal and evaluate)
// ---------------------------------------------------------
// Chain of L stages; stage i (1-based) maps x_{i-1} -> x_i. a_0 = input_bytes, a_i = output_bytes
// of stage i, s_i = saved_bytes, g_i = param_grad_bytes, e_i = backward_extra_bytes, f_i / b_i =
// forward / backward time (nn/recompute_profile.h measures them). Each stage gets a mode:
//   KeepAll     (A): forward runs with grad; s_i stays allocated until stage i's backward.
//   KeepInput   (C): forward runs without grad; its input x_{i-1} is kept (a checkpoint) and
//                    starts a segment [i..e] made of this stage and the KeepNothing stages after it.
//   KeepNothing (N): forward runs without grad, nothing is kept; it must follow a C or N stage
//                    (otherwise its input could not be recomputed: the assignment is invalid).
// Single level: the forward runs the units (an A stage, or a C segment) in order; the backward
// handles them in reverse. Backward of a segment [p..e] reruns stages p..e with grad from the
// checkpoint (all s_j kept), then runs backward e..p; the checkpoint is freed after b_p.
// Memory counts live tensors only (a "moment" is the peak while one step runs):
//   forward of A stage i  : live + a_{i-1} + a_i + s_i; afterwards x_{i-1} freed, s_i stays.
//   forward of C stage i  : live + a_{i-1} + a_i;       afterwards x_{i-1} stays (checkpoint).
//   forward of N stage i  : live + a_{i-1} + a_i;       afterwards x_{i-1} freed.
//   after the last stage the output x_L is replaced by its gradient (same size a_L).
//   backward of stage i   : live (including s_i and the output gradient a_i) + gradient a_{i-1}
//                           + g_i + e_i; afterwards s_i and the gradient a_i are freed and the
//                           parameter gradients g_i stay (until the optimizer step, after the
//                           backward). e_i: the backward's own temporaries (intermediate gradients).
//   rerun of stage j in segment [p..e], while the segment's output gradient a_e is live:
//                           live + (j>p ? a_{j-1} : 0, the checkpoint is already live) + a_j + s_j;
//                           afterwards x_{j-1} freed (not the checkpoint), s_j stays; after the
//                           rerun of e its output x_e is freed (its gradient is already live).
// Nothing else is counted (parameters, their gradients from an earlier micro-batch, optimizer
// state, workspace, the caller's copy of x_0: x_0 is freed like any other activation unless
// stage 1 keeps it). Time = sum(f_i + b_i) + sum of f_i over the stages that are not KeepAll
// (each is rerun exactly once). Peak = max over all moments.
//
// THE DYNAMIC PROGRAM. Because the backward handles units in reverse order, while unit u runs
// (forward, rerun or backward) the memory is S_{u-1} + local(u), where S_{u-1} is what earlier
// units keep (s_i for an A stage, a_{p-1} for a segment) and local(u) depends only on u's stages
// and, for its rerun and backward moments, on the parameter gradients of the stages after it.
// So best(i, R) = least time for stages i+1..L with R free memory slots =
//   min over units u starting at i+1 with local_peak(u) <= R of time(u) + best(end(u), R - keep(u)).
// Discretisation: the slot is the gcd of all a_i and s_i, making the DP exact, unless that gives
// more than kMaxSlots slots under the limit; then slot = ceil(limit / kMaxSlots) and every local
// quantity is rounded up to whole slots (conservative: plans stay within the limit in bytes, but
// may be slightly slower than the true optimum). The returned time and peak are re-measured in
// bytes with evaluate().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minidl::nn {

struct ChainStage {
  double forward_time = 0.0;
  double backward_time = 0.0;
  int64_t saved_bytes = 0;   // kept for backward when run with grad (includes what backward needs)
  int64_t output_bytes = 0;  // its output activation, the next stage's input
  int64_t param_grad_bytes = 0;      // g_i: its parameters' gradients, made by its backward
  int64_t backward_extra_bytes = 0;  // e_i: the backward's temporaries beyond the model's tensors
};

enum class StageMode { KeepAll, KeepInput, KeepNothing };

const char* stage_mode_name(StageMode m);  // "keep-all", "keep-input", "keep-nothing"

struct RecomputePlan {
  std::vector<StageMode> modes;     // per stage; empty when solve_optimal finds nothing feasible
  double predicted_time = 0.0;      // +infinity when not feasible
  int64_t predicted_peak_bytes = 0; // -1 when no valid schedule exists
  bool feasible = false;
  std::string reason;               // why not feasible (empty when feasible)
  std::string str() const;          // printable table
};

constexpr int64_t kMaxSlots = int64_t{1} << 16;

// Least-time plan whose peak stays within memory_limit bytes (see the model above).
RecomputePlan solve_optimal(const std::vector<ChainStage>& chain, int64_t input_bytes, int64_t memory_limit);

// The least peak any valid assignment reaches (exact, in bytes): limits below it are infeasible.
int64_t least_peak_bytes(const std::vector<ChainStage>& chain, int64_t input_bytes);

// Simulates one assignment under the model. feasible is false when the assignment is invalid (a
// KeepNothing stage not preceded by KeepInput/KeepNothing) or, when memory_limit >= 0, when the
// peak exceeds it; time and peak are still reported for a valid assignment over the limit.
RecomputePlan evaluate(const std::vector<ChainStage>& chain, int64_t input_bytes, const std::vector<StageMode>& modes,
                       int64_t memory_limit = -1);

// PyTorch checkpoint_sequential with N segments: segment length L / N (integer division); the
// first N-1 segments are checkpointed (first stage KeepInput, the rest KeepNothing); the last
// segment (the remainder of the chain) runs normally (KeepAll). N = 1 keeps everything.
std::vector<StageMode> sequential_modes(size_t L, int N);

}  // namespace minidl::nn
