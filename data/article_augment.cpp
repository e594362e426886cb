// The article's offline augmentation as a dataset view (see article_augment.h): each sample is
// computed when the loader asks for it, from the base image, so nothing is written to disk.
#include "data/article_augment.h"

#include <algorithm>
#include <cmath>

#include "data/resize.h"
#include "data/transform.h"

namespace minidl::data {

namespace {

class ArticleAugmented final : public Dataset {
 public:
  ArticleAugmented(std::shared_ptr<const Dataset> base, TransformOptions load)
      : base_(std::move(base)), load_(std::move(load)) {
    MINIDL_CHECK(base_ != nullptr, "article_augmented: the base dataset is null");
    MINIDL_CHECK(load_.augment == Augment::None, "article_augmented: the load transform must be deterministic "
                 "(Augment::None); the article augments once, before training");
  }
  int64_t size() const override { return 2 * base_->size(); }
  int64_t label(int64_t i) const override { return base_->label(at(i)); }
  const std::vector<std::string>& class_names() const override { return base_->class_names(); }
  std::optional<Image> load(int64_t i) const override {
    std::optional<Image> decoded = base_->load(at(i));
    if (!decoded) return std::nullopt;
    const int64_t s = load_.size;
    Image loaded{s, s, std::vector<uint8_t>(static_cast<size_t>(s * s * 3))};
    apply_transform(make_base(std::move(*decoded), load_), load_, 0, 0, loaded.pixels.data());
    if (i < base_->size()) return loaded;
    return article_crop(loaded);
  }
  std::string describe(int64_t i) const override { return base_->describe(at(i)) + suffix(i); }
  std::string key(int64_t i) const override { return base_->key(at(i)) + suffix(i); }
  SampleCheck check(int64_t i) const override { return base_->check(at(i)); }

 private:
  int64_t at(int64_t i) const {
    MINIDL_CHECK(i >= 0 && i < size(), "article_augmented: index ", i, " out of range [0, ", size(), ")");
    return i % base_->size();
  }
  std::string suffix(int64_t i) const { return i < base_->size() ? "" : " (article crop)"; }
  std::shared_ptr<const Dataset> base_;
  TransformOptions load_;
};

}  // namespace

Image article_crop(const Image& loaded) {
  const int64_t s = loaded.height;
  MINIDL_CHECK(s > 0 && loaded.width == s && static_cast<int64_t>(loaded.pixels.size()) == s * s * 3,
               "article_crop: expects a loaded square RGB image, got ", loaded.height, "x", loaded.width);
  // 250 for the article's 200; Python's round() for other sizes (half to even).
  const auto r = static_cast<int64_t>(std::nearbyint(static_cast<double>(s) * 250.0 / 200.0));
  std::vector<uint8_t> big(static_cast<size_t>(r * r * 3));
  resize_rgb(loaded.pixels.data(), s, s, s * 3, big.data(), r, r, ResampleFilter::Bicubic);
  Image out{s, s, std::vector<uint8_t>(static_cast<size_t>(s * s * 3))};
  for (int64_t y = 0; y < s; ++y)
    std::copy_n(big.data() + y * r * 3, s * 3, out.pixels.data() + y * s * 3);
  return out;
}

std::shared_ptr<Dataset> article_augmented(std::shared_ptr<const Dataset> base, TransformOptions load) {
  return std::make_shared<ArticleAugmented>(std::move(base), std::move(load));
}

}  // namespace minidl::data
