// What a loader keeps across epochs about its samples: the base images (decoded and brought to
// their deterministic size, TransformOptions' resize; data/transform.h) held in RAM up to a byte
// limit, and the samples found unreadable, which every later epoch skips without reading them.
// Split from the loader's pipeline (data/loader.cpp), which only asks it for a sample's base image
// from any worker thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"

namespace minidl::data {

class BaseImages {
 public:
  // cache: keep base images until they hold limit_bytes of pixels (later ones are made every time).
  BaseImages(std::shared_ptr<const Dataset> ds, const TransformOptions& t, bool cache, int64_t limit_bytes);

  // Dataset sample idx's base image, kept or made now; null when the sample is unreadable (found
  // so once, it is not read again). Thread-safe.
  std::shared_ptr<const Image> get(int64_t idx);

  int64_t skipped() const { return skipped_.load(); }   // samples found unreadable so far
  std::vector<int64_t> skipped_indices() const;          // the same, sorted
  int64_t cached_images() const;
  int64_t cached_bytes() const;

 private:
  std::shared_ptr<const Dataset> ds_;
  TransformOptions t_;
  bool cache_;
  int64_t limit_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const Image>> kept_;
  int64_t kept_bytes_ = 0, kept_images_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> bad_;
  std::atomic<int64_t> skipped_{0};
};

}  // namespace minidl::data
