// The cuDNN plan cache's bound (kernels/cuda/plan_cache.h): least recently used keys leave first,
// so the keys of the step just run survive any number of other shapes planned before it, as a
// CUDA-graph capture after its warm-up step needs. Plain C++: runs in every build.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kernels/cuda/plan_cache.h"

namespace minidl::cuda {
namespace {

TEST(PlanCache, KeepsTheFirstValueOfAKeyAndFindsIt) {
  PlanCache<std::string, int> c;
  EXPECT_EQ(c.find("a"), nullptr);
  EXPECT_EQ(c.insert("a", 1), 1);
  EXPECT_EQ(c.insert("a", 2), 1) << "a value made twice by racing threads keeps the first";
  ASSERT_NE(c.find("a"), nullptr);
  EXPECT_EQ(*c.find("a"), 1);
  EXPECT_EQ(c.size(), 1u);
  c.clear();
  EXPECT_EQ(c.find("a"), nullptr);
  EXPECT_EQ(c.size(), 0u);
}

// A warm-up step planned its shapes, then a search planned many more: past the bound the oldest
// unused keys leave, one at a time, and the step's keys, used again since, stay.
TEST(PlanCache, PastTheBoundTheLeastRecentlyUsedKeysLeave) {
  constexpr size_t kBound = 8;
  PlanCache<int, std::shared_ptr<int>> c;
  for (int k = 0; k < 4; ++k) c.insert(k, std::make_shared<int>(k), kBound);   // the step's shapes
  for (int k = 100; k < 104; ++k) c.insert(k, std::make_shared<int>(k), kBound);
  EXPECT_EQ(c.size(), kBound);
  for (int k = 0; k < 4; ++k) ASSERT_NE(c.find(k), nullptr);   // the step runs again: used last
  for (int k = 200; k < 204; ++k) c.insert(k, std::make_shared<int>(k), kBound);
  EXPECT_EQ(c.size(), kBound) << "never more than the bound";
  for (int k = 0; k < 4; ++k) {
    ASSERT_NE(c.find(k), nullptr) << "key " << k << " of the step left before older ones";
    EXPECT_EQ(**c.find(k), k);
  }
  for (int k = 100; k < 104; ++k) EXPECT_EQ(c.find(k), nullptr) << "key " << k << ", unused the longest, stayed";
  for (int k = 200; k < 204; ++k) EXPECT_NE(c.find(k), nullptr);
  // Inserting a key that is there moves it to the front without evicting anything.
  c.insert(200, std::make_shared<int>(-1), kBound);
  EXPECT_EQ(**c.find(200), 200);
  EXPECT_EQ(c.size(), kBound);
  // No bound: nothing leaves.
  PlanCache<int, int> all;
  for (int k = 0; k < 5000; ++k) all.insert(k, k);
  EXPECT_EQ(all.size(), 5000u);
}

}  // namespace
}  // namespace minidl::cuda
