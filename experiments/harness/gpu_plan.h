// Planning for a GPU from any machine: minidl-memest and minidl-maxbatch with --gpu NAME (or a
// memory size) run their dry run on the shape-only device standing for a GPU, with that GPU's
// memory as the budget, on a machine that has no GPU at all (a laptop, a CI runner), before the
// GPU is rented. No real step runs: the answer is the dry run's, and says so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

struct GpuSpec {
  std::string name;           // "h100", or the size as given ("24GiB")
  std::string description;    // "NVIDIA H100 80GB HBM3"
  int64_t total_bytes = 0;    // the device's memory as the driver reports it (nvidia-smi's total)
};

// The named GPUs --gpu knows, in --help's order.
const std::vector<GpuSpec>& known_gpus();
// --gpu: a name of known_gpus() (case-insensitive) or a memory size (24GiB, 16000MiB); throws
// UsageError naming the choices.
GpuSpec parse_gpu(const std::string& s);

// What the CUDA context, cuBLAS's and cuDNN's handles and the kernels' code take of a GPU's memory
// before the caching allocator gets any: an assumption of the plan (the programs print it), since
// it varies with the driver, the CUDA version and the libraries loaded.
constexpr int64_t kCudaContextBytes = int64_t{768} << 20;

// The budget a plan for c.gpu uses: --memory-budget when given (it must fit the GPU), else the
// GPU's memory less kCudaContextBytes. Throws UsageError for a --gpu without --device cuda.
int64_t plan_budget(const TrainConfig& c);

// The first lines of a plan's report: the GPU, its budget, and the assumptions a plan makes that a
// run on the GPU itself would not (cuDNN's algorithms chosen without cuDNN).
std::string plan_assumptions(const TrainConfig& c);

}  // namespace minidl::harness
