#!/usr/bin/python3
# torch.optim is the reference minidl's optimizers must match update for update: this script runs
# SGD, Adam and AdamW (PyTorch 1.13) for 20 steps on fixed gradients and writes everything to
# tests/golden/optim/optim.safetensors, read by tests/optim/optimizer_golden_test.cpp without Python.
#
# Re-run (Debian's python3-torch 1.13 and python3-numpy; no pip packages needed):
#     /usr/bin/python3 tools/make_golden_optim.py            # writes tests/golden/optim/optim.safetensors
#     /usr/bin/python3 tools/make_golden_optim.py --out DIR  # somewhere else, e.g. to diff
# Deterministic (fixed seed, one thread): a rerun rewrites identical bytes.
#
# Layout, for each case <c> (parameters numbered k = 0, 1, 2 in group order; steps s = 1..20):
#   "<c>.p<k>"            initial parameter (f32)
#   "<c>.g<k>.<s>"        gradient given before step s; absent where the parameter gets none
#   "<c>.p<k>.<s>"        parameter after step s, torch.optim in float32
#   "<c>.f64.p<k>.<s>"    the same run in float64 (parameters and gradients cast from the f32 ones)
#   "<c>.state.<g>.<i>.<buffer>"  final optimizer state (f32), named as minidl's state_dict() names
#                         it: momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq, step (i64)
# __metadata__: "cases" -> JSON list of case names; "<c>" -> JSON {"optimizer": "sgd"|"adam"|"adamw",
# "steps": 20, "num_params": 3, "groups": [{"params": [k...], "lr": ..., "weight_decay": ...,
# <every other hyper-parameter by minidl's option name (betas split into beta1/beta2)>}]}.
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import write_safetensors  # noqa: E402  (the one hand-written safetensors writer)

SEED = 20240611
STEPS = 20
SHAPES = [(3, 4), (5,), (2, 3, 2)]
ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
# Hyper-parameters minidl knows; PyTorch's bookkeeping keys (foreach, capturable, ...) are left out.
OPTION_NAMES = {"lr", "weight_decay", "momentum", "dampening", "nesterov", "maximize", "eps", "amsgrad"}

# name, optimizer, [(parameter indices, group options)], defaults, {step: [parameters without grad]}
CASES = [
    ("sgd_plain", "sgd", [([0, 1, 2], {})], dict(lr=0.1), {}),
    ("sgd_momentum", "sgd", [([0, 1, 2], {})], dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2), {}),
    ("sgd_nesterov", "sgd", [([0, 1, 2], {})], dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), {}),
    ("sgd_maximize", "sgd", [([0, 1, 2], {})], dict(lr=0.02, momentum=0.5, maximize=True), {1: [2], 6: [0]}),
    ("adam", "adam", [([0, 1, 2], {})], dict(lr=1e-2), {}),
    ("adam_amsgrad_wd", "adam", [([0, 1, 2], {})], dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True),
     {3: [1], 4: [1]}),
    ("adamw", "adamw", [([0, 1, 2], {})], dict(lr=1e-2, weight_decay=0.05), {}),
    ("adamw_amsgrad", "adamw", [([0, 1, 2], {})], dict(lr=2e-2, eps=1e-6, amsgrad=True, maximize=True), {2: [0]}),
    ("groups", "sgd", [([0, 1], {}), ([2], dict(lr=0.01, weight_decay=1e-2))], dict(lr=0.1, momentum=0.9), {}),
]


def run(opt_name, groups_spec, defaults, params0, grads, dtype):
    params = [p.detach().clone().to(dtype).requires_grad_(True) for p in params0]
    groups = [dict(params=[params[k] for k in ks], **opts) for ks, opts in groups_spec]
    opt = OPTIMIZERS[opt_name](groups, **defaults)
    history = []
    for s in range(STEPS):
        for k, p in enumerate(params):
            g = grads[s][k]
            p.grad = None if g is None else g.to(dtype).clone()
        opt.step()
        history.append([p.detach().clone() for p in params])
    return opt, params, history


def group_meta(opt, groups_spec):
    out = []
    for (ks, _), g in zip(groups_spec, opt.param_groups):
        m = {"params": ks}
        for key, v in g.items():
            if key == "betas":
                m["beta1"], m["beta2"] = float(v[0]), float(v[1])
            elif key in OPTION_NAMES:
                m[key] = v
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser(description="Write the torch.optim golden file minidl's optimizers test against.")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "optim")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    tensors, meta = {}, {}
    names = []
    for name, opt_name, groups_spec, defaults, missing in CASES:
        names.append(name)
        params0 = [torch.randn(s) for s in SHAPES]
        # Gradient magnitudes change from step to step so amsgrad's running maximum matters.
        grads = []
        for s in range(1, STEPS + 1):
            scale = 2.0 if s % 7 < 3 else 0.5
            grads.append([None if k in missing.get(s, []) else torch.randn(SHAPES[k]) * scale
                          for k in range(len(SHAPES))])
        opt, params, hist32 = run(opt_name, groups_spec, defaults, params0, grads, torch.float32)
        _, _, hist64 = run(opt_name, groups_spec, defaults, params0, grads, torch.float64)
        for k, p in enumerate(params0):
            tensors[f"{name}.p{k}"] = p
        for s in range(1, STEPS + 1):
            for k in range(len(SHAPES)):
                if grads[s - 1][k] is not None:
                    tensors[f"{name}.g{k}.{s}"] = grads[s - 1][k]
                tensors[f"{name}.p{k}.{s}"] = hist32[s - 1][k]
                tensors[f"{name}.f64.p{k}.{s}"] = hist64[s - 1][k]
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                for key, v in opt.state[p].items():
                    if v is None:
                        continue
                    if key == "step":
                        v = torch.tensor(int(v.item()), dtype=torch.int64)
                    tensors[f"{name}.state.{g}.{i}.{key}"] = v.detach().clone()
        meta[name] = json.dumps({"optimizer": opt_name, "steps": STEPS, "num_params": len(SHAPES),
                                 "groups": group_meta(opt, groups_spec)}, sort_keys=True)
    meta["cases"] = json.dumps(names)
    path = args.out / "optim.safetensors"
    write_safetensors(path, tensors, meta)
    print(f"{path}: {len(names)} cases, {len(tensors)} tensors, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
