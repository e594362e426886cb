// The cuBLAS stand-in against a direct computation: cublasGemmStridedBatchedEx for each transpose,
// padded leading dimensions, batch strides, alpha/beta and the f16 / TF32 paths, and the status
// each invalid call returns (the backend's error paths depend on those codes being cuBLAS's own).
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/emu_libs.h"
#include "cuda_emu/emu_libs_internal.h"

namespace {

namespace emu = minidl::cuda::emu;

// Deterministic values with a fractional part, so products are not all exact small integers.
std::vector<float> fill(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(seed + 0.37f * static_cast<float>(i)) * 1.5f;
  return v;
}

// Column-major element (i, j) of op(M) where M is stored with leading dimension ld.
double at(const std::vector<float>& m, bool trans, int64_t ld, int64_t i, int64_t j, int64_t off) {
  return trans ? m[static_cast<size_t>(off + j + i * ld)] : m[static_cast<size_t>(off + i + j * ld)];
}

class CublasEmu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cublasCreate(&h_), CUBLAS_STATUS_SUCCESS);
    emu::clear_last_error_detail();
  }
  void TearDown() override {
    emu::set_device_range_checker(nullptr);
    emu::set_stream_checker(nullptr);
    emu::set_fault_reporter(nullptr);
    EXPECT_EQ(cublasDestroy(h_), CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t gemm32(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const float* a,
                        int lda, long long sa, const float* b, int ldb, long long sb, float beta, float* c, int ldc,
                        long long sc, int batch, cublasComputeType_t ct = CUBLAS_COMPUTE_32F) {
    return cublasGemmStridedBatchedEx(h_, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, sa, b, CUDA_R_32F, ldb, sb,
                                      &beta, c, CUDA_R_32F, ldc, sc, batch, ct, CUBLAS_GEMM_DEFAULT);
  }
  cublasHandle_t h_ = nullptr;
};

TEST_F(CublasEmu, StridedBatchedF32MatchesDirectProductForEveryTranspose) {
  const int m = 5, n = 3, k = 4, batch = 3;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      // Padded leading dimensions and batch strides with a gap, so index mistakes show.
      const int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
      const long long sa = static_cast<long long>(lda) * (ta ? m : k) + 7;
      const long long sb = static_cast<long long>(ldb) * (tb ? k : n) + 5;
      const long long sc = static_cast<long long>(ldc) * n + 2;
      const auto a = fill(static_cast<size_t>(sa * batch), 0.1f), b = fill(static_cast<size_t>(sb * batch), 0.7f);
      auto c = fill(static_cast<size_t>(sc * batch), 1.3f);
      const auto c0 = c;
      const float alpha = 0.75f, beta = -0.5f;
      ASSERT_EQ(gemm32(ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, alpha, a.data(), lda,
                       sa, b.data(), ldb, sb, beta, c.data(), ldc, sc, batch),
                CUBLAS_STATUS_SUCCESS)
          << emu::last_error_detail();
      for (int bi = 0; bi < batch; ++bi) {
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < m; ++i) {
            double acc = 0;
            for (int l = 0; l < k; ++l) acc += at(a, ta, lda, i, l, bi * sa) * at(b, tb, ldb, l, j, bi * sb);
            const size_t ci = static_cast<size_t>(bi * sc + i + j * ldc);
            EXPECT_NEAR(c[ci], alpha * acc + beta * c0[ci], 1e-5) << "ta " << ta << " tb " << tb << " batch " << bi;
          }
        }
      }
      // The padding between columns and batches is not written.
      for (int bi = 0; bi < batch; ++bi)
        for (int j = 0; j < n; ++j)
          for (int i = m; i < ldc && bi * sc + i + j * ldc < sc * batch; ++i) {
            const size_t ci = static_cast<size_t>(bi * sc + i + j * ldc);
            EXPECT_EQ(c[ci], c0[ci]);
          }
    }
  }
}

