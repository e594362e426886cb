// conv2d_workspace_bytes (conv_workspace.h): the CPU convolution's temporaries from the planners
// the kernels use (conv_plan.h), for a shape-only dry run.
#include "kernels/cpu/conv_workspace.h"

#include "kernels/cpu/conv_plan.h"

namespace minidl::cpu {

using namespace conv_detail;

std::vector<int64_t> conv2d_workspace_bytes(ConvPass pass, const Shape& x, const Shape& w, const Shape& y,
                                            const Conv2dOptions& o, DType dtype, bool has_bias) {
  const char* op = pass == ConvPass::Forward         ? "conv2d_forward"
                   : pass == ConvPass::BackwardInput ? "conv2d_backward_input"
                                                     : "conv2d_backward_weight";
  const ConvGeom g = make_geom(x, w, y, o, op);
  std::vector<int64_t> out;
  if (g.n == 0 && pass != ConvPass::BackwardWeight) return out;
  const auto numel = [](const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  };
  if (is_float16(dtype)) {
    // The f32 result first (f32_output_for), then the widened operands (widen_half).
    const int64_t f = static_cast<int64_t>(sizeof(float));
    if (pass == ConvPass::Forward) {
      out = {numel(y) * f, numel(x) * f, numel(w) * f};
      if (has_bias) out.push_back(w[0] * f);
    } else if (pass == ConvPass::BackwardInput) {
      out = {numel(x) * f, numel(y) * f, numel(w) * f};
    } else {
      out = {numel(w) * f, numel(y) * f, numel(x) * f};
    }
    dtype = DType::f32;
  }
  MINIDL_CHECK(dtype == DType::f32 || dtype == DType::f64, op, " (cpu): dtype ", dtype_name(dtype),
               " is not supported (f32, f64, f16 and bf16 only)");
  const auto blocks = [&](auto tag) {
    using T = decltype(tag);
    const Workspace ws = pass == ConvPass::Forward         ? forward_workspace<T>(g)
                         : pass == ConvPass::BackwardInput ? input_workspace<T>(g)
                                                           : weight_workspace<T>(g);
    workspace_blocks<T>(ws, out);
  };
  if (dtype == DType::f32) blocks(float{});
  else blocks(double{});
  return out;
}

}  // namespace minidl::cpu
