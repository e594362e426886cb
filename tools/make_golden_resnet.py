#!/usr/bin/python3
# torchvision is the reference for minidl's ResNets: this script records what the C++ models must
# match, so tests/nn/resnet_test.cpp can check interchangeability without Python on the machine.
#
# Re-run (Debian's python3-torch 1.13 and python3-torchvision 0.14; no pip packages):
#     /usr/bin/python3 tools/make_golden_resnet.py             # writes into tests/golden/nn/
#     /usr/bin/python3 tools/make_golden_resnet.py --out DIR
# Outputs (deterministic; re-running rewrites identical bytes):
#  - resnet_keys.json: for resnet18/34/50 (num_classes=1000), the ordered state_dict keys with
#    shape and dtype ("f32" / "i64"), plus the parameter count.
#  - resnet_forward.safetensors: for torchvision's resnet18 and resnet50 (num_classes=10) with
#    every parameter and buffer set by golden_value() below, on "input" [2,3,64,64] and "target"
#    [2] (i64): "<arch>.eval_logits"; for resnet18 also one train-mode forward and backward of the
#    mean cross-entropy: "resnet18.train_logits", ".loss", ".grad.<param>" for GRAD_KEYS and
#    ".after_train.<buffer>" for BUFFER_KEYS (running statistics after that forward).
#    The reference runs in float64 from float32-rounded weights and input, then is stored as
#    float32, so it carries no float32 rounding of its own.
#    For resnet50 the same train step, run and STORED in float64 (F64 entries) for the C++ test to
#    compare in float64: "resnet50.train64.logits", ".loss", ".grad.<param>" for GRAD_KEYS_R50 and
#    ".after_train.<buffer>" for BUFFER_KEYS.
#
# The deterministic weights (reproduced by golden_weights() in tests/nn/resnet_test.cpp; keep the
# two in sync) come from an integer hash, exact in both languages, so they behave like a random
# initialisation: smooth functions such as sin(0.1 * i) make batch-norm channels nearly constant and
# the train-mode gradients ill-conditioned even for PyTorch in float32. For the tensor `key` with
# shape s and the element at flat row-major index i (uint32 arithmetic, wrapping):
#     h = i * 2654435761 + len(key) * 40503
#     h ^= h >> 15; h *= 2246822519; h ^= h >> 13; h *= 3266489917; h ^= h >> 16
#     b = h / 2^32 * 2 - 1                                   (in [-1, 1), float64)
#     key ends in "num_batches_tracked":  0
#     tensor with >= 2 dims (conv, fc):    b * sqrt(6 / fan_in),  fan_in = numel / s[0]  (He uniform)
#     key ends in "running_var":           1 + 0.5 * b * b
#     key ends in "running_mean":          0.1 * b
#     other key ending in ".weight" (BN):  1 + 0.1 * b
#     anything else (biases):              0.1 * b
# rounded to float32. The input uses the same hash with len(key) replaced by INPUT_SALT.
#
# Every stored reference is also recomputed by PyTorch in float32; the script fails when that
# alone differs from the float64 reference by more than F32_BUDGET (a tenth of the C++ tolerance),
# so the C++ test never compares an ill-conditioned number. That is why ResNet-50's train step is
# not stored in float32: its train-mode gradients under these weights move by up to 5% between
# float32 and float64 in PyTorch itself (one ReLU input in layer2.1 lies within float32 rounding of
# zero, and which side it falls on changes early-layer gradients). Compared in float64 instead
# (the "resnet50.train64." entries, exempt from the check), both sides agree far below 1e-4.
import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import write_safetensors  # noqa: E402  (the repo's dependency-free writer)

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {torch.float32: "f32", torch.int64: "i64"}


INPUT_SALT = 1000003
F32_BUDGET = 1e-5
MASK = np.uint64(0xFFFFFFFF)


def hash_unit(n, salt):
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(salt) * np.uint64(40503)) & MASK
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & MASK
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(3266489917)) & MASK
    h ^= h >> np.uint64(16)
    return torch.from_numpy(h.astype(np.float64) / 2.0**32 * 2.0 - 1.0)


