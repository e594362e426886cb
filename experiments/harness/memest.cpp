// The memory estimate and its measurement (see memest.h).
#include "experiments/harness/memest.h"

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "experiments/harness/model.h"
#include "experiments/harness/results.h"
#include "experiments/harness/step_runner.h"

namespace minidl::harness {

MemoryEstimate estimate_memory(const MemoryModelInputs& in, int64_t batch) {
  MemoryEstimate e;
  e.batch = batch;
  e.parameters = in.parameter_bytes;
  e.gradients = in.parameter_bytes;
  e.optimizer_state = static_cast<int64_t>(static_cast<double>(in.parameter_bytes) * in.optimizer_state_factor);
  e.activations = (in.activation_bytes_per_sample + in.input_bytes_per_sample) * batch;
  e.workspace = 2 * in.largest_output_bytes_per_sample * batch;
  return e;
}

double MemestRow::error_pct() const {
  return measured_peak > 0 ? 100.0 * static_cast<double>(estimate.total() - measured_peak) /
                                 static_cast<double>(measured_peak)
                           : 0.0;
}

std::vector<MemestRow> run_memest(const TrainConfig& c, const std::vector<int64_t>& batches,
                                  MemoryModelInputs* inputs_out) {
  validate(c);
  StepRunner runner(c, 0);
  Model& m = runner.model();
  MemoryModelInputs in;
  in.parameter_bytes = runner.parameter_bytes();
  in.optimizer_state_factor = optimizer_state_factor(c);
  const nn::Summary s = m.module->summary(m.input_shape(1));
  in.activation_bytes_per_sample = s.total_saved_bytes_per_sample;
  for (const auto& row : s.rows)
    in.largest_output_bytes_per_sample = std::max(in.largest_output_bytes_per_sample, numel_of(row.output_shape) * 4);
  in.input_bytes_per_sample = 3 * m.image_size * m.image_size * 4 + 8;
  if (inputs_out) *inputs_out = in;
  std::vector<MemestRow> rows;
  for (int64_t b : batches) {
    MemestRow r;
    r.estimate = estimate_memory(in, b);
    const Trial t = runner.run(b, 1);
    r.measured_peak = t.peak_allocated;
    rows.push_back(r);
  }
  return rows;
}

std::string memest_table(const std::vector<MemestRow>& rows) {
  auto mb = [](int64_t b) { return fmt(static_cast<double>(b) / (1024.0 * 1024.0), 1); };
  std::vector<Row> out;
  for (const auto& r : rows) {
    const auto& e = r.estimate;
    out.push_back({std::to_string(e.batch), mb(e.parameters), mb(e.gradients), mb(e.optimizer_state),
                   mb(e.activations), mb(e.workspace), mb(e.total()), mb(r.measured_peak), fmt(r.error_pct(), 1)});
  }
  return markdown_table({"batch", "params MiB", "grads MiB", "optimizer MiB", "activations MiB", "workspace MiB",
                         "estimate MiB", "measured peak MiB", "error %"},
                        out);
}

}  // namespace minidl::harness
