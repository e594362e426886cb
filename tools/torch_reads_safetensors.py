#!/usr/bin/python3
# PyTorch's side of the bf16 interop test (tests/nn/safetensors_bf16_test.cpp): reads a
# safetensors file that minidl wrote, with torch alone (the format read by hand: Debian has no
# safetensors package), and checks every BF16 tensor named NAME against the F32 tensor NAME.f32 in
# the same file: torch's own bf16 of those f32 values must be the very bits minidl stored (NaN:
# any NaN). Prints "ok N" and exits 0, or names the first difference and exits 1.
#
#     /usr/bin/python3 tools/torch_reads_safetensors.py FILE
import json
import struct
import sys

import torch

TORCH_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "F64": torch.float64}


def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=TORCH_DTYPES[e["dtype"]]) if hi > lo else \
            torch.zeros(0, dtype=TORCH_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def main():
    tensors = load(sys.argv[1])
    checked = 0
    for name, t in sorted(tensors.items()):
        if t.dtype != torch.bfloat16:
            continue
        want = tensors[name + ".f32"].to(torch.bfloat16)
        if want.shape != t.shape:
            print(f"{name}: shape {list(t.shape)}, torch expects {list(want.shape)}")
            return 1
        got_bits = t.flatten().view(torch.int16)
        want_bits = want.flatten().view(torch.int16)
        nan = torch.isnan(want.flatten().float())
        if not torch.equal(torch.isnan(t.flatten().float()), nan):
            print(f"{name}: NaN positions differ")
            return 1
        diff = (got_bits != want_bits) & ~nan
        if diff.any():
            i = int(diff.nonzero()[0])
            print(f"{name}[{i}]: minidl stored 0x{int(got_bits[i]) & 0xffff:04x}, "
                  f"torch rounds {float(tensors[name + '.f32'].flatten()[i])!r} to 0x{int(want_bits[i]) & 0xffff:04x}")
            return 1
        checked += t.numel()
    if checked == 0:
        print("no BF16 tensor with an .f32 twin in the file")
        return 1
    print(f"ok {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
