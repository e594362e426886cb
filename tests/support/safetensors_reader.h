// The golden tests' view of safetensors files: thin wrappers over nn::load_safetensors, so the
// files tools/make_golden.py writes are read by the same code users' checkpoints go through (and
// golden_test.cpp exercises that loader on every run), plus where the committed files live.
#pragma once
#include <map>
#include <string>

#include "core/tensor.h"

namespace minidl::testing {

// Every tensor in the file, by name, as contiguous CPU tensors (requires_grad false). When
// `metadata` is given it receives the "__metadata__" map (empty when the file has none).
// Throws minidl::Error naming the file and the problem for anything malformed (see
// nn/safetensors.h).
std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata = nullptr);

// MINIDL_GOLDEN_DIR "/" name: where the committed golden files live in the source tree.
std::string golden_path(const std::string& name);

}  // namespace minidl::testing
