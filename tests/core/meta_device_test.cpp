// The shape-only device (kernels/meta): tensors without storage, ops that compute nothing, and an
// allocator model whose statistics equal the real allocator's for the same work. Each case runs
// the same function on the CPU and on meta:cpu and compares the peaks the two allocators saw.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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

// The peaks of fn above what the device held before, and what it left allocated. Both allocators
// start with an empty cache (the host one keeps freed blocks of 1 MiB and more).
Peaks peaks_of(Device d, const std::function<void(Device)>& fn) {
  empty_cache(d);
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

// One request made of a real allocator and of its model on address ranges.
struct Twin {
  void* r = nullptr;
  void* m = nullptr;
  size_t n = 0;
};
// Both blocks, or nullopt when both ran out of the budget (one side alone fails the test).
std::optional<Twin> allocate_both(Allocator& real, Allocator& model, size_t n) {
  Twin t{nullptr, nullptr, n};
  bool r_oom = false, m_oom = false;
  try {
    t.r = real.allocate(n);
  } catch (const OutOfMemoryError&) {
    r_oom = true;
  }
  try {
    t.m = model.allocate(n);
  } catch (const OutOfMemoryError&) {
    m_oom = true;
  }
  EXPECT_EQ(r_oom, m_oom) << "a request of " << n << " bytes";
  if (!r_oom && !m_oom) return t;
  if (!r_oom) real.deallocate(t.r, n);
  if (!m_oom) model.deallocate(t.m, n);
  return std::nullopt;
}
void free_both(Allocator& real, Allocator& model, const Twin& t) {
  real.deallocate(t.r, t.n);
  model.deallocate(t.m, t.n);
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
  empty_cache(m);   // else the budget check would first release cached blocks, as the host's does
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

TEST(MetaDevice, FusedBatchNormPeaksEqualTheCpu) {
  // batch_norm_relu and batch_norm_add_relu, forward and backward, training and evaluation: in
  // NCHW f32 the kernel stages nothing; channels-last operands are copied to NCHW and the outputs
  // back, f16 ones widened to f32 (cpu::stage_batch_norm_act_*). 2.4 MB activations: blocks in the
  // host cache's range.
  for (DType dt : {DType::f32, DType::f16}) {
    for (bool cl : {false, true}) {
      for (bool residual : {false, true}) {
        for (bool training : {true, false}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (cl ? " NHWC" : " NCHW") + (residual ? " +residual" : "") +
                       (training ? " train" : " eval"));
          expect_same_peaks([&](Device d) {
            const Shape s{8, 32, 48, 48};
            const auto act = [&] {
              Tensor v = empty(s, {DType::f32, d}).to(dt);
              if (cl) v = to_channels_last(v);
              v = v.detach();
              v.set_requires_grad(true);
              return v;
            };
            const Tensor x = act(), r = residual ? act() : Tensor();
            const Tensor w = ones({32}, {DType::f32, d, true}), b = zeros({32}, {DType::f32, d, true});
            const Tensor rm = zeros({32}, {DType::f32, d}), rv = ones({32}, {DType::f32, d});
            const Tensor y = residual ? batch_norm_add_relu(x, r, w, b, rm, rv, training)
                                      : batch_norm_relu(x, w, b, rm, rv, training);
            y.backward(act().detach());
          });
        }
      }
    }
  }
}

// Channels-last operands (--channels-last on the CPU): the convolutions, pooling and the plain
// batch norm run the NCHW kernels on contiguous copies and copy the output back (cpu::in_nchw,
// cpu::stage_batch_norm), in f32 and, widened after the copies, in f16. The dry run makes the same
// copies. Activations of 2.4 MB (f32): blocks in the host cache's range.
TEST(MetaDevice, ChannelsLastStagingPeaksEqualTheCpu) {
  for (DType dt : {DType::f32, DType::f16}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (training ? " train" : " eval"));
      expect_same_peaks([&](Device d) {
        Tensor x = to_channels_last(randn({8, 16, 48, 48}, {DType::f32, d}).to(dt)).detach();
        x.set_requires_grad(true);
        Tensor w = to_channels_last(randn({32, 16, 3, 3}, {DType::f32, d}).to(dt)).detach();
        w.set_requires_grad(true);
        Conv2dOptions o;
        o.padding = {1, 1};
        const Tensor g = ones({32}, {DType::f32, d, true}), b = zeros({32}, {DType::f32, d, true});
        const Tensor rm = zeros({32}, {DType::f32, d}), rv = ones({32}, {DType::f32, d});
        const Tensor y = batch_norm(conv2d(x, w, Tensor(), o), g, b, rm, rv, training);
        const Tensor p = avg_pool2d(max_pool2d(y, Pool2dOptions{{2, 2}, {2, 2}, {0, 0}}),
                                    Pool2dOptions{{2, 2}, {2, 2}, {0, 0}});
        sum(p.to(DType::f32)).backward();
      });
    }
  }
}

