// Names and identity of a step's work (step.h).
#include "perfmodel/step.h"

#include <cstdio>
#include <istream>
#include <ostream>
#include <sstream>

#include "core/error.h"

namespace minidl::gpumodel {

std::string fmt(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

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

void write_profiles(std::ostream& os, const std::string& label, const std::vector<StepProfile>& profiles) {
  os.precision(17);
  for (const StepProfile& p : profiles) {
    os << "profile " << label << " " << p.batch << " " << p.image << " " << p.work.size() << "\n";
    for (const Work& w : p.work) {
      os << static_cast<int>(w.kind) << " " << static_cast<int>(w.math) << " " << w.block_threads << " "
         << w.dynamic_smem << " " << w.static_smem << " " << w.v.size();
      for (double x : w.v) os << " " << x;
      os << "\t" << w.op << "\t" << w.kernel << "\t" << w.parameters << "\t" << w.detail << "\t" << w.algo << "\t"
         << w.shapes << "\n";
    }
  }
}

std::vector<StepProfile> read_profiles(std::istream& is, const std::string& label) {
  std::vector<StepProfile> out;
  std::string line;
  while (std::getline(is, line)) {
    std::istringstream h(line);
    std::string word, l;
    size_t count = 0;
    StepProfile p;
    if (!(h >> word >> l >> p.batch >> p.image >> count) || word != "profile") continue;
    for (size_t i = 0; i < count; ++i) {
      MINIDL_CHECK(static_cast<bool>(std::getline(is, line)), "gpumodel: a saved profile of ", l, " is cut short");
      std::istringstream ls(line);
      std::string numbers;
      std::getline(ls, numbers, '\t');
      std::istringstream ns(numbers);
      Work w;
      int kind = 0, math = 0;
      size_t nv = 0;
      ns >> kind >> math >> w.block_threads >> w.dynamic_smem >> w.static_smem >> nv;
      w.kind = static_cast<Work::Kind>(kind);
      w.math = static_cast<Math>(math);
      w.v.resize(nv);
      for (double& x : w.v) ns >> x;
      for (std::string* f : {&w.op, &w.kernel, &w.parameters, &w.detail, &w.algo, &w.shapes})
        std::getline(ls, *f, '\t');
      p.work.push_back(std::move(w));
    }
    if (l == label) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace minidl::gpumodel
