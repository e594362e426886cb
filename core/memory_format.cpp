// Channels-last (NHWC) as a memory format of logical [N, C, H, W] tensors, as PyTorch's
// torch.channels_last: the tests and factories every op uses to keep its input's format, so a
// channels-last ResNet step runs without a transpose (docs/cuda/backend.md "Channels-last end to end").
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {

bool is_channels_last(const Tensor& t) {
  if (!t.defined() || t.dim() != 4) return false;
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {   // C, W, H, N from the fastest-moving dim
    if (t.size(d) == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

bool prefers_channels_last(const Tensor& t) { return is_channels_last(t) && !t.is_contiguous(); }

bool same_memory_order(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  return (a.is_contiguous() && b.is_contiguous()) || (is_channels_last(a) && is_channels_last(b));
}

Tensor empty_channels_last(const Shape& s, TensorOptions o) {
  MINIDL_CHECK(s.size() == 4, "empty_channels_last: expected a 4-d shape [N, C, H, W], got ", shape_str(s));
  const bool rg = o.requires_grad;
  o.requires_grad = false;
  Tensor t = empty({s[0], s[2], s[3], s[1]}, o).permute({0, 3, 1, 2});
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor empty_in_format(const Shape& s, TensorOptions o, bool channels_last) {
  return channels_last ? empty_channels_last(s, o) : empty(s, o);
}

Tensor to_channels_last(const Tensor& t) {
  MINIDL_CHECK(t.defined() && t.dim() == 4, "to_channels_last: expected a 4-d tensor [N, C, H, W], got ",
               t.defined() ? t.meta() : std::string("an undefined tensor"));
  if (is_channels_last(t)) return t;
  Tensor out = empty_channels_last(t.shape(), t.options());
  backend(t.device()).copy(t.detach(), out);
  record("to_channels_last", {t}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor in_format(const Tensor& t, bool channels_last) { return channels_last ? to_channels_last(t) : t.contiguous(); }

}  // namespace minidl
