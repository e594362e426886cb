// A minimal safetensors reader for the golden files tools/make_golden.py writes, so the C++ tests
// compare against PyTorch without Python. Deliberately independent of nn/'s safetensors I/O: a bug
// there must not be able to hide a bug in the ops the golden tests check.
#pragma once
#include <map>
#include <string>

#include "core/tensor.h"

namespace minidl::testing {

// Every tensor in the file, by name, as contiguous CPU tensors (requires_grad false). When
// `metadata` is given it receives the "__metadata__" map (empty when the file has none).
// Throws minidl::Error naming the file and the problem for anything malformed: a header length
// outside the file, JSON that does not parse, an unknown dtype, offsets outside the data section
// or a byte count that does not match the shape.
std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata = nullptr);

// MINIDL_GOLDEN_DIR "/" name: where the committed golden files live in the source tree.
std::string golden_path(const std::string& name);

}  // namespace minidl::testing
