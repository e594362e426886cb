// matmul and linear. Everything reduces to one differentiable batched product [B,M,K]x[B,K,N];
// NumPy's 1-D and broadcast-batch rules are expressed with views around it, so their gradients
// come from the views' own backward (expand sums back, unsqueeze reshapes back).
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/flop_count.h"
#include "core/ops.h"

namespace minidl {
namespace {

Tensor bmm_like(const Tensor& x, const Tensor& y, const Tensor& like);

// a [B,M,K], b [B,K,N] with equal B (strides arbitrary).
Tensor bmm(const Tensor& a, const Tensor& b) {
  const int64_t B = a.shape()[0], M = a.shape()[1], N = b.shape()[2];
  count_flops(2.0 * static_cast<double>(B * M * N) * static_cast<double>(a.shape()[2]));
  Tensor out = empty({B, M, N}, a.options());
  backend(a.device()).matmul(a.detach(), b.detach(), out);
  const bool ra = a.requires_grad(), rb = b.requires_grad();
  record("matmul", {a, b}, {out}, [ad = a.detach(), bd = b.detach(), ra, rb](const std::vector<Tensor>& g) {
    Tensor ga, gb;
    if (ra) ga = bmm_like(g[0], bd.transpose(1, 2), ad);
    if (rb) gb = bmm_like(ad.transpose(1, 2), g[0], bd);
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

// x @ y laid out like `like` (same shape): when `like` is a transposed contiguous matrix (a
// Linear weight used as weight.t()), the product is computed transposed, (y^T x^T)^T, so the
// gradient reaching the parameter is contiguous in its own layout. Otherwise every accumulation
// into that parameter's .grad would be a transposed, cache-hostile add (5x the GEMM's time for
// the Keras CNN's 41M-weight dense layer).
Tensor bmm_like(const Tensor& x, const Tensor& y, const Tensor& like) {
  const bool transposed = like.shape()[1] > 1 && like.shape()[2] > 1 && like.strides()[1] == 1 &&
                          like.strides()[2] >= like.shape()[1];
  if (!transposed) return bmm(x, y);
  return bmm(y.transpose(1, 2), x.transpose(1, 2)).transpose(1, 2);
}

}  // namespace

Tensor matmul(const Tensor& a_orig, const Tensor& b_orig) {
  MINIDL_CHECK(a_orig.defined() && b_orig.defined(), "matmul: undefined operand");
  const Tensor a_in = autocast_to_low(a_orig), b_in = autocast_to_low(b_orig);  // autocast: GEMMs in f16
  MINIDL_CHECK(a_in.device() == b_in.device(), "matmul: tensors on different devices: ", a_in.meta(), " and ",
               b_in.meta(), "; move one with .to(Device)");
  MINIDL_CHECK(a_in.dtype() == b_in.dtype(), "matmul: dtype mismatch: ", a_in.meta(), " and ", b_in.meta(),
               "; convert one with .to(DType::", dtype_name(a_in.dtype()), ")");
  MINIDL_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: both operands need at least 1 dim, got ",
               shape_str(a_in.shape()), " and ", shape_str(b_in.shape()));
  const bool a_vec = a_in.dim() == 1, b_vec = b_in.dim() == 1;
  Tensor a = a_vec ? a_in.unsqueeze(0) : a_in;    // [K] -> [1,K]
  Tensor b = b_vec ? b_in.unsqueeze(1) : b_in;    // [K] -> [K,1]
  const int64_t M = a.size(-2), K = a.size(-1), K2 = b.size(-2), N = b.size(-1);
  MINIDL_CHECK(K == K2, "matmul: inner dimensions differ: ", shape_str(a_in.shape()), " x ", shape_str(b_in.shape()),
               " (", K, " vs ", K2, "); the last dim of the first operand must equal the second-to-last of the "
               "second (transpose one of them?)");
  const Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(ba, bb, "matmul");
  const int64_t B = numel_of(batch);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), {M, K});
  eb.insert(eb.end(), {K, N});
  Tensor a3 = a.expand(ea).reshape({B, M, K});
  Tensor b3 = b.expand(eb).reshape({B, K, N});
  Tensor out = bmm(a3, b3);
  Shape os = batch;
  if (!a_vec) os.push_back(M);
  if (!b_vec) os.push_back(N);
  return out.reshape(os);
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  MINIDL_CHECK(x_in.defined() && weight_in.defined(), "linear: undefined input or weight");
  const Tensor x = autocast_to_low(x_in), weight = autocast_to_low(weight_in), bias = autocast_to_low(bias_in);
  MINIDL_CHECK(weight.dim() == 2, "linear: weight must be [out_features, in_features], got ",
               shape_str(weight.shape()));
  MINIDL_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", shape_str(x.shape()),
               " has ", (x.dim() ? x.size(-1) : 0), " features but weight ", shape_str(weight.shape()), " expects ",
               weight.size(1));
  if (bias.defined()) {
    MINIDL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias ", shape_str(bias.shape()),
                 " does not match weight ", shape_str(weight.shape()), " (expected [", weight.size(0), "])");
  }
  Tensor y = matmul(x, weight.t());
  return bias.defined() ? add(y, bias) : y;
}

}  // namespace minidl