def golden_value(key, shape):
    n = math.prod(shape)
    if key.endswith("num_batches_tracked"):
        return torch.zeros(shape, dtype=torch.int64)
    b = hash_unit(n, len(key))
    if len(shape) >= 2:
        v = b * math.sqrt(6.0 / (n // shape[0]))
    elif key.endswith("running_var"):
        v = 1.0 + 0.5 * b * b
    elif key.endswith("running_mean"):
        v = 0.1 * b
    elif key.endswith(".weight"):
        v = 1.0 + 0.1 * b
    else:
        v = 0.1 * b
    return v.to(torch.float32).reshape(shape)


def keys_file(out):
    models = {}
    for name in ("resnet18", "resnet34", "resnet50"):
        m = getattr(torchvision.models, name)(weights=None, num_classes=1000)
        keys = [{"key": k, "shape": list(t.shape), "dtype": DTYPES[t.dtype]} for k, t in m.state_dict().items()]
        models[name] = {"num_parameters": sum(p.numel() for p in m.parameters()), "state_dict": keys}
    path = out / "resnet_keys.json"
    # One state_dict entry per line: small, and diffs stay readable.
    lines = ["{"]
    for mi, (name, m) in enumerate(models.items()):
        lines.append(f' "{name}": {{"num_parameters": {m["num_parameters"]}, "state_dict": [')
        entries = [json.dumps(e, separators=(", ", ": ")) for e in m["state_dict"]]
        lines += ["  " + e + ("," if j + 1 < len(entries) else "") for j, e in enumerate(entries)]
        lines.append(" ]}" + ("," if mi + 1 < len(models) else ""))
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    json.loads(path.read_text())
    print("wrote", path)


GRAD_KEYS = ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
             "layer4.1.bn2.weight", "fc.weight", "fc.bias"]
BUFFER_KEYS = ["bn1.running_mean", "bn1.running_var", "layer4.1.bn2.running_var"]
TARGET = [3, 7]
# Spread over ResNet-50, skipping the large ones (layer2.0.downsample.0.weight alone would be 1 MiB
# in float64): the stem, early, middle and late blocks, and the head.
GRAD_KEYS_R50 = ["conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer2.0.downsample.1.weight",
                 "layer3.5.bn3.weight", "layer4.1.bn2.weight", "fc.weight", "fc.bias"]


def golden_model(arch, dtype):
    m = getattr(torchvision.models, arch)(weights=None, num_classes=10)
    m.load_state_dict({k: golden_value(k, list(t.shape)) for k, t in m.state_dict().items()}, strict=True)
    return m.to(dtype)


def train_step(m, x, dtype, grad_keys):
    """One train-mode forward + backward of the mean cross-entropy: batch statistics, running-stat
    updates, gradients. Keys: "logits", "loss", "grad.<param>", "after_train.<buffer>"."""
    m.train()
    logits = m(x.to(dtype))
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(TARGET, dtype=torch.int64))
    loss.backward()
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    params = dict(m.named_parameters())
    for k in grad_keys:
        out[f"grad.{k}"] = params[k].grad
    buffers = dict(m.named_buffers())
    for k in BUFFER_KEYS:
        out[f"after_train.{k}"] = buffers[k]
    return out


def references(arch, x, dtype):
    """{name: tensor} for one model in `dtype`: eval logits, and for resnet18 the train step."""
    m = golden_model(arch, dtype).eval()
    out = {}
    with torch.no_grad():
        out[f"{arch}.eval_logits"] = m(x.to(dtype))
    if arch != "resnet18":
        return out
    for k, t in train_step(m, x, dtype, GRAD_KEYS).items():
        out[f"{arch}.{'train_logits' if k == 'logits' else k}"] = t
    return out


def forward_file(out):
    x = hash_unit(2 * 3 * 64 * 64, INPUT_SALT).to(torch.float32).reshape(2, 3, 64, 64)
    tensors = {"input": x, "target": torch.tensor(TARGET, dtype=torch.int64)}
    for arch in ("resnet18", "resnet50"):
        ref = references(arch, x, torch.float64)
        f32 = references(arch, x, torch.float32)
        for name, t in ref.items():
            rel = ((f32[name].double() - t).abs().max() / t.abs().max()).item()
            assert rel <= F32_BUDGET, f"{name}: PyTorch float32 is {rel:.2e} off float64; too ill-conditioned"
            tensors[name] = t.to(torch.float32)
    # ResNet-50's train step in float64, stored as float64: no float32 check (it would fail, see above).
    for k, t in train_step(golden_model("resnet50", torch.float64), x, torch.float64, GRAD_KEYS_R50).items():
        tensors[f"resnet50.train64.{k}"] = t
    meta = {"models": "torchvision.models.resnet18/resnet50(num_classes=10)", "target": json.dumps(TARGET),
            "torch": torch.__version__, "torchvision": torchvision.__version__}
    path = out / "resnet_forward.safetensors"
    write_safetensors(path, tensors, meta)
    print("wrote", path, "resnet18 eval logits", tensors["resnet18.eval_logits"][0].tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "nn")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    keys_file(args.out)
    forward_file(args.out)


if __name__ == "__main__":
    main()
