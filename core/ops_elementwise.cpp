// Front-ends of the elementwise ops: broadcasting, dtype/device checks with fixes in the message,
// and the backward formulas (gradients are summed back to each operand's shape).
#include <cmath>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {
namespace {

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  MINIDL_CHECK(a.defined() && b.defined(), op, ": undefined tensor operand");
  MINIDL_CHECK(a.device() == b.device(), op, ": tensors on different devices: ", a.meta(), " and ", b.meta(),
               "; move one with .to(Device)");
  MINIDL_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", a.meta(), " and ", b.meta(),
               "; convert one with .to(DType::", dtype_name(a.dtype()), ")");
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

// The output keeps a channels-last operand's format: the first operand with the output's whole
// shape decides (a bias or scalar broadcast into it does not), as PyTorch's TensorIterator does
// for the common cases, so the residual add, ReLU's backward and the AMP casts of a channels-last
// step never transpose.
bool output_channels_last(const Tensor& a, const Tensor& b, const Shape& out_shape) {
  if (out_shape.size() != 4) return false;
  if (a.shape() == out_shape) return prefers_channels_last(a);
  return b.shape() == out_shape && prefers_channels_last(b);
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_pair(a, b, name);
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty_in_format(out_shape, {is_comparison(op) ? DType::boolean : a.dtype(), a.device(), false},
                               output_channels_last(a, b, out_shape));
  backend(a.device()).binary(op, a.detach().expand(out_shape), b.detach().expand(out_shape), out, 1.0);
  return out;
}

Tensor unary(UnaryOp op, const Tensor& a, double scalar = 0.0) {
  MINIDL_CHECK(a.defined(), unary_name(op), ": undefined tensor");
  Tensor out = empty_like(a);   // a channels-last input gives a channels-last output
  backend(a.device()).unary(op, a.detach(), out, scalar);
  return out;
}

using Grads = std::vector<Tensor>;

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MINIDL_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                 " cannot be broadcast (dim ", i, ": ", da, " vs ", db, "); sizes must match or be 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  MINIDL_CHECK(lead >= 0, "sum_to: cannot reduce ", shape_str(g.shape()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < g.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && g.shape()[i] != 1) {
      dims.push_back(i);
    } else {
      MINIDL_CHECK(shape[i - lead] == g.shape()[i], "sum_to: cannot reduce ", shape_str(g.shape()), " to ",
                   shape_str(shape));
    }
  }
  Tensor s = dims.empty() ? g : sum(g, dims, true);
  return s.reshape(shape);
}

