// The initialisers of nn/init.h. They draw a fresh tensor from the generator and copy it in, so a
// parameter keeps its identity (optimizers may already hold it) and its device.
#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"

namespace minidl::nn::init {

namespace {

Tensor assign(Tensor t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
  return t;
}

TensorOptions host_like(const Tensor& t) { return {t.dtype(), Device::cpu(), false}; }

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
  return assign(t, uniform(t.shape(), low, high, host_like(t), gen));
}

Tensor normal_(Tensor t, double mean, double std, Generator* gen) {
  return assign(t, normal(t.shape(), mean, std, host_like(t), gen));
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
