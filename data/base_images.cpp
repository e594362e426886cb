// The loader's per-sample memory across epochs (data/base_images.h): the RAM cache of base images
// and the unreadable samples.
#include "data/base_images.h"

#include <utility>

#include "data/transform.h"

namespace minidl::data {

BaseImages::BaseImages(std::shared_ptr<const Dataset> ds, const TransformOptions& t, bool cache, int64_t limit_bytes)
    : ds_(std::move(ds)), t_(t), cache_(cache), limit_(limit_bytes) {
  const auto n = static_cast<size_t>(ds_->size());
  bad_ = std::make_unique<std::atomic<uint8_t>[]>(n);
  for (size_t i = 0; i < n; ++i) bad_[i].store(0);
  if (cache_) kept_.resize(n);
}

std::shared_ptr<const Image> BaseImages::get(int64_t idx) {
  const auto i = static_cast<size_t>(idx);
  if (bad_[i].load(std::memory_order_relaxed) != 0) return nullptr;
  if (cache_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_[i]) return kept_[i];
  }
  std::optional<Image> img = ds_->load(idx);
  if (!img) {
    if (bad_[i].exchange(1) == 0) skipped_.fetch_add(1);
    return nullptr;
  }
  auto base = std::make_shared<const Image>(make_base(std::move(*img), t_));
  if (cache_) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto bytes = static_cast<int64_t>(base->pixels.size());
    if (!kept_[i] && kept_bytes_ + bytes <= limit_) {
      kept_[i] = base;
      kept_bytes_ += bytes;
      ++kept_images_;
    }
  }
  return base;
}

std::vector<int64_t> BaseImages::skipped_indices() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < ds_->size(); ++i)
    if (bad_[static_cast<size_t>(i)].load(std::memory_order_relaxed) != 0) out.push_back(i);
  return out;
}

int64_t BaseImages::cached_images() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_images_;
}

int64_t BaseImages::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

}  // namespace minidl::data
