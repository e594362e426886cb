// The shape-only device (kernels/meta): tensors without storage, ops that compute nothing, and an
// allocator model whose statistics equal the real allocator's for the same work. Each case runs
// the same function on the CPU and on meta:cpu and compares the peaks the two allocators saw.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/caching_allocator.h"

namespace minidl {
namespace {

struct Peaks {
  int64_t allocated = 0, reserved = 0, left = 0;
};

// The peaks of fn above what the device held before, and what it left allocated.
Peaks peaks_of(Device d, const std::function<void(Device)>& fn) {
  const MemoryStats before = memory_stats(d);
  reset_peak_stats(d);
  fn(d);
  const MemoryStats after = memory_stats(d);
  return {after.peak_allocated_bytes - before.allocated_bytes, after.peak_reserved_bytes - before.reserved_bytes,
          after.allocated_bytes - before.allocated_bytes};
}

void expect_same_peaks(const std::function<void(Device)>& fn) {
  const Peaks cpu = peaks_of(Device::cpu(), fn);
  const Peaks meta = peaks_of(Device::meta(), fn);
  EXPECT_GT(cpu.allocated, 0);
  EXPECT_EQ(meta.allocated, cpu.allocated) << "peak allocated";
  EXPECT_EQ(meta.reserved, cpu.reserved) << "peak reserved";
  EXPECT_EQ(meta.left, cpu.left) << "allocated after";
}

TEST(MetaDevice, ParsesPrintsAndHasNoData) {
  EXPECT_EQ(Device::parse("meta"), Device::meta(DeviceType::CPU));
  EXPECT_EQ(Device::parse("meta:cuda"), Device::meta(DeviceType::CUDA));
  EXPECT_EQ(Device::meta(DeviceType::CUDA).str(), "meta:cuda");
  EXPECT_FALSE(Device::meta() == Device::meta(DeviceType::CUDA));
  EXPECT_EQ(Device::meta(DeviceType::CUDA).target(), DeviceType::CUDA);
  const MemoryStats before = memory_stats(Device::meta());
  const Tensor t = randn({1000, 1000}, {DType::f32, Device::meta(), false});
  EXPECT_EQ(t.shape(), (Shape{1000, 1000}));
  EXPECT_EQ(memory_stats(Device::meta()).allocated_bytes - before.allocated_bytes, 4000000);
  // Host reads see zeros: a gradient scaler's overflow flag reads "no overflow".
  EXPECT_EQ(sum(t).item(), 0.0);
}

TEST(MetaDevice, BudgetThrowsLikeTheHostAllocator) {
  const Device m = Device::meta();
  set_memory_budget(m, memory_stats(m).reserved_bytes + (1 << 20));
  EXPECT_THROW(empty({1 << 20}, {DType::f32, m, false}), OutOfMemoryError);
  const Tensor fits = empty({1 << 10}, {DType::f32, m, false});
  set_memory_budget(m, 0);
  EXPECT_EQ(fits.nbytes(), 4096u);
}

TEST(MetaDevice, ConvolutionTrainingStepPeaksEqualTheCpu) {
  // Shapes that take each CPU path: row bands, grouped small planes, a pointwise conv, the
  // transposed input gradient (stride 1, O < 128, C >= 16) and the by-channel weight gradient.
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  Conv2dOptions s1;
  s1.padding = {1, 1};
  Conv2dOptions s2;
  s2.stride = {2, 2};
  s2.padding = {1, 1};
  const std::vector<Case> cases = {{{2, 3, 40, 40}, {16, 3, 3, 3}, s1},
                                   {{8, 64, 7, 7}, {128, 64, 3, 3}, s2},
                                   {{4, 32, 14, 14}, {64, 32, 1, 1}, Conv2dOptions{}},
                                   {{2, 32, 20, 20}, {32, 32, 3, 3}, s1},
                                   {{16, 256, 4, 4}, {256, 256, 3, 3}, s1}};
  for (const Case& k : cases) {
    SCOPED_TRACE(shape_str(k.x) + " * " + shape_str(k.w));
    expect_same_peaks([&](Device d) {
      const Tensor x = randn(k.x, {DType::f32, d, true});
      const Tensor w = randn(k.w, {DType::f32, d, true});
      sum(relu(conv2d(x, w, Tensor(), k.o))).backward();
    });
  }
}

TEST(MetaDevice, HalfStagingPeaksEqualTheCpu) {
  expect_same_peaks([](Device d) {
    const Tensor x = randn({4, 8, 12, 12}, {DType::f32, d, true});
    const Tensor w = randn({8, 8, 3, 3}, {DType::f32, d, true});
    Conv2dOptions o;
    o.padding = {1, 1};
    const Tensor y = conv2d(x.to(DType::f16), w.to(DType::f16), Tensor(), o);
    const Tensor p = max_pool2d(y, Pool2dOptions{{2, 2}, {2, 2}, {0, 0}});
    sum(p.to(DType::f32)).backward();
  });
}

TEST(MetaDevice, StridedMatmulCopiesEqualTheCpu) {
  expect_same_peaks([](Device d) {
    const Tensor a = randn({6, 40, 60}, {DType::f32, d, true});
    const Tensor b = randn({6, 50, 30}, {DType::f32, d, true});
    // Every second column of a: neither row- nor column-major, so the GEMM copies it (and its
    // gradient's GEMMs meet the transposed layouts).
    sum(matmul(a.slice(2, 0, 60, 2), b.transpose(1, 2))).backward();
  });
}

TEST(MetaDevice, CachingAllocatorOnAddressRangesKeepsTheSameBooks) {
  // The same requests on a host-memory segment source and on address ranges: the books agree.
  struct HostSource final : SegmentSource {
    void* raw_alloc(size_t bytes) override { return std::malloc(bytes); }
    void raw_free(void* p, size_t) override { std::free(p); }
  };
  CachingAllocator real(std::make_unique<HostSource>(), Device::cuda(0));
  CachingAllocator model(std::make_unique<AddressRangeSource>(), Device::meta(DeviceType::CUDA));
  for (CachingAllocator* a : {&real, &model}) a->set_budget(size_t{64} << 20);
  const std::vector<size_t> sizes = {100, 3 << 20, 700, 12 << 20, 1 << 20, 5000, 25 << 20, 33};
  struct Live {
    void* r;
    void* m;
    size_t n;
  };
  std::vector<Live> live;
  for (int round = 0; round < 3; ++round) {
    for (size_t s : sizes) {
      const size_t n = s * static_cast<size_t>(round + 1);
      void* r = nullptr;
      void* m = nullptr;
      bool r_oom = false, m_oom = false;
      try {
        r = real.allocate(n);
      } catch (const OutOfMemoryError&) {
        r_oom = true;
      }
      try {
        m = model.allocate(n);
      } catch (const OutOfMemoryError&) {
        m_oom = true;
      }
      ASSERT_EQ(r_oom, m_oom) << "request " << n;
      if (!r_oom) live.push_back({r, m, n});
      if (live.size() > 4) {
        real.deallocate(live.front().r, live.front().n);
        model.deallocate(live.front().m, live.front().n);
        live.erase(live.begin());
      }
      const CachingStats rs = real.detailed_stats(), ms = model.detailed_stats();
      ASSERT_EQ(rs.base.allocated_bytes, ms.base.allocated_bytes);
      ASSERT_EQ(rs.base.reserved_bytes, ms.base.reserved_bytes);
      ASSERT_EQ(rs.base.peak_reserved_bytes, ms.base.peak_reserved_bytes);
      ASSERT_EQ(rs.segments, ms.segments);
    }
  }
  for (const Live& l : live) {
    real.deallocate(l.r, l.n);
    model.deallocate(l.m, l.n);
  }
}

}  // namespace
}  // namespace minidl
