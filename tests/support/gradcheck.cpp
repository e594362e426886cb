// The finite-difference checker behind every op's gradient test. It lives apart from the tests so
// that the perturbation scheme (in place through the view's strides, restored bit for bit) and the
// failure messages are written once.
#include "tests/support/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "core/autograd.h"

namespace minidl::testing {
namespace {

// The weighting is fixed so a failure reproduces; |R| >= 0.5 so no output element is
// effectively ignored.
constexpr uint64_t kWeightSeed = 0x6d696e69646cULL;

Shape unravel(const Shape& shape, int64_t linear) {
  Shape idx(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = linear % shape[d];
    linear /= shape[d];
  }
  return idx;
}

int64_t element_offset(const Shape& shape, const Shape& strides, int64_t linear) {
  const Shape idx = unravel(shape, linear);
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
  return off;
}

std::vector<double> random_weights(int64_t n) {
  std::mt19937_64 rng(kWeightSeed);
  std::uniform_real_distribution<double> mag(0.5, 1.5);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> w(static_cast<size_t>(n));
  for (auto& v : w) v = sign(rng) ? mag(rng) : -mag(rng);
  return w;
}

double weighted_sum(const Tensor& out, const std::vector<double>& weights) {
  const std::vector<double> v = out.to_vector();
  long double s = 0.0L;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<long double>(v[i]) * weights[i];
  return static_cast<double>(s);
}

std::string describe(const std::vector<Tensor>& inputs, size_t i) {
  std::ostringstream os;
  os << "input " << i << " (" << inputs[i].meta() << ", strides " << shape_str(inputs[i].strides()) << ")";
  return os.str();
}

struct Analytic {
  Shape out_shape;
  std::vector<double> weights;                 // as the output dtype rounds them
  std::vector<std::vector<double>> grads;      // per input; empty for unchecked ones
  std::vector<bool> reached;                   // whether backward produced a .grad
};

// One forward + backward with cleared grads. Returns an error message, or "" on success.
std::string run_analytic(const GradFn& f, const std::vector<Tensor>& inputs, Analytic& a) {
  for (const auto& t : inputs) t.impl().grad.reset();
  Tensor out = f(inputs);
  if (!out.defined()) return "f returned an undefined tensor";
  if (!is_floating(out.dtype())) return "f returned a non-floating tensor " + out.meta();
  a.out_shape = out.shape();
  Tensor r = from_vector(random_weights(out.numel()), out.shape(), {.dtype = out.dtype()});
  a.weights = r.to_vector();
  bool any_checked = false;
  for (const auto& t : inputs) any_checked = any_checked || t.requires_grad();
  if (any_checked) {
    if (!out.requires_grad()) return "f's output " + out.meta() + " does not require grad";
    out.backward(r);
  }
  a.grads.assign(inputs.size(), {});
  a.reached.assign(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor g = inputs[i].grad();
    if (!inputs[i].requires_grad()) {
      if (g.defined()) return describe(inputs, i) + " does not require grad but received a .grad " + g.meta();
      continue;
    }
    a.reached[i] = g.defined();
    if (!g.defined()) {
      a.grads[i].assign(static_cast<size_t>(inputs[i].numel()), 0.0);  // no path: zero gradient
      continue;
    }
    if (g.shape() != inputs[i].shape() || g.dtype() != inputs[i].dtype()) {
      return describe(inputs, i) + " received a .grad of the wrong shape or dtype: " + g.meta();
    }
    a.grads[i] = g.to_vector();
  }
  return "";
}

std::string check_inputs(const std::vector<Tensor>& inputs) {
  std::set<const Storage*> checked_storages;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) return "input " + std::to_string(i) + " is undefined";
    if (!t.is_leaf()) return describe(inputs, i) + " is not a leaf (it has a grad_fn); pass leaves";
    if (!t.requires_grad()) continue;
    if (t.dtype() != DType::f64) return describe(inputs, i) + " requires grad but is not f64";
    if (!t.device().is_cpu()) return describe(inputs, i) + " is not on the CPU";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.shape()[d] > 1 && t.strides()[d] == 0) {
        return describe(inputs, i) + " has overlapping elements (stride 0): perturbing one would move several";
      }
    }
    if (!checked_storages.insert(t.storage().get()).second) {
      return describe(inputs, i) + " shares storage with another checked input";
    }
  }
  return "";
}

}  // namespace

