// Kept as a wrapper (rather than calling nn::load_safetensors from each test) so the golden tests
// stay independent of how the library spells its loader's result type.
#include "tests/support/safetensors_reader.h"

#include <utility>

#include "nn/safetensors.h"

namespace minidl::testing {

std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  if (metadata) *metadata = std::move(file.metadata);
  return std::move(file.tensors);
}

std::string golden_path(const std::string& name) { return std::string(MINIDL_GOLDEN_DIR) + "/" + name; }

}  // namespace minidl::testing