// Each element sums its k products from 0 in order of l, one fused multiply-add each, whatever
// the compiler vectorises: bit for bit, in f64, with values spanning six decades (so the order
// and the rounding of each addition show) and m, k not multiples of a vector's width.
TEST_F(CublasEmu, F64ElementsAddTheirProductsInOrderWithFusedMultiplyAdds) {
  const int m = 13, n = 3, k = 37;
  const auto values = [](size_t count, double seed) {
    std::vector<double> v(count);
    for (size_t i = 0; i < count; ++i) {
      const double x = static_cast<double>(i);
      v[i] = std::sin(seed + 0.37 * x) * std::pow(10.0, std::fmod(1.7 * x, 6.0));
    }
    return v;
  };
  const auto a = values(static_cast<size_t>(m) * k, 0.1), b = values(static_cast<size_t>(k) * n, 0.7);
  std::vector<double> c(static_cast<size_t>(m) * n, std::nan(""));
  const double one = 1, zero = 0;
  ASSERT_EQ(cublasGemmStridedBatchedEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.data(), CUDA_R_64F, m, 0,
                                       b.data(), CUDA_R_64F, k, 0, &zero, c.data(), CUDA_R_64F, m, 0, 1,
                                       CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS)
      << emu::last_error_detail();
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int l = 0; l < k; ++l)
        acc = std::fma(a[static_cast<size_t>(i + l * m)], b[static_cast<size_t>(l + j * k)], acc);
      const double got = c[static_cast<size_t>(i + j * m)];
      EXPECT_EQ(std::memcmp(&got, &acc, sizeof acc), 0) << "C(" << i << ", " << j << ") is " << got << ", in order "
                                                         << acc;
    }
  }
}

TEST_F(CublasEmu, BetaZeroDoesNotReadCAndAlphaZeroDoesNotReadAB) {
  const int m = 2, n = 2, k = 2;
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  std::vector<float> c(4, std::nanf(""));
  ASSERT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, 1.f, a.data(), 2, 0, b.data(), 2, 0, 0.f, c.data(), 2, 0, 1),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c, (std::vector<float>{23, 34, 31, 46}));   // [[1,3],[2,4]] x [[5,7],[6,8]], column-major
  // alpha == 0: A and B may be anything (here NULL), C is scaled by beta.
  ASSERT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, 0.f, nullptr, 2, 0, nullptr, 2, 0, 2.f, c.data(), 2, 0, 1),
            CUBLAS_STATUS_SUCCESS)
      << emu::last_error_detail();
  EXPECT_EQ(c, (std::vector<float>{46, 68, 62, 92}));
}

TEST_F(CublasEmu, HalfInHalfOutAccumulatesInF32AndRoundsOnce) {
  namespace d = emu::detail;
  // 2051 ones: an f32 accumulator holds 2051 and rounds it once to f16's 2052 (ties to even);
  // an f16 accumulator would stop at 2048, where adding 1 is a tie that rounds back down.
  const int k = 2051;
  std::vector<uint16_t> a(k, d::float_to_half_bits(1.f)), b(k, d::float_to_half_bits(1.f));
  uint16_t c = 0;
  const float alpha = 1.f, beta = 0.f;
  ASSERT_EQ(cublasGemmStridedBatchedEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, k, &alpha, a.data(), CUDA_R_16F, 1, 0,
                                       b.data(), CUDA_R_16F, k, 0, &beta, &c, CUDA_R_16F, 1, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS)
      << emu::last_error_detail();
  EXPECT_EQ(d::half_bits_to_float(c), 2052.f);
  // 0.1 * 3: the products' sum rounded once from the exact value.
  const uint16_t tenth = d::float_to_half_bits(0.1f);
  std::vector<uint16_t> a3(3, tenth), b3(3, d::float_to_half_bits(1.f));
  ASSERT_EQ(cublasGemmStridedBatchedEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 3, &alpha, a3.data(), CUDA_R_16F, 1, 0,
                                       b3.data(), CUDA_R_16F, 3, 0, &beta, &c, CUDA_R_16F, 1, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  const double exact = 3.0 * d::half_bits_to_float(tenth);
  EXPECT_EQ(c, d::float_to_half_bits(static_cast<float>(exact)));
}

TEST_F(CublasEmu, Tf32ComputeRoundsInputsToTenMantissaBits) {
  // 1 + 2^-12 is exact in f32 but rounds to 1 in TF32 (10 mantissa bits).
  const float x = 1.f + std::ldexp(1.f, -12), one = 1.f;
  float c = 0;
  ASSERT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1.f, &x, 1, 0, &one, 1, 0, 0.f, &c, 1, 0, 1,
                   CUBLAS_COMPUTE_32F_FAST_TF32),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c, 1.f);
  ASSERT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1.f, &x, 1, 0, &one, 1, 0, 0.f, &c, 1, 0, 1), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c, x);
}

