// Names and identity of a step's work (step.h).
#include "bench/gpumodel/step.h"

namespace minidl::gpumodel {

const char* math_name(Math m) {
  switch (m) {
    case Math::None: return "-";
    case Math::F16Tensor: return "f16 tensor";
    case Math::Tf32Tensor: return "tf32 tensor";
    case Math::Fp32: return "fp32";
    case Math::Fp64: return "fp64";
  }
  return "?";
}

const char* field_name(bool kernel, int f) {
  static const char* const kk[] = {"blocks", "threads", "gld requests", "gld sectors", "gld bytes", "gst requests",
                                   "gst sectors", "gst bytes", "unique sectors read", "unique sectors written",
                                   "shared ld requests", "shared ld wavefronts", "shared st requests",
                                   "shared st wavefronts", "atomics", "barriers", "memory instructions",
                                   "active lanes"};
  static const char* const lk[] = {"flops", "min bytes", "workspace", "dim 0", "dim 1", "dim 2", "dim 3",
                                   "dim 4", "dim 5", "dim 6", "dim 7", "dim 8", "dim 9"};
  static_assert(sizeof(kk) / sizeof(kk[0]) == kKernelFields && sizeof(lk) / sizeof(lk[0]) == kLibFields);
  if (f < 0) return "?";
  return kernel ? (f < kKernelFields ? kk[f] : "?") : (f < kLibFields ? lk[f] : "?");
}

std::string Work::key() const { return kernel.empty() ? op : op + " / " + kernel; }

bool Work::same_site(const Work& o) const {
  return kind == o.kind && op == o.op && kernel == o.kernel && parameters == o.parameters && detail == o.detail &&
         math == o.math && block_threads == o.block_threads && dynamic_smem == o.dynamic_smem &&
         static_smem == o.static_smem && v.size() == o.v.size();
}

}  // namespace minidl::gpumodel