// The differentiable binary ops' common part: autocast's promotion (f16 with f32 computes in f32),
// the op, and its node; `make_backward(a, b)` builds the backward from the promoted operands.
template <class MakeBackward>
static Tensor differentiable_binary(BinaryOp op, const Tensor& a0, const Tensor& b0, MakeBackward&& make_backward) {
  Tensor a = a0, b = b0;
  autocast_promote(a, b);
  Tensor out = binary(op, a, b);
  record(binary_name(op), {a, b}, {out}, make_backward(a, b));
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return differentiable_binary(BinaryOp::Add, a, b, [](const Tensor& pa, const Tensor& pb) {
    return [sa = pa.shape(), sb = pb.shape()](const Grads& g) { return Grads{sum_to(g[0], sa), sum_to(g[0], sb)}; };
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return differentiable_binary(BinaryOp::Sub, a, b, [](const Tensor& pa, const Tensor& pb) {
    return [sa = pa.shape(), sb = pb.shape()](const Grads& g) {
      return Grads{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
    };
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return differentiable_binary(BinaryOp::Mul, a, b, [](const Tensor& pa, const Tensor& pb) {
    const bool ra = pa.requires_grad(), rb = pb.requires_grad();
    return [ad = pa.detach(), bd = pb.detach(), ra, rb](const Grads& g) {
      return Grads{ra ? sum_to(mul(g[0], bd), ad.shape()) : Tensor(),
                   rb ? sum_to(mul(g[0], ad), bd.shape()) : Tensor()};
    };
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return differentiable_binary(BinaryOp::Div, a, b, [](const Tensor& pa, const Tensor& pb) {
    const bool ra = pa.requires_grad(), rb = pb.requires_grad();
    return [ad = pa.detach(), bd = pb.detach(), ra, rb](const Grads& g) {
      Tensor ga, gb;
      if (ra) ga = sum_to(div(g[0], bd), ad.shape());
      if (rb) gb = sum_to(neg(div(mul(g[0], ad), mul(bd, bd))), bd.shape());
      return Grads{ga, gb};
    };
  });
}

// Ties split the gradient evenly between the operands, as PyTorch does.
static Tensor minmax(BinaryOp op, const Tensor& a, const Tensor& b) {
  return differentiable_binary(op, a, b, [op](const Tensor& pa, const Tensor& pb) {
    return [op, ad = pa.detach(), bd = pb.detach()](const Grads& g) {
      const DType t = g[0].dtype();
      Tensor win_a = (op == BinaryOp::Maximum ? gt(ad, bd) : lt(ad, bd)).to(t);
      Tensor tie = eq(ad, bd).to(t) * 0.5;
      Tensor wa = win_a + tie;
      Tensor wb = (op == BinaryOp::Maximum ? lt(ad, bd) : gt(ad, bd)).to(t) + tie;
      return Grads{sum_to(mul(g[0], wa), ad.shape()), sum_to(mul(g[0], wb), bd.shape())};
    };
  });
}
Tensor maximum(const Tensor& a, const Tensor& b) { return minmax(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return minmax(BinaryOp::Minimum, a, b); }

Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ge, a, b); }

Tensor neg(const Tensor& a) {
  Tensor out = unary(UnaryOp::Neg, a);
  record("neg", {a}, {out}, [](const Grads& g) { return Grads{neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& a) {
  Tensor out = unary(UnaryOp::Exp, a);
  record("exp", {a}, {out}, [y = out.detach()](const Grads& g) { return Grads{mul(g[0], y)}; });
  return out;
}

Tensor log(const Tensor& a) {
  Tensor out = unary(UnaryOp::Log, a);
  record("log", {a}, {out}, [x = a.detach()](const Grads& g) { return Grads{div(g[0], x)}; });
  return out;
}

Tensor log1p(const Tensor& a) {
  Tensor out = unary(UnaryOp::Log1p, a);
  record("log1p", {a}, {out}, [x = a.detach()](const Grads& g) { return Grads{div(g[0], x + 1.0)}; });
  return out;
}

Tensor sqrt(const Tensor& a) {
  Tensor out = unary(UnaryOp::Sqrt, a);
  record("sqrt", {a}, {out}, [y = out.detach()](const Grads& g) { return Grads{div(g[0], y * 2.0)}; });
  return out;
}

Tensor abs(const Tensor& a) {
  Tensor out = unary(UnaryOp::Abs, a);
  record("abs", {a}, {out}, [x = a.detach()](const Grads& g) {
    const Tensor zero = scalar_tensor(0.0, x.options());
    return Grads{mul(g[0], gt(x, zero).to(x.dtype()) - lt(x, zero).to(x.dtype()))};
  });
  return out;
}

Tensor relu(const Tensor& a) {
  Tensor out = unary(UnaryOp::Relu, a);
  record("relu", {a}, {out}, [y = out.detach()](const Grads& g) {
    Tensor gx = empty_like(y);   // y's format
    backend(y.device()).binary(BinaryOp::ReluGrad, g[0], y, gx, 1.0);
    return Grads{gx};
  });
  return out;
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = unary(UnaryOp::Sigmoid, a);
  record("sigmoid", {a}, {out}, [y = out.detach()](const Grads& g) { return Grads{g[0] * y * (1.0 - y)}; });
  return out;
}

Tensor tanh(const Tensor& a) {
  Tensor out = unary(UnaryOp::Tanh, a);
  record("tanh", {a}, {out}, [y = out.detach()](const Grads& g) { return Grads{g[0] * (1.0 - y * y)}; });
  return out;
}

Tensor square(const Tensor& a) {
  Tensor out = unary(UnaryOp::Square, a);
  record("square", {a}, {out}, [x = a.detach()](const Grads& g) { return Grads{g[0] * x * 2.0}; });
  return out;
}

Tensor pow(const Tensor& a, double p) {
  Tensor out = unary(UnaryOp::Pow, a, p);
  record("pow", {a}, {out}, [x = a.detach(), p](const Grads& g) {
    return Grads{g[0] * unary(UnaryOp::Pow, x, p - 1.0) * p};
  });
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return add(a, scalar_tensor(s, a.options())); }
Tensor operator-(const Tensor& a, double s) { return sub(a, scalar_tensor(s, a.options())); }
Tensor operator*(const Tensor& a, double s) { return mul(a, scalar_tensor(s, a.options())); }
Tensor operator/(const Tensor& a, double s) { return div(a, scalar_tensor(s, a.options())); }
Tensor operator+(double s, const Tensor& a) { return add(scalar_tensor(s, a.options()), a); }
Tensor operator-(double s, const Tensor& a) { return sub(scalar_tensor(s, a.options()), a); }
Tensor operator*(double s, const Tensor& a) { return mul(scalar_tensor(s, a.options()), a); }
Tensor operator/(double s, const Tensor& a) { return div(scalar_tensor(s, a.options()), a); }

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Log1p: return "log1p";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Square: return "square";
    case UnaryOp::Pow: return "pow";
  }
  return "?";
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::ReluGrad: return "relu_backward";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
  }
  return "?";
}

}  // namespace minidl
