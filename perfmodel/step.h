// A training step as the model sees it: the work the emulated device ran, in stream order, one
// entry per kernel launch, cuDNN / cuBLAS call or runtime copy, with its counters as numbers the
// extrapolation can scale from small shapes to the requested one (extrapolate.h).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace minidl::gpumodel {

// The peak a library call's FLOPs run at (mirrors cuda_emu/call_log.h's MathClass, which
// this library does not include: it builds without the emulated device).
enum class Math { None, F16Tensor, Tf32Tensor, Fp32, Fp64 };
const char* math_name(Math m);

// Per-launch counters of a kernel (Nsight Compute's meanings; cuda_emu/profiler.h).
enum KernelField {
  kBlocks, kThreads,
  kGldRequests, kGldSectors, kGldBytes, kGstRequests, kGstSectors, kGstBytes,
  kUniqueSectorsRead, kUniqueSectorsWritten,
  kSharedLdRequests, kSharedLdWavefronts, kSharedStRequests, kSharedStWavefronts,
  kAtomics, kBarriers, kMemInstructions, kActiveLanes,
  kKernelFields
};
// A library call or copy: FLOPs, the fewest bytes it can move, its workspace, its geometry.
enum LibField { kFlops, kMinBytes, kWorkspace, kDims, kLibFields = kDims + 10 };
const char* field_name(bool kernel, int field);

struct Work {
  enum class Kind { Kernel, Library, Transfer };
  Kind kind = Kind::Kernel;
  std::string op;           // MINIDL_LAUNCH's op (or the launch scope's); "cuDNN conv forward"; "memcpy DtoH"
  std::string kernel;       // the kernel text "(apply_kernel<T>)"; "" for a library call or copy
  std::string parameters;   // a kernel's parameter types: which nvcc instantiation ran
  std::string detail;       // a library call's dtype and layout; a copy's nothing
  std::string algo;         // a library call's algorithm (not matched across sizes: it may change)
  std::string shapes;       // a library call's shapes at the size it ran (rebuilt from the dims at the target)
  Math math = Math::None;
  int block_threads = 0;    // a kernel's block, and its shared memory per block
  int dynamic_smem = 0;
  int static_smem = 0;
  std::vector<double> v;    // kKernelFields or kLibFields numbers

  std::string key() const;   // what the tables group by: "op / kernel", or the library op
  bool same_site(const Work& o) const;   // the same launch site and configuration (for matching sizes)
};

struct StepProfile {
  int64_t batch = 0;
  int64_t image = 0;        // image side, pixels
  std::vector<Work> work;   // in stream order
};

// One number formatted as printf would ("%.2f"): the tables' cells.
std::string fmt(const char* format, double v);

// A plain-text form of profiles, so the slow emulated runs can be kept and costed again after a
// change of the model (minidl-gpumodel --save-profiles / --load-profiles): per profile a header
// line "profile LABEL BATCH IMAGE COUNT", then one line per work item, numbers first, strings
// tab-separated.
void write_profiles(std::ostream& os, const std::string& label, const std::vector<StepProfile>& profiles);
// The profiles saved under `label`, in the order written; empty when there are none.
std::vector<StepProfile> read_profiles(std::istream& is, const std::string& label);

}  // namespace minidl::gpumodel
