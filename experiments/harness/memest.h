// The memory estimator of "Batch size and memory tradeoffs": parameters + gradients + optimizer
// state + activations (from the model summary) + workspace, against the peak measured over a real
// training step, per batch size. minidl-memest prints the table; the error column says how far a
// back-of-the-envelope estimate can be trusted before running the finder.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "experiments/harness/config.h"

namespace minidl::harness {

// Per-sample quantities from the model summary, and the fixed ones.
struct MemoryModelInputs {
  int64_t parameter_bytes = 0;
  double optimizer_state_factor = 0.0;    // state bytes per parameter byte
  int64_t activation_bytes_per_sample = 0;  // what the forward keeps for backward
  int64_t largest_output_bytes_per_sample = 0;
  int64_t input_bytes_per_sample = 0;     // the image and its label
};

struct MemoryEstimate {
  int64_t batch = 0;
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, workspace = 0;
  int64_t total() const { return parameters + gradients + optimizer_state + activations + workspace; }
};

// activations = (saved + input) x batch; workspace = 2 x the largest layer output x batch (the
// gradient arriving at a layer and the one it produces are alive together in backward).
MemoryEstimate estimate_memory(const MemoryModelInputs& in, int64_t batch);

struct MemestRow {
  MemoryEstimate estimate;
  int64_t measured_peak = 0;   // peak allocated bytes over one full training step
  double error_pct() const;    // (estimate - measured) / measured x 100
};

// Builds c's model, reads its summary, and measures one training step per batch size.
std::vector<MemestRow> run_memest(const TrainConfig& c, const std::vector<int64_t>& batches,
                                  MemoryModelInputs* inputs_out = nullptr);

std::string memest_table(const std::vector<MemestRow>& rows);

}  // namespace minidl::harness
