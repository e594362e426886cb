// The shared reading of the end-to-end golden (see e2e_golden.h).
#include "tests/support/e2e_golden.h"

#include <unistd.h>

#include <atomic>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/support/golden_weights.h"
#include "tests/support/safetensors_reader.h"

namespace minidl::e2e {

namespace fs = std::filesystem;

namespace {

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

// The script's sample positions: an LCG, index = (x >> 33) % n.
std::vector<size_t> sample_positions(size_t n, size_t count) {
  std::vector<size_t> out;
  uint64_t x = 0;
  for (size_t i = 0; i < count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(static_cast<size_t>((x >> 33) % n));
  }
  return out;
}

}  // namespace

const Tensor& Golden::at(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) throw std::runtime_error("e2e golden: no entry '" + key + "' (rerun tools/make_golden_e2e.py?)");
  return it->second;
}

fs::path golden_dir() { return fs::path(testing::golden_path("e2e")); }

const Golden& golden() {
  static const Golden g = [] {
    Golden r;
    r.tensors = testing::read_safetensors((golden_dir() / "e2e.safetensors").string(), &r.metadata);
    return r;
  }();
  return g;
}

fs::path photos_dir() { return fs::path(MINIDL_SHARED_DATA_DIR) / "catsdogs"; }

bool photos_present() {
  for (const std::string& rel : photo_list()) {
    if (!fs::exists(photos_dir() / rel)) return false;
  }
  return true;
}

std::vector<std::string> photo_list() {
  std::vector<std::string> out;
  std::stringstream in(golden().metadata.at("photos"));
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

fs::path photo_folder() {
  static std::atomic<int> counter{0};
  const fs::path dir = fs::temp_directory_path() /
                       ("minidl-e2e-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1)));
  fs::remove_all(dir);
  for (const std::string& rel : photo_list()) {
    const fs::path target = dir / rel;
    fs::create_directories(target.parent_path());
    fs::create_symlink(photos_dir() / rel, target);
  }
  return dir;
}

void expect_image(const Golden& g, const std::string& prefix, const data::Image& img) {
  const auto shape = g.at(prefix + ".shape").to_vector();
  ASSERT_EQ(shape.size(), 3u);
  ASSERT_EQ(static_cast<double>(img.height), shape[0]) << "stage '" << prefix << "': height";
  ASSERT_EQ(static_cast<double>(img.width), shape[1]) << "stage '" << prefix << "': width";
  ASSERT_EQ(static_cast<double>(img.pixels.size()), shape[0] * shape[1] * shape[2]);
  if (g.tensors.count(prefix + ".pixels") != 0) {
    const Tensor& t = g.at(prefix + ".pixels");
    const std::vector<uint8_t> ref(t.data<uint8_t>(), t.data<uint8_t>() + t.numel());
    size_t differ = 0;
    int worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const int d = std::abs(static_cast<int>(ref[i]) - static_cast<int>(img.pixels[i]));
      differ += d != 0;
      worst = std::max(worst, d);
    }
    EXPECT_EQ(differ, 0u) << "stage '" << prefix << "' differs from Pillow in " << differ << " of " << ref.size()
                          << " values (max |diff| " << worst << ")";
    return;
  }
  const auto hash = static_cast<uint64_t>(g.at(prefix + ".fnv1a").data<int64_t>()[0]);
  if (fnv1a64(img.pixels) == hash) return;
  const Tensor& st = g.at(prefix + ".samples");
  const std::vector<uint8_t> samples(st.data<uint8_t>(), st.data<uint8_t>() + st.numel());
  const auto pos = sample_positions(img.pixels.size(), samples.size());
  size_t differ = 0;
  int worst = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int d = std::abs(static_cast<int>(samples[i]) - static_cast<int>(img.pixels[pos[i]]));
    differ += d != 0;
    worst = std::max(worst, d);
  }
  ADD_FAILURE() << "stage '" << prefix << "' differs from the reference (FNV-1a hash mismatch); " << differ << " of "
                << samples.size() << " sampled values differ, max |diff| " << worst;
}

std::map<std::string, Tensor> golden_weights_of(const nn::Module& m) { return testing::golden_weights(m); }

}  // namespace minidl::e2e
