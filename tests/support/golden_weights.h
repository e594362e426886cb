// The deterministic "random-looking" weights that the PyTorch golden generators load
// (golden_value() in tools/make_golden_resnet.py, also used by tools/make_golden_e2e.py): an
// integer hash exact in both languages, so C++ tests rebuild the same weights without a file.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "nn/module.h"

namespace minidl::testing {

// hash_unit() of tools/make_golden_resnet.py: an integer hash of (index, salt) mapped to [-1, 1).
double hash_unit(uint32_t i, uint32_t salt);

// golden_value() for every entry of m's state_dict, keyed as the state_dict (keep the two in sync).
std::map<std::string, Tensor> golden_weights(const nn::Module& m);

}  // namespace minidl::testing