TEST_F(CublasEmu, InvalidArgumentsReturnCublasStatuses) {
  std::vector<float> a(64, 1.f), b(64, 1.f), c(64, 0.f);
  // Leading dimensions below the stored rows.
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 1.f, a.data(), 3, 0, b.data(), 3, 0, 0.f, c.data(), 4, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_NE(std::string(emu::last_error_detail()).find("lda = 3"), std::string::npos) << emu::last_error_detail();
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_T, 4, 2, 3, 1.f, a.data(), 4, 0, b.data(), 1, 0, 0.f, c.data(), 4, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 1.f, a.data(), 4, 0, b.data(), 3, 0, 0.f, c.data(), 3, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  // Negative sizes, a bad transpose.
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 3, 1.f, a.data(), 4, 0, b.data(), 3, 0, 0.f, c.data(), 4, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm32(static_cast<cublasOperation_t>(7), CUBLAS_OP_N, 4, 2, 3, 1.f, a.data(), 4, 0, b.data(), 3, 0, 0.f,
                   c.data(), 4, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  // Batch outputs that overlap, C overlapping A.
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 1.f, a.data(), 4, 0, b.data(), 3, 0, 0.f, c.data(), 4, 4, 2),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, 1.f, a.data(), 4, 0, b.data(), 3, 0, 0.f, a.data() + 2, 4, 0, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  // A type combination outside cublasGemmEx's table: f32 in, f16 out.
  const float one = 1.f, zero = 0.f;
  EXPECT_EQ(cublasGemmStridedBatchedEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.data(), CUDA_R_32F, 2, 0, b.data(),
                                       CUDA_R_32F, 2, 0, &zero, c.data(), CUDA_R_16F, 2, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // Device pointer mode is not emulated: refused, not misread.
  ASSERT_EQ(cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, 1.f, a.data(), 2, 0, b.data(), 2, 0, 0.f, c.data(), 2, 0, 1),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasSetPointerMode(h_, static_cast<cublasPointerMode_t>(9)), CUBLAS_STATUS_INVALID_VALUE);
  // Nothing was written by any refused call.
  EXPECT_EQ(c, std::vector<float>(64, 0.f));
}

// The range checker stands in for the emulated runtime: only `live` is device memory.
const float* g_live = nullptr;
size_t g_live_bytes = 0;
bool in_live(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(static_cast<const void*>(g_live));
  const auto* q = static_cast<const unsigned char*>(p);
  return q >= b && q + bytes <= b + g_live_bytes;
}
std::string g_fault;
void record_fault(const char* s) { g_fault = s; }

TEST_F(CublasEmu, BuffersOutsideLiveDeviceMemoryAreExecutionFaults) {
  std::vector<float> dev(32, 1.f), host(32, 1.f);
  g_live = dev.data();
  g_live_bytes = dev.size() * sizeof(float);
  emu::set_device_range_checker(in_live);
  emu::set_fault_reporter(record_fault);
  g_fault.clear();
  // B in host memory.
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, 1.f, dev.data(), 2, 0, host.data(), 2, 0, 0.f, dev.data() + 16,
                   2, 0, 1),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_NE(g_fault.find("B of batch 0"), std::string::npos) << g_fault;
  // The second batch of C runs past the allocation's end.
  g_fault.clear();
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, 1.f, dev.data(), 2, 0, dev.data(), 2, 0, 0.f, dev.data() + 24, 2,
                   6, 2),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_NE(g_fault.find("C of batch 1"), std::string::npos) << g_fault;
  // Inside: fine.
  EXPECT_EQ(gemm32(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, 1.f, dev.data(), 2, 0, dev.data() + 4, 2, 0, 0.f, dev.data() + 8,
                   2, 4, 2),
            CUBLAS_STATUS_SUCCESS)
      << emu::last_error_detail();
}

TEST_F(CublasEmu, HandlesStreamsAndWorkspaceFollowTheContract) {
  // A destroyed handle is recognised, not dereferenced.
  cublasHandle_t h2 = nullptr;
  ASSERT_EQ(cublasCreate(&h2), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(emu::live_object_counts().cublas_handles, 2);
  ASSERT_EQ(cublasDestroy(h2), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h2), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetStream(h2, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(emu::live_object_counts().cublas_handles, 1);
  EXPECT_EQ(cublasCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);

  // The workspace: 256-byte aligned, live, and reset to the default pool by cublasSetStream.
  alignas(256) static unsigned char ws[1024];
  EXPECT_EQ(cublasSetWorkspace(h_, ws + 8, 512), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasSetWorkspace(h_, ws, sizeof(ws)), CUBLAS_STATUS_SUCCESS);
  EXPECT_TRUE(emu::cublas_workspace_of(h_).user);
  EXPECT_EQ(emu::cublas_workspace_of(h_).bytes, sizeof(ws));
  ASSERT_EQ(cublasSetStream(h_, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_FALSE(emu::cublas_workspace_of(h_).user);

  // A stream the runtime does not know is refused by cublasSetStream.
  emu::set_stream_checker([](cudaStream_t s) { return s == nullptr; });
  auto* fake = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x1000));
  EXPECT_EQ(cublasSetStream(h_, fake), CUBLAS_STATUS_INVALID_VALUE);
  cudaStream_t got = fake;
  ASSERT_EQ(cublasGetStream(h_, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, nullptr);
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

}  // namespace
