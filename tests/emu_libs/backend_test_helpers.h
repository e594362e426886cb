// What the tests of the emulated cuDNN graph API share (cudnn_backend_emu_test.cpp,
// cudnn_fused_graph_emu_test.cpp): a convolution geometry, host buffers in NCHW or NHWC of f64 / f32 /
// f16, deterministic data, the convolution's three directions written out from its definition, a
// handle, and backend tensors built through cudnn-frontend.
#pragma once
#include "kernels/cuda/frontend.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_emu/emu_libs.h"
#include "cuda_emu/emu_libs_internal.h"

namespace backend_test {

namespace fe = cudnn_frontend;
using minidl::cuda::emu::detail::float_to_half_bits;
using minidl::cuda::emu::detail::half_bits_to_float;

struct Geo {
  int64_t n, c, h, w, k, r, s, pad, stride, dil, groups;
  bool nhwc = false;
  int64_t oh() const { return (h + 2 * pad - (dil * (r - 1) + 1)) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - (dil * (s - 1) + 1)) / stride + 1; }
};

// Strides of a [d0, d1, d2, d3] tensor stored NCHW or NHWC.
inline std::vector<int64_t> strides(const std::vector<int64_t>& d, bool nhwc) {
  if (!nhwc) return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
  return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
}
inline int64_t offset(const std::vector<int64_t>& st, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * st[0] + b * st[1] + c * st[2] + d * st[3];
}

inline void store(std::vector<unsigned char>& out, const std::vector<double>& v, const std::vector<int64_t>& dims, bool nhwc,
           cudnnDataType_t dt) {
  const size_t e = dt == CUDNN_DATA_DOUBLE ? 8 : dt == CUDNN_DATA_FLOAT ? 4 : 2;
  out.assign(v.size() * e + 64, 0);
  const std::vector<int64_t> st = strides(dims, nhwc);
  size_t i = 0;
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t b = 0; b < dims[1]; ++b)
      for (int64_t c = 0; c < dims[2]; ++c)
        for (int64_t d = 0; d < dims[3]; ++d, ++i) {
          const auto o = static_cast<size_t>(offset(st, a, b, c, d));
          if (dt == CUDNN_DATA_DOUBLE) std::memcpy(out.data() + 8 * o, &v[i], 8);
          if (dt == CUDNN_DATA_FLOAT) {
            const float f = static_cast<float>(v[i]);
            std::memcpy(out.data() + 4 * o, &f, 4);
          }
          if (dt == CUDNN_DATA_HALF) {
            const uint16_t hb = float_to_half_bits(static_cast<float>(v[i]));
            std::memcpy(out.data() + 2 * o, &hb, 2);
          }
        }
}

inline std::vector<double> load(const std::vector<unsigned char>& in, const std::vector<int64_t>& dims, bool nhwc,
                         cudnnDataType_t dt) {
  std::vector<double> v;
  const std::vector<int64_t> st = strides(dims, nhwc);
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t b = 0; b < dims[1]; ++b)
      for (int64_t c = 0; c < dims[2]; ++c)
        for (int64_t d = 0; d < dims[3]; ++d) {
          const auto o = static_cast<size_t>(offset(st, a, b, c, d));
          if (dt == CUDNN_DATA_DOUBLE) {
            double x;
            std::memcpy(&x, in.data() + 8 * o, 8);
            v.push_back(x);
          } else if (dt == CUDNN_DATA_FLOAT) {
            float x;
            std::memcpy(&x, in.data() + 4 * o, 4);
            v.push_back(x);
          } else {
            uint16_t hb;
            std::memcpy(&hb, in.data() + 2 * o, 2);
            v.push_back(half_bits_to_float(hb));
          }
        }
  return v;
}

inline std::vector<double> wave(size_t n, double seed) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(seed + 0.37 * static_cast<double>(i));
  return v;
}

// Calls f(x index, w index, y index) for every product term of the convolution, written out
// from its definition on NCHW logical arrays; the three directions below are sums over it.
template <class F>
void for_each_term(const Geo& g, F&& f) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t p = 0; p < g.oh(); ++p)
        for (int64_t q = 0; q < g.ow(); ++q)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < g.r; ++r)
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t ih = p * g.stride - g.pad + r * g.dil, iw = q * g.stride - g.pad + s * g.dil;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const int64_t ic = (k / kg) * cg + c;
                f(static_cast<size_t>(((n * g.c + ic) * g.h + ih) * g.w + iw),
                  static_cast<size_t>(((k * cg + c) * g.r + r) * g.s + s),
                  static_cast<size_t>(((n * g.k + k) * g.oh() + p) * g.ow() + q));
              }
}

inline std::vector<double> direct_forward(const Geo& g, const std::vector<double>& x, const std::vector<double>& w) {
  std::vector<double> y(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 0.0);
  for_each_term(g, [&](size_t xi, size_t wi, size_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}
inline std::vector<double> direct_dgrad(const Geo& g, const std::vector<double>& dy, const std::vector<double>& w) {
  std::vector<double> dx(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  for_each_term(g, [&](size_t xi, size_t wi, size_t yi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}
inline std::vector<double> direct_wgrad(const Geo& g, const std::vector<double>& x, const std::vector<double>& dy) {
  std::vector<double> dw(static_cast<size_t>(g.k * (g.c / g.groups) * g.r * g.s), 0.0);
  for_each_term(g, [&](size_t xi, size_t wi, size_t yi) { dw[wi] += x[xi] * dy[yi]; });
  return dw;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

class Handle {
 public:
  Handle() { EXPECT_EQ(cudnnCreate(&h_), CUDNN_STATUS_SUCCESS); }
  ~Handle() { EXPECT_EQ(cudnnDestroy(h_), CUDNN_STATUS_SUCCESS); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

// A backend tensor of 4-d dims stored NCHW or NHWC (16-byte aligned).
inline fe::Tensor tensor(int64_t uid, const std::vector<int64_t>& dims, bool nhwc, cudnnDataType_t dt,
                         bool is_virtual = false) {
  const std::vector<int64_t> st = strides(dims, nhwc);
  return fe::TensorBuilder().setDim(4, dims.data()).setStride(4, st.data()).setId(uid).setAlignment(16).setDataType(dt)
      .setVirtual(is_virtual).build();
}

}  // namespace backend_test
