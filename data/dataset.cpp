// Datasets of image files in the three cats-vs-dogs layouts, the lazily generated synthetic set
// and subsets. Files are decoded on demand (by loader workers, concurrently); a bad file is
// reported once by path on stderr and then only skipped.
#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "core/error.h"
#include "data/decode.h"
#include "data/synthetic.h"

namespace minidl::data {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_image_name(const fs::path& p) {
  static const std::set<std::string> kExt = {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp",
                                              ".gif", ".ppm", ".pgm", ".pnm", ".tga"};
  return kExt.count(lower(p.extension().string())) > 0;
}

bool hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }

std::vector<fs::path> images_in(const fs::path& dir, bool recursive) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (recursive) {
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file() && is_image_name(it->path())) out.push_back(it->path());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir, fs::directory_options::skip_permission_denied, ec)) {
      if (!hidden(e.path()) && e.is_regular_file() && is_image_name(e.path())) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<fs::path> subdirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, fs::directory_options::skip_permission_denied, ec)) {
    if (!hidden(e.path()) && e.is_directory()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Kaggle's flat names: "<class>.<anything>.<ext>", e.g. cat.123.jpg.
std::string flat_label(const fs::path& p) {
  const std::string name = p.filename().string();
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string::npos || name.find('.', dot + 1) == std::string::npos) return "";
  return lower(name.substr(0, dot));
}

class FolderDataset final : public Dataset {
 public:
  FolderDataset(fs::path root, std::string layout, std::vector<std::string> classes, std::vector<fs::path> files,
                std::vector<int64_t> labels)
      : root_(std::move(root)), layout_(std::move(layout)), classes_(std::move(classes)), files_(std::move(files)),
        labels_(std::move(labels)) {}
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  int64_t label(int64_t i) const override { return labels_.at(static_cast<size_t>(i)); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  std::string describe(int64_t i) const override { return files_.at(static_cast<size_t>(i)).string(); }
  std::string key(int64_t i) const override {
    return files_.at(static_cast<size_t>(i)).lexically_relative(root_).generic_string();
  }
  SampleCheck check(int64_t i) const override {
    const DecodeResult r = decode_file(files_.at(static_cast<size_t>(i)));
    return SampleCheck{r.ok(), r.error, r.note};
  }
  SampleCheck probe(int64_t i) const override {
    std::string why = probe_file(files_.at(static_cast<size_t>(i)));
    return SampleCheck{why.empty(), std::move(why), ""};
  }
  std::optional<Image> load(int64_t i) const override {
    DecodeResult r = decode_file(files_.at(static_cast<size_t>(i)));
    if (r.ok()) return std::move(r.image);
    std::lock_guard<std::mutex> lock(mu_);
    if (reported_.insert(i).second) {
      std::cerr << "minidl data: skipping " << describe(i) << ": " << r.error << "\n";
    }
    return std::nullopt;
  }
  const std::string& layout() const { return layout_; }

 private:
  fs::path root_;
  std::string layout_;
  std::vector<std::string> classes_;
  std::vector<fs::path> files_;
  std::vector<int64_t> labels_;
  mutable std::mutex mu_;
  mutable std::set<int64_t> reported_;
};

std::shared_ptr<FolderDataset> from_class_folders(const fs::path& root, const std::string& layout) {
  std::vector<std::string> classes;
  std::vector<fs::path> files;
  std::vector<int64_t> labels;
  for (const fs::path& d : subdirs(root)) {
    std::vector<fs::path> imgs = images_in(d, true);
    if (imgs.empty()) continue;
    const auto label = static_cast<int64_t>(classes.size());
    classes.push_back(d.filename().string());
    for (auto& f : imgs) {
      files.push_back(std::move(f));
      labels.push_back(label);
    }
  }
  if (classes.empty()) return nullptr;
  return std::make_shared<FolderDataset>(root, layout, std::move(classes), std::move(files), std::move(labels));
}

std::shared_ptr<FolderDataset> from_flat(const fs::path& root) {
  const std::vector<fs::path> imgs = images_in(root, false);
  std::map<std::string, std::vector<fs::path>> by_class;
  for (const fs::path& f : imgs) {
    const std::string l = flat_label(f);
    if (!l.empty()) by_class[l].push_back(f);
  }
  if (by_class.empty()) return nullptr;
  size_t matched = 0;
  for (const auto& [c, v] : by_class) matched += v.size();
  if (matched < imgs.size()) {
    std::cerr << "minidl data: " << root.string() << ": ignoring " << imgs.size() - matched
              << " images whose names are not <class>.<n>.<ext>\n";
  }
  std::vector<std::string> classes;
  std::vector<fs::path> files;
  std::vector<int64_t> labels;
  for (auto& [c, v] : by_class) {  // std::map: sorted class names
    const auto label = static_cast<int64_t>(classes.size());
    classes.push_back(c);
    for (auto& f : v) {
      files.push_back(std::move(f));
      labels.push_back(label);
    }
  }
  return std::make_shared<FolderDataset>(root, "Kaggle flat", std::move(classes), std::move(files), std::move(labels));
}

// Renders lazily and memoises the 8-bit images (up to kMemoBytes) in the dataset itself, so every
// loader built on it (one per batch size in a study) renders each image once per process.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t n, int64_t size, uint64_t seed, double difficulty)
      : r_(n, size, seed, difficulty), memo_(static_cast<size_t>(n)) {}
  int64_t size() const override { return r_.count(); }
  int64_t label(int64_t i) const override { return r_.label(i); }
  const std::vector<std::string>& class_names() const override { return classes_; }
  std::string describe(int64_t i) const override { return "synthetic #" + std::to_string(i); }
  std::optional<Image> load(int64_t i) const override {
    MINIDL_CHECK(i >= 0 && i < size(), "synthetic dataset: index ", i, " out of range [0, ", size(), ")");
    const int64_t s = r_.image_size();
    Image img;
    img.height = s;
    img.width = s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (const auto& m = memo_[static_cast<size_t>(i)]) {
        img.pixels = *m;
        return img;
      }
    }
    img.pixels = render(i);
    std::lock_guard<std::mutex> lock(mu_);
    auto& m = memo_[static_cast<size_t>(i)];
    const auto bytes = static_cast<int64_t>(img.pixels.size());
    if (!m && memo_bytes_ + bytes <= kMemoBytes) {
      m = std::make_shared<const std::vector<uint8_t>>(img.pixels);
      memo_bytes_ += bytes;
    }
    return img;
  }

 private:
  static constexpr int64_t kMemoBytes = int64_t{1} << 30;

  std::vector<uint8_t> render(int64_t i) const {
    const int64_t s = r_.image_size();
    std::vector<float> f(static_cast<size_t>(3 * s * s));
    r_.render(i, f.data());
    // Quantisation: the float images are roughly zero-mean with |v| < 3, so v -> 127.5 + 42.5 v
    // keeps +-3 (clamped beyond) in 8 bits, a step of 0.024, well under the pixel noise (>= 0.15).
    std::vector<uint8_t> px(static_cast<size_t>(3 * s * s));
    const int64_t plane = s * s;
    for (int64_t p = 0; p < plane; ++p) {
      for (int64_t c = 0; c < 3; ++c) {
        const float v = 127.5f + 42.5f * f[static_cast<size_t>(c * plane + p)];
        px[static_cast<size_t>(p * 3 + c)] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
    return px;
  }

  SyntheticRenderer r_;
  std::vector<std::string> classes_{"class0", "class1"};
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const std::vector<uint8_t>>> memo_;
  mutable int64_t memo_bytes_ = 0;
};

class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> idx) : base_(std::move(base)), idx_(std::move(idx)) {
    MINIDL_CHECK(base_ != nullptr, "subset: the base dataset is null");
    for (int64_t i : idx_) {
      MINIDL_CHECK(i >= 0 && i < base_->size(), "subset: index ", i, " out of range [0, ", base_->size(), ")");
    }
  }
  int64_t size() const override { return static_cast<int64_t>(idx_.size()); }
  int64_t label(int64_t i) const override { return base_->label(at(i)); }
  const std::vector<std::string>& class_names() const override { return base_->class_names(); }
  std::optional<Image> load(int64_t i) const override { return base_->load(at(i)); }
  std::string describe(int64_t i) const override { return base_->describe(at(i)); }
  std::string key(int64_t i) const override { return base_->key(at(i)); }
  SampleCheck check(int64_t i) const override { return base_->check(at(i)); }
  SampleCheck probe(int64_t i) const override { return base_->probe(at(i)); }
  const Dataset& base() const { return *base_; }

 private:
  int64_t at(int64_t i) const {
    MINIDL_CHECK(i >= 0 && i < size(), "subset: index ", i, " out of range [0, ", size(), ")");
    return idx_[static_cast<size_t>(i)];
  }
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> idx_;
};

}  // namespace

