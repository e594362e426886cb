// The named GPUs of --gpu and the budget and assumptions of a plan (see gpu_plan.h).
#include "experiments/harness/gpu_plan.h"

#include <algorithm>
#include <cctype>

#include "core/allocator.h"
#include "core/backend.h"

namespace minidl::harness {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

constexpr int64_t MiB = int64_t{1} << 20;

}  // namespace

const std::vector<GpuSpec>& known_gpus() {
  // The totals nvidia-smi reports for each card (MiB).
  static const std::vector<GpuSpec> g{
      {"h100", "NVIDIA H100 80GB HBM3", 81559 * MiB},
      {"h200", "NVIDIA H200 141GB HBM3e", 143771 * MiB},
      {"a100-80gb", "NVIDIA A100 80GB", 81920 * MiB},
      {"a100-40gb", "NVIDIA A100 40GB", 40960 * MiB},
      {"l4", "NVIDIA L4 24GB", 23034 * MiB},
      {"rtx-2080ti", "NVIDIA GeForce RTX 2080 Ti 11GB", 11264 * MiB},
      {"rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 24564 * MiB},
  };
  return g;
}

GpuSpec parse_gpu(const std::string& s) {
  const std::string want = lower(s);
  for (const GpuSpec& g : known_gpus())
    if (g.name == want) return g;
  std::string names;
  for (const GpuSpec& g : known_gpus()) names += (names.empty() ? "" : ", ") + g.name;
  size_t bytes = 0;
  try {
    bytes = parse_bytes(s);
  } catch (const Error&) {
    throw UsageError("--gpu '" + s + "': expected one of " + names + ", or the GPU's memory (e.g. 24GiB)");
  }
  if (bytes <= static_cast<size_t>(kCudaContextBytes))
    throw UsageError("--gpu " + s + ": a GPU needs more memory than its CUDA context takes (" +
                     format_bytes(static_cast<size_t>(kCudaContextBytes)) + ")");
  return {s, "a GPU with " + format_bytes(bytes), static_cast<int64_t>(bytes)};
}

int64_t plan_budget(const TrainConfig& c) {
  const GpuSpec g = parse_gpu(c.gpu);
  Device d;
  try {
    d = Device::parse(c.device);
  } catch (const Error&) {
    throw UsageError("--device '" + c.device + "': expected cuda (or cuda:N) with --gpu");
  }
  if (!d.is_cuda())
    throw UsageError("--gpu " + c.gpu + " plans for a GPU: add --device cuda (got --device " + c.device + ")");
  const int64_t usable = g.total_bytes - kCudaContextBytes;
  if (c.memory_budget.empty()) return usable;
  const auto budget = static_cast<int64_t>(parse_bytes(c.memory_budget));
  if (budget > usable)
    throw UsageError("--memory-budget " + c.memory_budget + " is more than " + g.description + " leaves to tensors (" +
                     format_bytes(static_cast<size_t>(usable)) + ": " + format_bytes(static_cast<size_t>(g.total_bytes)) +
                     " less " + format_bytes(static_cast<size_t>(kCudaContextBytes)) + " for the CUDA context)");
  return budget;
}

std::string plan_assumptions(const TrainConfig& c) {
  const GpuSpec g = parse_gpu(c.gpu);
  std::string s = "a plan for " + g.description + " (" + format_bytes(static_cast<size_t>(g.total_bytes)) +
                  "; --gpu " + c.gpu + "): the dry run alone, no step runs on a GPU; assumed: " +
                  format_bytes(static_cast<size_t>(kCudaContextBytes)) +
                  " of it for the CUDA context and the libraries' handles";
  if (cuda_device_count() == 0)
    s += "; cuDNN's convolutions run their workspace-free algorithms (no GPU here to ask cuDNN's heuristic: on the "
         "GPU, faster ones with a workspace run where memory allows, and the run falls back to these at its limit)";
  else
    s += "; cuDNN's algorithms as its heuristic ranks them on this machine's GPU";
  if (c.cudnn_benchmark == "on")
    s += "; --cudnn-benchmark on times the algorithms on the GPU, which no plan can: --cudnn-benchmark off runs "
         "the heuristic's choice";
  return s;
}

}  // namespace minidl::harness
