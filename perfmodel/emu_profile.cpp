// The emulated device's counters and call log as a StepProfile (emu_profile.h).
#include "perfmodel/emu_profile.h"

#include "core/error.h"
#include "cuda_emu/call_log.h"
#include "cuda_emu/profiler.h"
#include "kernels/cuda/runtime.h"

namespace minidl::gpumodel {
namespace {

Math math_of(cuda::emu::MathClass m) {
  switch (m) {
    case cuda::emu::MathClass::F16Tensor: return Math::F16Tensor;
    case cuda::emu::MathClass::Tf32Tensor: return Math::Tf32Tensor;
    case cuda::emu::MathClass::Fp32: return Math::Fp32;
    case cuda::emu::MathClass::Fp64: return Math::Fp64;
    case cuda::emu::MathClass::None: break;
  }
  return Math::None;
}

Work kernel_work(const cuda::emu::LaunchCounters& k, const std::string& parameters) {
  Work w;
  w.kind = Work::Kind::Kernel;
  w.op = k.op;
  w.kernel = k.kernel;
  w.parameters = parameters;
  w.block_threads = static_cast<int>(k.block.x * k.block.y * k.block.z);
  w.dynamic_smem = static_cast<int>(k.dynamic_smem);
  w.static_smem = static_cast<int>(k.static_smem);
  w.v.assign(kKernelFields, 0.0);
  auto d = [](uint64_t x) { return static_cast<double>(x); };
  w.v[kBlocks] = d(uint64_t{k.grid.x} * k.grid.y * k.grid.z);
  w.v[kThreads] = d(k.threads);
  w.v[kGldRequests] = d(k.gld_requests);
  w.v[kGldSectors] = d(k.gld_sectors);
  w.v[kGldBytes] = d(k.gld_bytes);
  w.v[kGstRequests] = d(k.gst_requests);
  w.v[kGstSectors] = d(k.gst_sectors);
  w.v[kGstBytes] = d(k.gst_bytes);
  w.v[kUniqueSectorsRead] = d(k.unique_sectors_read);
  w.v[kUniqueSectorsWritten] = d(k.unique_sectors_written);
  w.v[kSharedLdRequests] = d(k.shared_ld_requests);
  w.v[kSharedLdWavefronts] = d(k.shared_ld_wavefronts);
  w.v[kSharedStRequests] = d(k.shared_st_requests);
  w.v[kSharedStWavefronts] = d(k.shared_st_wavefronts);
  w.v[kAtomics] = d(k.atomics);
  w.v[kBarriers] = d(k.barriers);
  w.v[kMemInstructions] = d(k.mem_instructions);
  w.v[kActiveLanes] = d(k.active_lanes);
  return w;
}

Work call_work(const cuda::emu::LibCall& c) {
  Work w;
  const bool copy = c.lib == "runtime";
  w.kind = copy ? Work::Kind::Transfer : Work::Kind::Library;
  w.op = copy ? c.op : c.lib + " " + c.op;
  w.detail = copy ? "" : c.dtype + " " + c.layout;
  w.algo = c.algo;
  w.shapes = c.shapes;
  w.math = math_of(c.math);
  w.v.assign(kLibFields, 0.0);
  w.v[kFlops] = c.flops;
  w.v[kMinBytes] = c.min_bytes;
  w.v[kWorkspace] = static_cast<double>(c.workspace);
  if (copy) w.v[kDims] = c.min_bytes;
  for (size_t i = 0; i < c.dims.size() && i < 10; ++i) w.v[kDims + i] = c.dims[i];
  return w;
}

}  // namespace

StepProfile profile_on_emulator(const std::function<void()>& fn, int64_t batch, int64_t image) {
  namespace emu = cuda::emu;
  MINIDL_CHECK(emu::global_accesses_instrumented(),
               "gpumodel: this program links the emulated device without global-memory counters; link "
               "minidl_emu_prof");
  cuda::synchronize(0);
  emu::clear_profile();
  emu::clear_call_log();
  emu::set_profiling(true);
  emu::set_call_logging(true);
  fn();
  cuda::synchronize(0);
  const std::vector<emu::LaunchCounters>& launches = emu::profile();
  emu::set_profiling(false);
  emu::set_call_logging(false);
  const std::vector<emu::KernelRun>& runs = emu::kernel_runs();
  const std::vector<emu::LibCall>& calls = emu::call_log();
  MINIDL_CHECK(launches.size() == runs.size(), "gpumodel: the profiler counted ", launches.size(),
               " launches, the call log ", runs.size(), " kernel runs");
  StepProfile p;
  p.batch = batch;
  p.image = image;
  size_t j = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    for (; j < calls.size() && calls[j].kernels_before <= i; ++j)
      if (calls[j].op != "memcpy HtoH") p.work.push_back(call_work(calls[j]));
    MINIDL_CHECK(runs[i].kernel == launches[i].kernel, "gpumodel: launch ", i, " is ", launches[i].kernel,
                 " in the profile but ", runs[i].kernel, " in the call log");
    p.work.push_back(kernel_work(launches[i], *runs[i].parameters));
  }
  for (; j < calls.size(); ++j)
    if (calls[j].op != "memcpy HtoH") p.work.push_back(call_work(calls[j]));
  return p;
}

}  // namespace minidl::gpumodel
