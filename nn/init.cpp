// The initialisers of nn/init.h. They draw from the generator into the parameter, so it keeps its
// identity (optimizers may already hold it) and its device: in place for a contiguous host tensor,
// else into a fresh host tensor that is copied in. In place matters for memory: a host temporary
// per parameter would go to the allocator's cache, where it could serve the next, smaller
// parameter with its larger block (core/allocator.h), and a dry run on the meta device, whose
// parameters are never drawn, would then book different blocks than the real run.
#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"

namespace minidl::nn::init {

namespace {

Tensor assign(Tensor t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
  return t;
}

TensorOptions host_like(const Tensor& t) { return {t.dtype(), Device::cpu(), false}; }

// Draws as uniform() / normal() would (same generator offsets, same values), into t.
Tensor draw_(Tensor t, RandomKind kind, double a, double b, Generator* gen) {
  // Not on the host, strided, or an integer dtype (which uniform() refuses with its message):
  // through a host tensor.
  if (!t.device().is_cpu() || !t.is_contiguous() || !is_floating(t.dtype())) {
    return assign(t, kind == RandomKind::Uniform ? uniform(t.shape(), a, b, host_like(t), gen)
                                                 : normal(t.shape(), a, b, host_like(t), gen));
  }
  Generator& g = gen != nullptr ? *gen : default_generator();
  const uint64_t seed = g.seed();
  const uint64_t offset = g.reserve(static_cast<uint64_t>(t.numel()));
  backend(t.device()).random(kind, t, seed, offset, a, b);
  return t;
}

double fan_for(const Tensor& t, FanMode mode) {
  auto [in, out] = fans(t);
  return static_cast<double>(mode == FanMode::FanIn ? in : out);
}

}  // namespace

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  MINIDL_CHECK(w.dim() >= 2, "init::fans: a weight needs at least 2 dimensions [out, in, ...], got ", w.meta());
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

Tensor uniform_(Tensor t, double low, double high, Generator* gen) {
  MINIDL_CHECK(low <= high, "init::uniform_: low ", low, " > high ", high);
  return draw_(t, RandomKind::Uniform, low, high, gen);
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  MINIDL_CHECK(std >= 0, "init::normal_: std must be >= 0, got ", std);
  return draw_(t, RandomKind::Normal, mean, std, gen);
}

Tensor constant_(Tensor t, double value) {
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Generator* gen) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  return normal_(t, 0.0, gain / std::sqrt(fan_for(t, mode)), gen);
}

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Generator* gen) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / fan_for(t, mode));
  return uniform_(t, -bound, bound, gen);
}

Tensor xavier_uniform_(Tensor t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -bound, bound, gen);
}

void pytorch_default_(Tensor weight, Tensor bias, Generator* gen) {
  kaiming_uniform_(weight, std::sqrt(5.0), FanMode::FanIn, gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(fan_for(weight, FanMode::FanIn));
    uniform_(bias, -bound, bound, gen);
  }
}

}  // namespace minidl::nn::init
