// The f16 staging helpers of the CPU backend (see half.h): the heavy op families compute f16 in
// f32 temporaries that go through the allocator like any other scratch, so the memory statistics
// of a mixed-precision run on the CPU include them. The copies go to the tensors' own backend, so
// the meta device (kernels/meta) stages f16 operands with these same functions and no data.
#include "kernels/cpu/half.h"

#include "core/backend.h"

namespace minidl::cpu {

Tensor widen_half(const Tensor& t) {
  if (!is_half(t)) return t;
  Tensor w = empty(t.shape(), {DType::f32, t.device(), false});
  backend(t.device()).copy(t.detach(), w);
  return w;
}

Tensor f32_output_for(const Tensor& t) {
  if (!is_half(t)) return t;
  return empty(t.shape(), {DType::f32, t.device(), false});
}

void narrow_into(const Tensor& result, const Tensor& dst) {
  if (!dst.defined() || result.same(dst)) return;
  backend(dst.device()).copy(result, dst);
}

}  // namespace minidl::cpu
