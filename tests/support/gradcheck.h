// Finite-difference gradient checking in f64: the design requires one for every op with a
// backward, and a shared checker keeps each test to a line. Also the small input builders the
// checks need (seeded values, tie-free values, non-contiguous leaves).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minidl::testing {

struct GradcheckResult {
  bool ok = true;
  std::string message;          // why it failed (empty when ok)
  int64_t num_checked = 0;      // elements compared over all checked inputs
  double max_abs_diff = 0.0;    // largest |analytic - numeric| seen
  explicit operator bool() const { return ok; }
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Compares the gradients backward() computes with central differences of a fixed random
// weighting of f's output, L(x) = sum(f(x) * R), R seeded, so every output element matters.
//
// inputs: leaves. Those with requires_grad are checked and must be f64; the others (targets,
// running statistics, ...) may be any dtype and must not receive a .grad. An input may be a
// NON-contiguous view (transposed, sliced with a step): the numeric derivative perturbs the
// element the view addresses by writing through data_ptr() and the view's strides, in place,
// and restores the original bits afterwards; so views with overlapping elements (stride 0 on a
// dimension longer than 1) are refused, and two checked inputs must not share storage.
//
// The analytic pass seeds backward with R as the explicit gradient (the same as backward of
// sum(f(x) * R), without relying on mul and sum). It runs twice with .grad cleared in between and
// both runs must agree bit for bit (no stale accumulation, deterministic kernels). Every input's
// .grad is cleared first; on return the checked inputs hold the analytic gradient.
//
// An element passes when |analytic - numeric| <= atol + rtol * |numeric|.
GradcheckResult gradcheck(const GradFn& f, std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-7,
                          double rtol = 1e-5);

// ---- Input builders (all f64, contiguous unless the name says otherwise, deterministic) ----

// Uniform values in [lo, hi).
Tensor rand_f64(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, bool requires_grad = true);
// |x| uniform in [lo, hi) with a random sign: for abs, relu, division by x.
Tensor signed_away_from_zero(const Shape& shape, uint64_t seed, double lo = 0.2, double hi = 1.5,
                             bool requires_grad = true);
// A random permutation of evenly spaced values (spacing apart, centred on 0 plus `shift`): no ties
// for max, min and max-pooling, even after a perturbation of eps.
Tensor distinct_f64(const Shape& shape, uint64_t seed, double spacing = 0.05, double shift = 0.0,
                    bool requires_grad = true);
// A leaf with t's shape and values that is a permuted view (dims reversed) of a fresh buffer;
// non-contiguous whenever two dims are longer than 1.
Tensor transposed_leaf(const Tensor& t, bool requires_grad = true);
// A leaf with t's shape and values that is a view with step 2 along the last dim of a buffer twice
// as wide; non-contiguous whenever the last dim is longer than 1.
Tensor strided_leaf(const Tensor& t, bool requires_grad = true);
// i64 class indices in [0, classes).
Tensor random_labels(int64_t n, int64_t classes, uint64_t seed);
// A seeded random shape of the given rank with sizes in [lo, hi].
Shape random_shape(uint64_t seed, int64_t rank, int64_t lo = 1, int64_t hi = 4);

}  // namespace minidl::testing
