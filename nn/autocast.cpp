// to_pure: a per-module (non-recursive) dtype conversion, so batch norm can be skipped; the
// in-place swap of each tensor's storage keeps optimizer and registry handles valid.
#include "nn/autocast.h"

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"

namespace minidl::nn {
namespace {

bool convert(const Tensor& t, DType dtype) {
  if (!is_floating(t.dtype()) || t.dtype() == dtype) return false;
  TensorImpl& im = t.impl();
  if (im.grad) im.grad = Tensor(im.grad).detach().to(dtype).impl_ptr();
  const Tensor converted = t.detach().to(dtype);
  im.storage = converted.storage();
  im.strides = converted.strides();
  im.offset = converted.offset();
  im.dtype = dtype;
  return true;
}

}  // namespace

int64_t to_pure(Module& model, DType dtype) {
  MINIDL_CHECK(is_float16(dtype), "to_pure: dtype must be f16 or bf16, got ", dtype_name(dtype),
               " (for f32 or f64 use Module::to)");
  NoGradGuard no_grad;
  int64_t n = 0;
  for (auto& [name, m] : model.named_modules()) {
    if (m->type_name() == "BatchNorm2d") continue;
    for (auto& [pn, p] : m->named_parameters(/*recurse=*/false)) n += convert(p, dtype) ? 1 : 0;
    for (auto& [bn, b] : m->named_buffers(/*recurse=*/false)) n += convert(b, dtype) ? 1 : 0;
  }
  autocast_clear_cache();  // any cached copy was made from the old f32 weights
  return n;
}

}  // namespace minidl::nn
