// distributed_compare_weights A B [RTOL]: compares two safetensors files tensor by tensor, for the
// programs' tests (tests/distributed/programs_test.sh): the same names, shapes and dtypes, and every
// element within RTOL relative to the tensor's largest magnitude (0: bit-identical). Prints the
// worst tensor and exits 0 when they match, 1 when not, 2 on a usage error.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/tensor.h"
#include "nn/safetensors.h"

using namespace minidl;

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: distributed_compare_weights A.safetensors B.safetensors [RTOL]\n");
    return 2;
  }
  const double rtol = argc == 4 ? std::atof(argv[3]) : 0.0;
  const auto a = nn::load_safetensors(argv[1]).tensors;
  const auto b = nn::load_safetensors(argv[2]).tensors;
  bool same = a.size() == b.size();
  if (!same) std::printf("%zu tensors in %s, %zu in %s\n", a.size(), argv[1], b.size(), argv[2]);
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [name, ta] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.shape() != ta.shape() || it->second.dtype() != ta.dtype()) {
      std::printf("%s: missing or of another shape or dtype in %s\n", name.c_str(), argv[2]);
      same = false;
      continue;
    }
    if (rtol == 0.0) {
      if (std::memcmp(ta.data_ptr(), it->second.data_ptr(), ta.nbytes()) != 0) {
        std::printf("%s: differs (bit-identical asked)\n", name.c_str());
        same = false;
      }
      continue;
    }
    const Tensor x = ta.to(DType::f64).contiguous(), y = it->second.to(DType::f64).contiguous();
    const double* px = x.data<double>();
    const double* py = y.data<double>();
    double scale = 0.0, diff = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      scale = std::max(scale, std::fabs(px[i]));
      diff = std::max(diff, std::fabs(px[i] - py[i]));
    }
    const double rel = scale > 0 ? diff / scale : diff;
    if (rel > worst) worst = rel, worst_name = name;
  }
  if (rtol > 0.0) {
    std::printf("largest relative difference %.3g (%s), tolerance %.3g\n", worst, worst_name.c_str(), rtol);
    same = same && worst <= rtol;
  }
  std::printf("%s\n", same ? "same" : "DIFFERENT");
  return same ? 0 : 1;
}
