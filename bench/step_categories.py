#!/usr/bin/env python3
"""minidl's measured training-step launches beside PyTorch's profiled kernels, by category.

The `model` phase of lab/gpulab's check times every launch of minidl's ResNet-50 AMP step (CUDA events,
perfmodel's calibration table: one row per kernel key with modelled and measured µs), and its
`profile` phase profiles PyTorch's step at the same batch (bench/pytorch_step.py --profile-steps,
JSON with each kernel's µs per step). Both sides go through pytorch_step.py's one name-to-category
map, so the table says where PyTorch's step is faster: convolutions, batch norm, elementwise, ...

  python3 bench/step_categories.py --minidl model.md --pytorch profile.json [--out table.md]
Prints nothing and exits 0 when either input is missing (the phase that makes it did not run).
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_step import category  # noqa: E402  (one map for both sides)

ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| [\d.]+ \| [\d.]+ \| [\d.]+ \| (?P<measured>[\d.]+) \|")


def minidl_categories(model_md):
    """Measured µs per step by category from the calibration table (the first table of the file)."""
    cats = {}
    with open(model_md) as f:
        for line in f:
            if line.startswith("| **sum of the launches**"):
                break   # the model phase writes one table per configuration and batch
            m = ROW.match(line)
            if m:
                c = category(m.group("key"))
                cats[c] = cats.get(c, 0.0) + float(m.group("measured"))
    return cats


def table(mine, theirs):
    rows = ["| category | minidl µs per step | PyTorch µs per step | minidl / PyTorch |", "| --- | ---: | ---: | ---: |"]
    for c in sorted(set(mine) | set(theirs), key=lambda c: -max(mine.get(c, 0.0), theirs.get(c, 0.0))):
        a, b = mine.get(c, 0.0), theirs.get(c, 0.0)
        rows.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.2f} |" if a > 0 and b > 0 else f"| {c} | {a:.1f} | {b:.1f} | - |")
    ta, tb = sum(mine.values()), sum(theirs.values())
    rows.append(f"| **all** | {ta:.1f} | {tb:.1f} | {ta / tb:.2f} |" if ta > 0 and tb > 0 else f"| **all** | {ta:.1f} | {tb:.1f} | - |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="step_categories.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minidl", required=True, help="the model phase's table (model.md)")
    ap.add_argument("--pytorch", required=True, help="pytorch_step.py --profile-steps's --json output")
    ap.add_argument("--out", default="", help="also write the table here")
    a = ap.parse_args(argv)
    if not (os.path.isfile(a.minidl) and os.path.isfile(a.pytorch)):
        return 0
    with open(a.pytorch) as f:
        theirs = json.load(f).get("categories_us_per_step", {})
    mine = minidl_categories(a.minidl)
    if not mine or not theirs:
        return 0
    md = table(mine, theirs)
    print(md, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
