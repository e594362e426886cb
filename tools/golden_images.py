# What the image goldens share (tools/make_golden_e2e.py, tools/make_golden_article.py), with only
# numpy and the standard library: a photo stage is kept as its shape, a 64-bit FNV-1a hash of its
# u8 bytes and SAMPLES values at fixed positions (the shared photos' pixels stay out of the
# repository), a small synthetic image as its full pixels; and a safetensors writer for numpy arrays
# (tools/make_golden.py's writer takes torch tensors, which the article golden does not need).
import argparse
import json
import os
import struct

import numpy as np

SAMPLES = 64
_CODES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64",
          np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


def fnv1a64(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in b:  # a few hundred kB in all: fast enough in pure Python
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def sample_positions(n: int) -> np.ndarray:
    """SAMPLES flat u8 indices in [0, n): the LCG the C++ test repeats (x = x * 6364136223846793005
    + 1442695040888963407 mod 2^64, index = (x >> 33) % n)."""
    x, out = 0, []
    for _ in range(SAMPLES):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append((x >> 33) % n)
    return np.array(out, dtype=np.int64)


def image_entries(prefix: str, hwc: np.ndarray, full: bool) -> dict:
    hwc = np.ascontiguousarray(hwc, dtype=np.uint8)
    e = {prefix + ".shape": np.array(hwc.shape, dtype=np.int64)}
    if full:
        e[prefix + ".pixels"] = hwc
    else:
        h = fnv1a64(hwc.tobytes())
        e[prefix + ".fnv1a"] = np.array([h - (1 << 64) if h >= (1 << 63) else h], dtype=np.int64)
        e[prefix + ".samples"] = hwc.reshape(-1)[sample_positions(hwc.size)]
    return e


def golden_args(doc: str, golden_folder: str) -> argparse.Namespace:
    """--out (default tests/golden/<golden_folder>) and --photos (default ../shared/data/catsdogs)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", golden_folder))
    ap.add_argument("--photos", default=os.path.join(here, "..", "..", "shared", "data", "catsdogs"))
    return ap.parse_args()


def write_safetensors_arrays(path, arrays: dict, metadata: dict) -> None:
    """The layout of tools/make_golden.py's writer (sorted names, little-endian data, header padded
    to 8 bytes) for numpy arrays."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
