// safetensors I/O: the one file format minidl reads and writes for tensors, model weights and
// optimizer state, chosen because PyTorch and torchvision checkpoints convert to it losslessly and
// its loader can be made safe on hostile input (a JSON header, then raw little-endian bytes).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace minidl::nn {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;           // contiguous CPU tensors, requires_grad false
  std::map<std::string, std::string> metadata;     // "__metadata__", empty when the file has none
};

// Writes `tensors` (any device, any strides: copied to the CPU and made contiguous) with keys in
// sorted order, the header padded with spaces to a multiple of 8 bytes, and `metadata` as
// "__metadata__" when not empty. Atomic: the bytes go to `path + ".tmp.<pid>"`, are fsynced and
// then renamed over `path`, so a reader never sees a partial file and a failed save leaves an
// existing file untouched. Throws minidl::Error naming the path on any failure.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file. Every bound is checked before anything is allocated or copied, so a
// truncated, corrupt or hostile file throws minidl::Error naming the file and the problem; it
// never crashes and never allocates more than the file's size.
SafetensorsFile load_safetensors(const std::string& path);

namespace detail {

// The validated layout of one tensor in the data section (offsets relative to its start).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;          // sorted by name
  std::map<std::string, std::string> metadata;
};

// Parses and validates the JSON header against a data section of `data_size` bytes: dtypes,
// shapes, byte counts, and offsets that tile the data section exactly. Split out of the loader so
// the fuzzer (fuzz/safetensors_fuzz.cpp) can drive it without files. `path` only names the
// source in error messages.
SafetensorsHeader parse_safetensors_header(std::string_view header, uint64_t data_size,
                                           const std::string& path);

// The format's dtype codes ("F32", "F16", "BOOL", ...).
const char* safetensors_dtype_code(DType t);

}  // namespace detail
}  // namespace minidl::nn