SampleCheck Dataset::check(int64_t i) const {
  return load(i) ? SampleCheck{true, "", ""} : SampleCheck{false, "unreadable", ""};
}

SampleCheck Dataset::probe(int64_t) const { return SampleCheck{true, "", ""}; }

std::shared_ptr<Dataset> open_image_folder(const fs::path& root) {
  MINIDL_CHECK(fs::is_directory(root), "open_image_folder: ", root.string(), " is not a folder");
  // Kaggle flat: images named <class>.<n>.<ext> directly in the folder, or in its train/.
  if (!images_in(root, false).empty()) {
    if (auto d = from_flat(root)) return d;
    MINIDL_FAIL("open_image_folder: ", root.string(), " holds images whose names are not <class>.<n>.<ext> "
                "(the Kaggle flat layout); put them in one folder per class instead");
  }
  if (fs::is_directory(root / "PetImages")) {
    if (auto d = from_class_folders(root / "PetImages", "PetImages")) return d;
  }
  if (root.filename() == "PetImages") {
    if (auto d = from_class_folders(root, "PetImages")) return d;
  }
  if (fs::is_directory(root / "train") && !images_in(root / "train", false).empty()) {
    if (auto d = from_flat(root / "train")) return d;
  }
  if (auto d = from_class_folders(root, "class folders")) return d;
  MINIDL_FAIL("open_image_folder: no images found in ", root.string(), "; tried the layouts: one folder per class "
              "(root/<class>/*.jpg), Kaggle flat (root/cat.1.jpg or root/train/cat.1.jpg), Microsoft "
              "PetImages (root/PetImages/Cat/1.jpg); extensions: jpg jpeg png bmp gif ppm pgm tga");
}

std::string layout_of(const Dataset& d) {
  if (const auto* f = dynamic_cast<const FolderDataset*>(&d)) return f->layout();
  if (const auto* s = dynamic_cast<const SubsetDataset*>(&d)) return layout_of(s->base());
  return "";
}

std::shared_ptr<Dataset> synthetic_dataset(int64_t n, int64_t image_size, uint64_t seed, double difficulty) {
  return std::make_shared<SyntheticDataset>(n, image_size, seed, difficulty);
}

std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices) {
  return std::make_shared<SubsetDataset>(std::move(base), std::move(indices));
}

}  // namespace minidl::data