GradcheckResult gradcheck(const GradFn& f, std::vector<Tensor> inputs, double eps, double atol, double rtol) {
  GradcheckResult res;
  auto fail = [&](const std::string& msg) {
    res.ok = false;
    res.message = msg;
    return res;
  };
  if (std::string err = check_inputs(inputs); !err.empty()) return fail(err);

  Analytic first, second;
  try {
    if (std::string err = run_analytic(f, inputs, first); !err.empty()) return fail("analytic pass: " + err);
    if (std::string err = run_analytic(f, inputs, second); !err.empty()) {
      return fail("second analytic pass: " + err);
    }
  } catch (const std::exception& e) {
    return fail(std::string("analytic pass threw: ") + e.what());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t k = 0; k < first.grads[i].size(); ++k) {
      const double g1 = first.grads[i][k], g2 = second.grads[i][k];
      if (!(g1 == g2) && !(std::isnan(g1) && std::isnan(g2))) {
        std::ostringstream os;
        os << "two identical backward passes disagree for " << describe(inputs, i) << " element " << k << " "
           << shape_str(unravel(inputs[i].shape(), static_cast<int64_t>(k))) << ": " << g1 << " then " << g2
           << " (stale accumulation, or a nondeterministic kernel)";
        return fail(os.str());
      }
    }
  }

  std::ostringstream failures;
  int64_t num_bad = 0;
  try {
    NoGradGuard no_grad;
    auto eval = [&]() {
      Tensor out = f(inputs);
      MINIDL_CHECK(out.shape() == first.out_shape, "gradcheck: f's output shape changed from ",
                   shape_str(first.out_shape), " to ", shape_str(out.shape()), " under a perturbation");
      return weighted_sum(out, first.weights);
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      if (!t.requires_grad()) continue;
      double* base = t.data<double>();
      for (int64_t e = 0; e < t.numel(); ++e) {
        double* p = base + element_offset(t.shape(), t.strides(), e);
        const double orig = *p;
        const double xp = orig + eps, xm = orig - eps;
        *p = xp;
        double fp = 0.0, fm = 0.0;
        try {
          fp = eval();
          *p = xm;
          fm = eval();
        } catch (...) {
          *p = orig;
          throw;
        }
        *p = orig;
        const double numeric = (fp - fm) / (xp - xm);  // the step actually taken, not 2*eps
        const double analytic = first.grads[i][static_cast<size_t>(e)];
        const double diff = std::fabs(analytic - numeric);
        ++res.num_checked;
        const bool finite = std::isfinite(analytic) && std::isfinite(numeric);
        if (finite) res.max_abs_diff = std::max(res.max_abs_diff, diff);
        if (!finite || diff > atol + rtol * std::fabs(numeric)) {
          if (num_bad < 5) {
            failures << "\n  " << describe(inputs, i) << " element " << e << " " << shape_str(unravel(t.shape(), e))
                     << ": analytic " << analytic << " vs numeric " << numeric << " (|diff| " << diff
                     << ", tolerance " << atol + rtol * std::fabs(numeric) << ")"
                     << (first.reached[i] ? "" : " [backward gave this input no .grad]");
          }
          ++num_bad;
        }
      }
    }
  } catch (const std::exception& e) {
    return fail(std::string("numeric pass threw: ") + e.what());
  }
  if (num_bad > 0) {
    std::ostringstream os;
    os.precision(12);
    os << "gradient mismatch in " << num_bad << " of " << res.num_checked << " elements (eps " << eps << ", atol "
       << atol << ", rtol " << rtol << ", output shape " << shape_str(first.out_shape) << ")" << failures.str();
    return fail(os.str());
  }
  return res;
}

// ---- Input builders ----

namespace {
// Writes host values into t's elements in logical order through its strides.
void write_logical(const Tensor& t, const std::vector<double>& values) {
  double* base = t.data<double>();
  for (int64_t e = 0; e < t.numel(); ++e) base[element_offset(t.shape(), t.strides(), e)] = values[e];
}

Tensor leaf_from(std::vector<double> values, const Shape& shape, bool requires_grad) {
  Tensor t = from_vector(values, shape, {.dtype = DType::f64});
  t.set_requires_grad(requires_grad);
  return t;
}
}  // namespace

Tensor rand_f64(const Shape& shape, uint64_t seed, double lo, double hi, bool requires_grad) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (auto& x : v) x = u(rng);
  return leaf_from(std::move(v), shape, requires_grad);
}

Tensor signed_away_from_zero(const Shape& shape, uint64_t seed, double lo, double hi, bool requires_grad) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (auto& x : v) x = sign(rng) ? u(rng) : -u(rng);
  return leaf_from(std::move(v), shape, requires_grad);
}

Tensor distinct_f64(const Shape& shape, uint64_t seed, double spacing, double shift, bool requires_grad) {
  const int64_t n = numel_of(shape);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = (static_cast<double>(perm[i]) - 0.5 * static_cast<double>(n - 1)) * spacing + shift;
  return leaf_from(std::move(v), shape, requires_grad);
}

Tensor transposed_leaf(const Tensor& t, bool requires_grad) {
  const std::vector<double> values = t.to_vector();
  const int64_t r = t.dim();
  Shape reversed(t.shape().rbegin(), t.shape().rend());
  std::vector<int64_t> dims(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) dims[d] = r - 1 - d;
  Tensor base = zeros(reversed, {.dtype = DType::f64});
  Tensor v = r > 1 ? base.permute(dims) : base;
  write_logical(v, values);
  v.set_requires_grad(requires_grad);
  return v;
}

Tensor strided_leaf(const Tensor& t, bool requires_grad) {
  const std::vector<double> values = t.to_vector();
  if (t.dim() == 0) return leaf_from(values, t.shape(), requires_grad);
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor base = zeros(wide, {.dtype = DType::f64});
  Tensor v = base.slice(-1, 0, wide.back(), 2);
  write_logical(v, values);
  v.set_requires_grad(requires_grad);
  return v;
}

Tensor random_labels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, classes - 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<double>(u(rng));
  return from_vector(v, {n}, {.dtype = DType::i64});
}

Shape random_shape(uint64_t seed, int64_t rank, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(lo, hi);
  Shape s(static_cast<size_t>(rank));
  for (auto& d : s) d = u(rng);
  return s;
}

}  // namespace minidl::testing
