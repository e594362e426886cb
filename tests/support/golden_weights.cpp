// The C++ half of the golden generators' deterministic weights (see golden_weights.h).
#include "tests/support/golden_weights.h"

#include <cmath>
#include <vector>

#include "core/ops.h"

namespace minidl::testing {

double hash_unit(uint32_t i, uint32_t salt) {
  uint32_t h = i * 2654435761u + salt * 40503u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  h *= 3266489917u;
  h ^= h >> 16;
  return static_cast<double>(h) / 4294967296.0 * 2.0 - 1.0;
}

std::map<std::string, Tensor> golden_weights(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [key, t] : m.ordered_state_dict()) {
    const int64_t n = t.numel();
    auto ends = [&](const std::string& s) {
      return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
    };
    std::vector<double> v(static_cast<size_t>(n), 0.0);
    if (!ends("num_batches_tracked")) {
      for (int64_t i = 0; i < n; ++i) {
        const double b = hash_unit(static_cast<uint32_t>(i), static_cast<uint32_t>(key.size()));
        double x;
        if (t.dim() >= 2) {
          x = b * std::sqrt(6.0 / static_cast<double>(n / t.size(0)));
        } else if (ends("running_var")) {
          x = 1.0 + 0.5 * b * b;
        } else if (ends("running_mean")) {
          x = 0.1 * b;
        } else if (ends(".weight")) {
          x = 1.0 + 0.1 * b;
        } else {
          x = 0.1 * b;
        }
        v[static_cast<size_t>(i)] = x;
      }
    }
    out[key] = from_vector(v, t.shape(), {.dtype = t.dtype()});
  }
  return out;
}

}  // namespace minidl::testing
