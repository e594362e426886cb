// The end-to-end golden of tools/make_golden_e2e.py as the tests read it: the file, the photos it
// was made from (../shared/data/catsdogs, absent on a user's machine), and the image comparison
// (exact pixels for the committed format files, a hash plus samples for the photos, whose pixels
// the repository must not hold). Used by tests/e2e and by the minidl-train check in
// tests/experiments.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"
#include "nn/module.h"

namespace minidl::e2e {

constexpr int64_t kSize = 64;  // the golden's image size (SIZE in the script)
inline constexpr const char* kNoPhotos =
    "../shared/data/catsdogs is absent: the end-to-end golden's photo stages need the shared photos";

struct Golden {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  const Tensor& at(const std::string& key) const;  // fails with the key when it is missing
};

const Golden& golden();                 // tests/golden/e2e/e2e.safetensors, read once
std::filesystem::path golden_dir();     // tests/golden/e2e
std::filesystem::path photos_dir();     // ../shared/data/catsdogs
bool photos_present();
std::vector<std::string> photo_list();  // "cat/cat.1.jpg", ... in the golden's order

// A fresh temporary folder with cat/ and dog/ holding links to the golden's photos (a dataset in
// the class-folder layout, as a user would point --data at).
std::filesystem::path photo_folder();

// Compares img with the golden's "<prefix>.shape" and ".pixels" (exactly) or ".fnv1a" (exactly,
// with ".samples" telling by how much it differs) through gtest expectations naming the stage.
void expect_image(const Golden& g, const std::string& prefix, const data::Image& img);

// The script's deterministic weights for every entry of m's state_dict.
std::map<std::string, Tensor> golden_weights_of(const nn::Module& m);

}  // namespace minidl::e2e
