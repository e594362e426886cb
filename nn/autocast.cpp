// to_pure_f16: a per-module (non-recursive) dtype conversion, so batch norm can be skipped; the
// in-place swap of each tensor's storage keeps optimizer and registry handles valid.
#include "nn/autocast.h"

#include "core/autocast.h"
#include "core/autograd.h"

namespace minidl::nn {
namespace {

bool convert(const Tensor& t) {
  if (!is_floating(t.dtype()) || t.dtype() == DType::f16) return false;
  TensorImpl& im = t.impl();
  if (im.grad) im.grad = Tensor(im.grad).detach().to(DType::f16).impl_ptr();
  const Tensor converted = t.detach().to(DType::f16);
  im.storage = converted.storage();
  im.strides = converted.strides();
  im.offset = converted.offset();
  im.dtype = DType::f16;
  return true;
}

}  // namespace

int64_t to_pure_f16(Module& model) {
  NoGradGuard no_grad;
  int64_t n = 0;
  for (auto& [name, m] : model.named_modules()) {
    if (m->type_name() == "BatchNorm2d") continue;
    for (auto& [pn, p] : m->named_parameters(/*recurse=*/false)) n += convert(p) ? 1 : 0;
    for (auto& [bn, b] : m->named_buffers(/*recurse=*/false)) n += convert(b) ? 1 : 0;
  }
  autocast_clear_cache();  // any cached copy was made from the old f32 weights
  return n;
}

}  // namespace minidl::nn
