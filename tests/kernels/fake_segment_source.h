// The host-memory fake device behind the caching allocator's tests (caching_allocator_test.cpp,
// caching_allocator_pool_test.cpp): it records every raw allocation and can refuse like a full
// device, so CI checks the allocator's logic without a GPU.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "kernels/caching_allocator.h"

namespace minidl::testing {

struct FakeDevice {
  size_t capacity = 0;   // 0: unlimited
  size_t in_use = 0;
  int syncs = 0;
  std::map<void*, size_t> segments;
};

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(FakeDevice* d) : d_(d) {}
  void* raw_alloc(size_t bytes) override {
    if (d_->capacity > 0 && d_->in_use + bytes > d_->capacity) return nullptr;
    void* p = std::malloc(bytes);
    d_->segments[p] = bytes;
    d_->in_use += bytes;
    return p;
  }
  void raw_free(void* p, size_t bytes) override {
    auto it = d_->segments.find(p);
    ASSERT_NE(it, d_->segments.end()) << "raw_free of a pointer the fake never gave out";
    ASSERT_EQ(it->second, bytes) << "raw_free with the wrong size";
    d_->in_use -= bytes;
    d_->segments.erase(it);
    std::free(p);
  }
  void synchronize() override { ++d_->syncs; }

 private:
  FakeDevice* d_;
};

struct AllocatorFixture {
  FakeDevice dev;
  CachingAllocator alloc{std::make_unique<FakeSource>(&dev), Device::cuda(0)};
};

constexpr size_t MiB = size_t{1} << 20;

}  // namespace minidl::testing