TEST(MetaDevice, HostCacheKeepsTheSameBooks) {
  // The host allocator's cache of large blocks on memory and on address ranges: the same requests
  // (sizes around and above the cache's 1 MiB, frees in another order, a budget that forces
  // releases and OOMs) give the same books after every request.
  CpuAllocator real, model(Device::meta());
  for (CpuAllocator* a : {&real, &model}) a->set_budget(size_t{40} << 20);
  uint64_t state = 12345;
  const auto next = [&] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  std::vector<Twin> live;
  int ooms = 0;
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && next() % 3 == 0) {
      const size_t k = next() % live.size();
      free_both(real, model, live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      const size_t n = next() % 4 == 0 ? 100 + next() % 5000 : (1 + next() % 6) * (size_t{1} << 20) + 64 * (next() % 3);
      const std::optional<Twin> t = allocate_both(real, model, n);
      ASSERT_FALSE(HasFailure()) << "request " << i;
      if (t) live.push_back(*t);
      else ++ooms;
    }
    const MemoryStats rs = real.stats(), ms = model.stats();
    ASSERT_EQ(ms.allocated_bytes, rs.allocated_bytes) << "after request " << i;
    ASSERT_EQ(ms.reserved_bytes, rs.reserved_bytes) << "after request " << i;
    ASSERT_EQ(ms.peak_reserved_bytes, rs.peak_reserved_bytes) << "after request " << i;
    ASSERT_EQ(model.cached_bytes(), real.cached_bytes()) << "after request " << i;
    ASSERT_EQ(model.cache_hits(), real.cache_hits()) << "after request " << i;
  }
  EXPECT_GT(real.cache_hits(), 0);
  EXPECT_GT(ooms, 0);
  for (const Twin& t : live) free_both(real, model, t);
  real.empty_cache();
  model.empty_cache();
  EXPECT_EQ(model.stats().reserved_bytes, 0);
  EXPECT_EQ(real.stats().reserved_bytes, 0);
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
  std::vector<Twin> live;
  for (int round = 0; round < 3; ++round) {
    for (size_t s : sizes) {
      const std::optional<Twin> t = allocate_both(real, model, s * static_cast<size_t>(round + 1));
      ASSERT_FALSE(HasFailure());
      if (t) live.push_back(*t);
      if (live.size() > 4) {
        free_both(real, model, live.front());
        live.erase(live.begin());
      }
      const CachingStats rs = real.detailed_stats(), ms = model.detailed_stats();
      ASSERT_EQ(rs.base.allocated_bytes, ms.base.allocated_bytes);
      ASSERT_EQ(rs.base.reserved_bytes, ms.base.reserved_bytes);
      ASSERT_EQ(rs.base.peak_reserved_bytes, ms.base.peak_reserved_bytes);
      ASSERT_EQ(rs.segments, ms.segments);
    }
  }
  for (const Twin& t : live) free_both(real, model, t);
}

}  // namespace
}  // namespace minidl
