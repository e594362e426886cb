#!/usr/bin/python3
# The safetensors interop file: tensors of every dtype minidl supports, with known values, written
# on the PyTorch side, so tests/nn/safetensors_test.cpp proves minidl reads what Python writes and
# writes the very same bytes back (the format, not our own reader, is the contract). The bf16
# tensors are PyTorch's own roundings: f32 probes (ties, subnormals, the overflow edge, random
# values) beside torch's bf16 of them, which minidl's conversion must match bit for bit.
#
# Re-run (Debian's python3-torch 1.13 and python3-numpy; no pip packages):
#     /usr/bin/python3 tools/make_golden_safetensors.py   # writes tests/golden/interop/safetensors_interop.safetensors
# The file lives in a subfolder because tests/kernels/golden_test.cpp (GoldenFiles.AllListed)
# requires every tests/golden/*.safetensors to be an op family. Output is deterministic.
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden  # noqa: E402  (its hand-written writer: one implementation of the format on the Python side)

ROOT = Path(__file__).resolve().parent.parent
# make_golden's files need no f16; this file does. Its writer looks codes up in this dict.
make_golden.DTYPE_CODES.setdefault(torch.float16, ("F16", np.float16))
# numpy has no bfloat16: its bits travel as little-endian int16 (write_safetensors views them).
make_golden.DTYPE_CODES.setdefault(torch.bfloat16, ("BF16", np.int16))


def bf16_probes():
    """f32 values where a bf16 rounding can go wrong, and random ones; deterministic."""
    ulp_steps = torch.tensor([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,   # 1 + half an ulp: ties and near ties
                              0x00008000, 0x00018000, 0x00004000, 0x0000C000,   # subnormal ties and quarters
                              0x007F8000, 0x007FFFFF, 0x00800000, 0x00000001,   # up to the smallest normal
                              0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000,   # the overflow edge, inf
                              0x7FC00000], dtype=torch.int64)                   # quiet NaN
    bits = torch.cat([ulp_steps, ulp_steps | 0x80000000])
    bits = torch.cat([bits, torch.randint(0, 2 ** 32, (2000,), generator=torch.Generator().manual_seed(50))])
    return bits.to(torch.int32).view(torch.float32)

# The values tests/nn/safetensors_test.cpp (SafetensorsInterop) checks: keep the two in step.
TENSORS = {
    "bool.mask": torch.tensor([[True, False, False], [False, True, True]]),
    "empty.f32": torch.zeros(0, 3, dtype=torch.float32),
    "bf16.values": torch.tensor([1.0, -2.5, 1.0 / 3.0, 3.3895313892515355e38, 2.0 ** -133, -0.0, float("inf")],
                                dtype=torch.bfloat16),
    "bf16.probes": bf16_probes().to(torch.bfloat16),
    "bf16.probes.f32": bf16_probes(),
    "f16.values": torch.tensor([0.5, -2.25, 65504.0, 2.0 ** -24, -0.0], dtype=torch.float16),
    "f32.matrix": (torch.arange(6, dtype=torch.float32) * 0.5 - 1.0).reshape(2, 3),
    "f32.scalar": torch.tensor(3.25, dtype=torch.float32),
    "f64.values": torch.tensor([[1.0 / 3.0, -1e300], [2.5, 1e-310]], dtype=torch.float64),
    "i32.column": torch.tensor([[-7], [2147483647]], dtype=torch.int32),
    "i64.values": torch.tensor([-(2 ** 62), 0, 2 ** 40 + 7], dtype=torch.int64),
    "layer1.0.conv1.weight": (torch.arange(24, dtype=torch.float32) / 8.0).reshape(2, 3, 2, 2),
    "u8.bytes": torch.tensor([0, 1, 254, 255], dtype=torch.uint8),
}
METADATA = {"format": "pt", "producer": "tools/make_golden_safetensors.py"}


def main():
    ap = argparse.ArgumentParser(description="Write the safetensors interop golden file.")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "interop" / "safetensors_interop.safetensors")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    make_golden.write_safetensors(args.out, TENSORS, METADATA)
    print(f"{args.out}: {len(TENSORS)} tensors, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
