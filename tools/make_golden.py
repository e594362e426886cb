#!/usr/bin/python3
# PyTorch is the reference minidl's CPU ops are checked against: this script writes one golden
# safetensors file per op family so the C++ tests (tests/kernels/golden_test.cpp) can compare
# forward outputs and gradients without Python on the machine that runs them.
#
# Re-run (Debian's python3-torch 1.13 CPU and python3-numpy; no pip packages needed):
#     /usr/bin/python3 tools/make_golden.py            # writes tests/golden/*.safetensors
#     /usr/bin/python3 tools/make_golden.py --out DIR  # somewhere else, e.g. to diff
# The output is deterministic (fixed seeds, no threads-dependent ops): re-running it rewrites
# identical bytes, so a diff in tests/golden/ means the script (or PyTorch) changed.
#
# File layout, read by tests/support/safetensors_reader.cpp: for each case <c>, tensors
# "<c>.<input>" (the op's inputs, f32 or i64), "<c>.gy" (the upstream gradient given to
# backward), "<c>.y" (the output), "<c>.g<input>" (the gradient of each input that requires grad)
# and extras such as "<c>.running_mean_new". __metadata__ maps "cases" to a JSON list of the case
# names and each "<c>" to a JSON object {"op": ..., "inputs": [...], <scalar parameters>}.
#
# Reference values are computed in float64 from inputs already rounded to float32, then stored as
# float32, so the golden numbers carry no float32 rounding of their own. Each case is also rerun in
# float32 PyTorch and the script prints a note when that alone uses over a quarter of the C++
# tolerance (REL_TOL), i.e. when a case is too ill-conditioned for a fair float32 comparison.
# A new family must also be added to kFamilies in golden_test.cpp (GoldenFiles.AllListed checks).
import argparse
import json
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SEED = 20240517
# The tolerance of tests/kernels/golden_test.cpp: max|a - b| <= REL_TOL * max(1, max|b|).
REL_TOL = 1e-5
ROOT = Path(__file__).resolve().parent.parent

DTYPE_CODES = {
    torch.float32: ("F32", np.float32),
    torch.float64: ("F64", np.float64),
    torch.int64: ("I64", np.int64),
    torch.int32: ("I32", np.int32),
    torch.uint8: ("U8", np.uint8),
    torch.bool: ("BOOL", np.bool_),
}


def write_safetensors(path, tensors, metadata):
    # Written by hand (not the `safetensors` package) so the generator needs only Debian packages.
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        code, np_type = DTYPE_CODES[t.dtype]
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)  # numpy has no bfloat16: the bits as they are
        data = t.numpy().astype(np_type).astype(np.dtype(np_type).newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as the spec recommends
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


class Family:
    def __init__(self, name):
        self.name = name
        self.tensors = {}
        self.cases = []
        self.meta = {}
        self.f32_ratio = {}

    def add(self, case, op, inputs, fn, grad, params=None, gy=None, extras=None):
        """inputs: ordered {name: tensor} (f64 floating, already f32-representable, or i64);
        fn(**inputs) -> output; grad: input names whose gradient is stored;
        extras(inputs_after_forward) -> {suffix: tensor} stored after the forward (running stats)."""
        assert case not in self.cases, case
        params = dict(params or {})
        leaves = {}
        for k, v in inputs.items():
            if v is None:
                continue
            leaf = v.detach().clone()
            if k in grad:
                leaf.requires_grad_(True)
            leaves[k] = leaf
        # Inputs are stored before the forward: batch norm updates its running stats in place.
        for k, v in leaves.items():
            self.tensors[f"{case}.{k}"] = to_storage(v)
        y = fn(**leaves)
        self.tensors[f"{case}.y"] = to_storage(y)
        if extras:
            for k, v in extras(leaves).items():
                self.tensors[f"{case}.{k}"] = to_storage(v)
        if grad:
            if gy is None:
                gy = rnd(y.shape)
            gs = torch.autograd.grad(y, [leaves[k] for k in grad], gy)
            self.tensors[f"{case}.gy"] = to_storage(gy)
            for k, g in zip(grad, gs):
                self.tensors[f"{case}.g{k}"] = to_storage(g)
        params["op"] = op
        params["inputs"] = [k for k in leaves]
        self.meta[case] = json.dumps(params, sort_keys=True)
        self.cases.append(case)
        self.f32_ratio[case] = self.f32_check(case, inputs, fn, grad, extras)

    def f32_check(self, case, inputs, fn, grad, extras):
        """Reruns the case in float32 PyTorch and returns the worst error / tolerance bound over every
        stored result: a value near or above 1 means the C++ tolerance is unrealistic for float32."""
        leaves = {}
        for k, v in inputs.items():
            if v is None:
                continue
            leaf = v.detach().clone()
            if leaf.is_floating_point():
                leaf = leaf.to(torch.float32)
            if k in grad:
                leaf.requires_grad_(True)
            leaves[k] = leaf
        got = {"y": fn(**leaves)}
        if extras:
            got.update(extras(leaves))
        if grad:
            gy = self.tensors[f"{case}.gy"]
            gs = torch.autograd.grad(got["y"], [leaves[k] for k in grad], gy)
            got.update({f"g{k}": g for k, g in zip(grad, gs)})
        worst = 0.0
        for k, v in got.items():
            ref = self.tensors[f"{case}.{k}"].to(torch.float64)
            bound = REL_TOL * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
            err = (v.detach().to(torch.float64) - ref).abs().max().item() if ref.numel() else 0.0
            worst = max(worst, err / bound)
        return worst

    def write(self, out_dir):
        meta = dict(self.meta)
        meta["cases"] = json.dumps(self.cases)
        meta["family"] = self.name
        meta["generator"] = "tools/make_golden.py"
        meta["torch_version"] = torch.__version__
        path = out_dir / f"{self.name}.safetensors"
        write_safetensors(path, self.tensors, meta)
        return path


def to_storage(t):
    t = t.detach().clone()  # a snapshot: batch norm mutates its running-stat inputs afterwards
    return t.to(torch.float32) if t.is_floating_point() else t


def f32(t):
    # Round to float32 and back so the f64 reference sees exactly the inputs the C++ test gets.
    return t.to(torch.float32).to(torch.float64)


def rnd(shape, scale=1.0, shift=0.0):
    return f32(torch.randn(tuple(shape), dtype=torch.float64) * scale + shift)


def uni(shape, lo, hi):
    return f32(torch.rand(tuple(shape), dtype=torch.float64) * (hi - lo) + lo)


def away_from_zero(shape, lo, hi):
    # Magnitudes in [lo, hi) with random signs: for divisors and abs (no kink at 0).
    sign = torch.where(torch.rand(tuple(shape), dtype=torch.float64) < 0.5, -1.0, 1.0)
    return f32(sign * (torch.rand(tuple(shape), dtype=torch.float64) * (hi - lo) + lo))


def all_dims(x, dims):
    return tuple(dims) if dims else tuple(range(x.dim()))


# ---------------------------------------------------------------------------------------------
def elementwise():
    f = Family("elementwise")
    # Named parameters: Family.add calls fn(**inputs).
    binary = {name: (lambda a, b, fn=fn: fn(a, b)) for name, fn in
              [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
               ("maximum", torch.maximum), ("minimum", torch.minimum)]}
    f.add("add_same", "add", {"a": rnd([5, 7]), "b": rnd([5, 7])}, binary["add"], ["a", "b"])
    f.add("add_bcast", "add", {"a": rnd([2, 3, 4]), "b": rnd([3, 1])}, binary["add"], ["a", "b"])
    f.add("sub_bcast_both", "sub", {"a": rnd([4, 1, 3]), "b": rnd([2, 3])}, binary["sub"], ["a", "b"])
    f.add("mul_bcast", "mul", {"a": rnd([2, 3, 4]), "b": rnd([4])}, binary["mul"], ["a", "b"])
    f.add("mul_bcast_ones", "mul", {"a": rnd([3, 4]), "b": rnd([1, 1])}, binary["mul"], ["a", "b"])
    f.add("div_bcast", "div", {"a": rnd([3, 4]), "b": away_from_zero([3, 1], 0.5, 2.0)}, binary["div"], ["a", "b"])
    f.add("div_bcast_lhs", "div", {"a": rnd([4]), "b": away_from_zero([2, 3, 4], 0.5, 2.0)}, binary["div"],
          ["a", "b"])
    # Random floats never tie, so PyTorch's tie rule (half to each) never matters here.
    f.add("maximum_bcast", "maximum", {"a": rnd([3, 4]), "b": rnd([4])}, binary["maximum"], ["a", "b"])
    f.add("minimum_same", "minimum", {"a": rnd([2, 5]), "b": rnd([2, 5])}, binary["minimum"], ["a", "b"])

    unary = {
        "exp": (torch.exp, lambda s: uni(s, -3.0, 3.0)),
        "log": (torch.log, lambda s: uni(s, 0.1, 5.0)),
        "log1p": (torch.log1p, lambda s: uni(s, -0.5, 3.0)),
        "sqrt": (torch.sqrt, lambda s: uni(s, 0.1, 4.0)),
        "sigmoid": (torch.sigmoid, lambda s: uni(s, -6.0, 6.0)),
        "tanh": (torch.tanh, lambda s: uni(s, -3.0, 3.0)),
        "relu": (torch.relu, lambda s: away_from_zero(s, 0.01, 2.0)),
        "abs": (torch.abs, lambda s: away_from_zero(s, 0.01, 2.0)),
        "neg": (torch.neg, lambda s: rnd(s)),
        "square": (torch.square, lambda s: rnd(s)),
    }
    for name, (fn, gen) in unary.items():
        f.add(name, name, {"x": gen([3, 5])}, lambda x, fn=fn: fn(x), ["x"])
    f.add("sigmoid_wide", "sigmoid", {"x": uni([4, 6], -20.0, 20.0)}, lambda x: torch.sigmoid(x), ["x"])

    for case, exponent, gen in [("pow_2", 2.0, lambda s: rnd(s)),
                                ("pow_3_negative_base", 3.0, lambda s: rnd(s)),
                                ("pow_half", 0.5, lambda s: uni(s, 0.2, 4.0)),
                                ("pow_neg_1_5", -1.5, lambda s: uni(s, 0.5, 3.0)),
                                ("pow_1_7", 1.7, lambda s: uni(s, 0.2, 3.0))]:
        f.add(case, "pow", {"x": gen([3, 4])}, lambda x, e=exponent: torch.pow(x, e), ["x"],
              {"exponent": exponent})
    return f


def reductions():
    f = Family("reductions")

    def red(fn):
        return lambda dims, keepdim: (lambda x: fn(x, all_dims(x, dims), keepdim))

    ops = {"sum": red(lambda x, d, k: torch.sum(x, dim=d, keepdim=k)),
           "mean": red(lambda x, d, k: torch.mean(x, dim=d, keepdim=k)),
           # amax/amin split the gradient evenly among ties, as minidl's max/min do.
           "max": red(lambda x, d, k: torch.amax(x, dim=d, keepdim=k)),
           "min": red(lambda x, d, k: torch.amin(x, dim=d, keepdim=k))}
    for op in ["sum", "mean", "max"]:
        for case, dims, keepdim in [("all", [], False), ("all_keepdim", [], True), ("d1_keepdim", [1], True),
                                    ("d02", [0, 2], False), ("dlast", [-1], False),
                                    ("d0_keepdim", [0], True)]:
            f.add(f"{op}_{case}", op, {"x": rnd([3, 4, 5])}, ops[op](dims, keepdim), ["x"],
                  {"dims": dims, "keepdim": keepdim})
    f.add("sum_4d_d13", "sum", {"x": rnd([2, 3, 4, 5])}, ops["sum"]([1, 3], False), ["x"],
          {"dims": [1, 3], "keepdim": False})
    f.add("mean_4d_hw_keepdim", "mean", {"x": rnd([2, 3, 4, 5])}, ops["mean"]([2, 3], True), ["x"],
          {"dims": [2, 3], "keepdim": True})
    f.add("min_d0", "min", {"x": rnd([3, 4, 5])}, ops["min"]([0], False), ["x"], {"dims": [0], "keepdim": False})
    # Small integers tie often: the gradient is shared evenly among the maxima.
    ties = f32(torch.randint(0, 3, (4, 6)).to(torch.float64))
    f.add("max_ties_d1", "max", {"x": ties}, ops["max"]([1], False), ["x"], {"dims": [1], "keepdim": False})
    f.add("max_ties_all", "max", {"x": ties.clone()}, ops["max"]([], False), ["x"], {"dims": [], "keepdim": False})

    for case, dim, keepdim, x in [("argmax_d1", 1, False, rnd([3, 4, 5])),
                                  ("argmax_dlast_keepdim", -1, True, rnd([3, 4, 5])),
                                  ("argmax_d0", 0, False, rnd([3, 4, 5])),
                                  ("argmax_ties_d1", 1, False, ties.clone())]:
        f.add(case, "argmax", {"x": x}, lambda x, d=dim, k=keepdim: torch.argmax(x, dim=d, keepdim=k), [],
              {"dim": dim, "keepdim": keepdim})
    f.add("argmin_d1", "argmin", {"x": rnd([3, 4, 5])}, lambda x: torch.argmin(x, dim=1), [],
          {"dim": 1, "keepdim": False})
    return f


def matmul():
    f = Family("matmul")
    for case, sa, sb in [("mm_2d", [3, 4], [4, 5]),
                         ("batched_bcast", [2, 1, 3, 4], [5, 4, 6]),
                         ("batched_rhs_2d", [2, 3, 4], [4, 5]),
                         ("batched_same", [3, 2, 4], [3, 4, 5]),
                         ("vec_mat", [4], [4, 5]),
                         ("mat_vec", [3, 4], [4]),
                         ("vec_batched", [4], [2, 4, 3]),
                         ("vec_vec", [6], [6]),
                         ("mm_k64", [8, 64], [64, 7])]:
        f.add(case, "matmul", {"a": rnd(sa), "b": rnd(sb)}, lambda a, b: torch.matmul(a, b), ["a", "b"])
    return f


def linear():
    f = Family("linear")
    f.add("bias_2d", "linear", {"x": rnd([4, 6]), "w": rnd([3, 6], 0.4), "b": rnd([3])}, lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"])
    f.add("nobias_3d", "linear", {"x": rnd([2, 3, 6]), "w": rnd([5, 6], 0.4)}, lambda x, w: F.linear(x, w), ["x", "w"])
    f.add("bias_1d_input", "linear", {"x": rnd([6]), "w": rnd([4, 6], 0.4), "b": rnd([4])},
          lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"])
    f.add("bias_wide", "linear", {"x": rnd([5, 96]), "w": rnd([10, 96], 0.1), "b": rnd([10])},
          lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"])
    return f


def conv2d():
    f = Family("conv2d")
    #        case                   x shape         O  kernel  stride  padding dilation bias  groups
    for case, xs, o, k, s, p, d, bias, g in [
            ("k3_s1_p0_bias", [2, 3, 7, 7], 4, [3, 3], [1, 1], [0, 0], [1, 1], True, 1),
            ("k3_s1_p1_nobias", [2, 3, 6, 6], 5, [3, 3], [1, 1], [1, 1], [1, 1], False, 1),
            ("k3_s2_p1_bias", [2, 4, 9, 9], 6, [3, 3], [2, 2], [1, 1], [1, 1], True, 1),
            ("k3_s2_p1_even", [1, 3, 8, 8], 4, [3, 3], [2, 2], [1, 1], [1, 1], False, 1),
            ("k3_dil2_p2", [1, 3, 10, 10], 4, [3, 3], [1, 1], [2, 2], [2, 2], True, 1),
            ("k1_nobias", [2, 8, 5, 5], 4, [1, 1], [1, 1], [0, 0], [1, 1], False, 1),
            ("k1_s2_downsample", [2, 8, 6, 6], 16, [1, 1], [2, 2], [0, 0], [1, 1], False, 1),
            ("k7_s2_p3_stem", [2, 3, 20, 20], 8, [7, 7], [2, 2], [3, 3], [1, 1], False, 1),
            ("rect_k3x2_s21_p10", [1, 2, 5, 8], 3, [3, 2], [2, 1], [1, 0], [1, 1], True, 1),
            ("k3_p3_dil2_s2", [1, 2, 9, 9], 3, [3, 3], [2, 2], [3, 3], [2, 2], True, 1)]:
        # groups > 1 is left out until minidl's conv2d supports it (it throws "not supported yet").
        c = xs[1]
        fan_in = c // g * k[0] * k[1]
        inputs = {"x": rnd(xs), "w": rnd([o, c // g] + k, 1.0 / fan_in ** 0.5), "b": rnd([o]) if bias else None}
        f.add(case, "conv2d", inputs,
              lambda x, w, b=None, s=s, p=p, d=d, g=g: F.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=g),
              ["x", "w", "b"] if bias else ["x", "w"],
              {"stride": s, "padding": p, "dilation": d, "groups": g})
    return f


def batch_norm():
    f = Family("batch_norm")

    def bn_case(case, xs, training, momentum, eps, affine=True, x_scale=1.0, x_shift=0.0):
        c = xs[1]
        inputs = {"x": rnd(xs, x_scale, x_shift),
                  "w": uni([c], 0.5, 1.5) if affine else None,
                  "b": rnd([c], 0.3) if affine else None,
                  "running_mean": rnd([c], 0.2),
                  "running_var": uni([c], 0.5, 2.0)}

        def fn(x, running_mean, running_var, w=None, b=None):
            return F.batch_norm(x, running_mean, running_var, w, b, training=training, momentum=momentum, eps=eps)

        extras = None
        if training:
            def extras(leaves):
                return {"running_mean_new": leaves["running_mean"], "running_var_new": leaves["running_var"]}
        f.add(case, "batch_norm", inputs, fn, ["x", "w", "b"] if affine else ["x"],
              {"training": training, "momentum": momentum, "eps": eps}, extras=extras)

    bn_case("train_4d", [4, 3, 5, 5], True, 0.1, 1e-5)
    bn_case("train_4d_shifted", [3, 4, 2, 3], True, 0.3, 1e-3, x_scale=2.0, x_shift=1.5)
    bn_case("train_2d", [8, 5], True, 0.1, 1e-5)
    bn_case("train_noaffine", [2, 3, 4, 4], True, 0.1, 1e-5, affine=False)
    bn_case("eval_4d", [2, 3, 4, 4], False, 0.1, 1e-5)
    bn_case("eval_2d", [6, 4], False, 0.1, 1e-5, x_shift=0.5)
    return f


def pool_params(kernel, stride, padding, ceil_mode, count_include_pad=True):
    return {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad}


def max_pool2d():
    f = Family("max_pool2d")
    # stride [0, 0] is minidl's "same as the kernel", PyTorch's default; the reference uses None.
    for case, xs, k, s, p, ceil in [("k3_s2_p1", [2, 3, 9, 9], [3, 3], [2, 2], [1, 1], False),
                                    ("k3_s2_p1_even", [1, 2, 8, 8], [3, 3], [2, 2], [1, 1], False),
                                    ("k2_default_stride", [2, 2, 6, 6], [2, 2], [0, 0], [0, 0], False),
                                    ("k2_odd_floor", [1, 2, 7, 7], [2, 2], [2, 2], [0, 0], False),
                                    ("k2_ceil", [1, 2, 7, 7], [2, 2], [2, 2], [0, 0], True),
                                    ("k3_s2_ceil", [1, 2, 8, 8], [3, 3], [2, 2], [0, 0], True),
                                    ("k2_s2_p1_ceil", [1, 2, 6, 6], [2, 2], [2, 2], [1, 1], True),
                                    ("k3_s1_p1", [1, 3, 5, 5], [3, 3], [1, 1], [1, 1], False),
                                    ("rect_k2x3", [1, 2, 6, 9], [2, 3], [0, 0], [0, 1], False)]:
        torch_stride = None if s == [0, 0] else s
        f.add(case, "max_pool2d", {"x": rnd(xs)},
              lambda x, k=k, ts=torch_stride, p=p, ceil=ceil: F.max_pool2d(x, k, ts, p, ceil_mode=ceil),
              ["x"], pool_params(k, s, p, ceil))
    return f


def avg_pool2d():
    f = Family("avg_pool2d")
    for case, xs, k, s, p, ceil, incl in [("k2_default_stride", [2, 3, 6, 6], [2, 2], [0, 0], [0, 0], False, True),
                                          ("k3_s2_p1_incl", [2, 2, 7, 7], [3, 3], [2, 2], [1, 1], False, True),
                                          ("k3_s2_p1_excl", [2, 2, 7, 7], [3, 3], [2, 2], [1, 1], False, False),
                                          ("k3_s1_p1_excl", [1, 2, 5, 5], [3, 3], [1, 1], [1, 1], False, False),
                                          ("k3_s2_ceil_incl", [1, 2, 8, 8], [3, 3], [2, 2], [1, 1], True, True),
                                          ("k3_s2_ceil_excl", [1, 2, 8, 8], [3, 3], [2, 2], [1, 1], True, False),
                                          ("k2_ceil_nopad", [1, 2, 7, 7], [2, 2], [2, 2], [0, 0], True, True)]:
        torch_stride = None if s == [0, 0] else s
        f.add(case, "avg_pool2d", {"x": rnd(xs)},
              lambda x, k=k, ts=torch_stride, p=p, ceil=ceil, incl=incl:
                  F.avg_pool2d(x, k, ts, p, ceil_mode=ceil, count_include_pad=incl),
              ["x"], pool_params(k, s, p, ceil, incl))
    return f


def adaptive_avg_pool2d():
    f = Family("adaptive_avg_pool2d")
    for case, xs in [("global_5x7", [2, 3, 5, 7]), ("global_1x1", [2, 4, 1, 1]), ("global_7x7", [1, 8, 7, 7])]:
        f.add(case, "adaptive_avg_pool2d", {"x": rnd(xs)}, lambda x: F.adaptive_avg_pool2d(x, 1), ["x"],
              {"output_size": [1, 1]})
    return f


def softmax():
    f = Family("softmax")
    for op, fn in [("softmax", F.softmax), ("log_softmax", F.log_softmax)]:
        for case, xs, dim, scale in [("3d_d1", [2, 3, 4], 1, 1.0),
                                     ("3d_dlast", [2, 3, 4], -1, 1.0),
                                     ("3d_d0", [2, 3, 4], 0, 1.0),
                                     ("2d_d1", [4, 10], 1, 1.0),
                                     # Logits near +-200 overflow exp() in f32 without the max shift.
                                     ("2d_large", [3, 6], 1, 100.0)]:
            f.add(f"{op}_{case}", op, {"x": rnd(xs, scale)}, lambda x, fn=fn, d=dim: fn(x, dim=d), ["x"],
                  {"dim": dim})
    return f


def losses():
    f = Family("losses")
    n, c = 6, 5
    for red in ["mean", "sum", "none"]:
        for ls in [0.0, 0.1]:
            case = f"cross_entropy_{red}" + ("_ls" if ls else "")
            f.add(case, "cross_entropy", {"x": rnd([n, c], 1.5), "target": torch.randint(0, c, (n,))},
                  lambda x, target, r=red, s=ls: F.cross_entropy(x, target, reduction=r, label_smoothing=s), ["x"],
                  {"reduction": red, "label_smoothing": ls})
    f.add("cross_entropy_large_logits", "cross_entropy", {"x": rnd([4, 3], 60.0), "target": torch.tensor([0, 1, 2, 1])},
          lambda x, target: F.cross_entropy(x, target), ["x"], {"reduction": "mean", "label_smoothing": 0.0})
    for red in ["mean", "sum", "none"]:
        f.add(f"nll_loss_{red}", "nll_loss",
              {"x": f32(F.log_softmax(rnd([n, c]), dim=1)), "target": torch.randint(0, c, (n,))},
              lambda x, target, r=red: F.nll_loss(x, target, reduction=r), ["x"], {"reduction": red})

    def bce_target(shape):
        hard = torch.randint(0, 2, shape).to(torch.float64)
        soft = uni(shape, 0.0, 1.0)
        return f32(torch.where(torch.rand(tuple(shape)) < 0.5, hard, soft))

    for red in ["mean", "sum", "none"]:
        f.add(f"bce_logits_{red}", "binary_cross_entropy_with_logits",
              {"x": rnd([4, 3], 2.0), "target": bce_target([4, 3])},
              lambda x, target, r=red: F.binary_cross_entropy_with_logits(x, target, reduction=r), ["x"],
              {"reduction": red})
    # |x| ~ 30: exp(|x|) is ~1e13 and 1 + exp(-|x|) rounds to 1; a naive log(1 + exp(-x)) loses it all.
    big = away_from_zero([4, 4], 25.0, 35.0)
    f.add("bce_logits_large_none", "binary_cross_entropy_with_logits",
          {"x": big, "target": f32(torch.randint(0, 2, (4, 4)).to(torch.float64))},
          lambda x, target: F.binary_cross_entropy_with_logits(x, target, reduction="none"), ["x"],
          {"reduction": "none"})
    f.add("bce_logits_large_mean", "binary_cross_entropy_with_logits",
          {"x": big.clone(), "target": f32(torch.randint(0, 2, (4, 4)).to(torch.float64))},
          lambda x, target: F.binary_cross_entropy_with_logits(x, target), ["x"], {"reduction": "mean"})
    # |x| ~ 100: exp(|x|) overflows float32 outright.
    f.add("bce_logits_extreme_none", "binary_cross_entropy_with_logits",
          {"x": away_from_zero([2, 4], 90.0, 110.0), "target": f32(torch.randint(0, 2, (2, 4)).to(torch.float64))},
          lambda x, target: F.binary_cross_entropy_with_logits(x, target, reduction="none"), ["x"],
          {"reduction": "none"})
    return f


def composite():
    # The small CNN pattern end to end: any mismatch between ops' backward conventions (layouts,
    # saved tensors, accumulation) shows up here even when every op passes alone.
    f = Family("composite")
    n, cin, h, cout, classes = 4, 3, 8, 4, 3
    inputs = {"x": rnd([n, cin, h, h]),
              "conv_w": rnd([cout, cin, 3, 3], 1.0 / (cin * 9) ** 0.5),
              "conv_b": rnd([cout], 0.1),
              "bn_w": uni([cout], 0.5, 1.5),
              "bn_b": rnd([cout], 0.1),
              "running_mean": torch.zeros(cout, dtype=torch.float64),
              "running_var": torch.ones(cout, dtype=torch.float64),
              "lin_w": rnd([classes, cout * (h // 2) ** 2], 1.0 / (cout * (h // 2) ** 2) ** 0.5),
              "lin_b": rnd([classes], 0.1),
              "target": torch.tensor([0, 2, 1, 2])}

    def block(x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, lin_w, lin_b, target):
        y = F.conv2d(x, conv_w, conv_b, stride=1, padding=1)
        y = F.batch_norm(y, running_mean, running_var, bn_w, bn_b, training=True, momentum=0.1, eps=1e-5)
        y = F.max_pool2d(F.relu(y), 2)
        y = F.linear(torch.flatten(y, 1), lin_w, lin_b)
        return F.cross_entropy(y, target)

    f.add("conv_bn_relu_pool_linear_ce", "composite_block", inputs, block,
          ["x", "conv_w", "conv_b", "bn_w", "bn_b", "lin_w", "lin_b"],
          {"conv_stride": [1, 1], "conv_padding": [1, 1], "bn_training": True, "bn_momentum": 0.1, "bn_eps": 1e-5,
           "pool_kernel": [2, 2], "pool_stride": [0, 0], "reduction": "mean", "label_smoothing": 0.0},
          gy=torch.tensor(1.0, dtype=torch.float64),
          extras=lambda leaves: {"running_mean_new": leaves["running_mean"],
                                 "running_var_new": leaves["running_var"]})
    return f


FAMILIES = [elementwise, reductions, matmul, linear, conv2d, batch_norm, max_pool2d, avg_pool2d,
            adaptive_avg_pool2d, softmax, losses, composite]


def main():
    ap = argparse.ArgumentParser(description="Write the PyTorch golden files minidl tests against.")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # bit-identical reruns regardless of the machine
    total = 0
    for make in FAMILIES:
        torch.manual_seed(SEED)  # per family, so adding a case to one family leaves the others unchanged
        fam = make()
        path = fam.write(args.out)
        size = path.stat().st_size
        total += size
        tight = {c: r for c, r in fam.f32_ratio.items() if r > 0.25}
        for c, r in sorted(tight.items(), key=lambda kv: -kv[1]):
            print(f"  note: float32 PyTorch uses {r:.2f} of the tolerance on {fam.name}/{c}")
        print(f"{path}: {len(fam.cases)} cases, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
