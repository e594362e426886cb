#!/usr/bin/env python3
"""PyTorch DataLoader baseline for bench/bench_data.cpp (minidl_bench_data).

The same work as BM_loader_files / BM_loader_cache: decode the cats-vs-dogs photos, then
RandomResizedCrop(224) (torchvision's default scale and ratio, bilinear with antialiasing, as PIL
does), RandomHorizontalFlip, ToTensor, Normalize(ImageNet), batch 32, f32 NCHW, one epoch per
repeat, at the same worker counts. "cache" keeps the decoded RGB photos in RAM (loaded before the
timing, shared with the workers by fork), as minidl's cache option does.

Run on the GPU machine (16 cores) in the same sitting as the C++ benchmark:
  build/bin/minidl_bench_data --benchmark_filter=loader --benchmark_out=minidl_data.json --benchmark_out_format=json
  python3 bench/pytorch_loader.py --workers 1 2 4 8 16 --json pytorch_data.json
Both read ../shared/data/catsdogs (or MINIDL_BENCH_PHOTOS) and use MINIDL_BENCH_IMAGES photos
(default 400, 200 per class: the same subset by count, not necessarily the same files).
"""
import argparse
import json
import os
import platform
import time

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

HERE = os.path.dirname(os.path.abspath(__file__))


def photo_list(root, per_class):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    items = []
    for label, c in enumerate(classes):
        files = sorted(f for f in os.listdir(os.path.join(root, c))
                       if f.lower().endswith((".jpg", ".jpeg", ".png")))
        if per_class > 0:
            files = files[:per_class]
        items += [(os.path.join(root, c, f), label) for f in files]
    return items


class Photos(Dataset):
    def __init__(self, items, transform, cache):
        self.items = items
        self.transform = transform
        self.cache = [Image.open(p).convert("RGB") for p, _ in items] if cache else None

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img = self.cache[i] if self.cache is not None else Image.open(self.items[i][0]).convert("RGB")
        return self.transform(img), self.items[i][1]


def epoch_rate(loader, repeats):
    best = 0.0
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = 0
        for images, labels in loader:
            n += labels.shape[0]
        rate = n / (time.perf_counter() - t0)
        rates.append(rate)
        best = max(best, rate)
    return best, rates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.environ.get("MINIDL_BENCH_PHOTOS",
                                                     os.path.join(HERE, "..", "..", "shared", "data", "catsdogs")))
    ap.add_argument("--images", type=int, default=int(os.environ.get("MINIDL_BENCH_IMAGES", "400")))
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=["files", "cache"], choices=["files", "cache"])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    torch.set_num_threads(1)  # each worker is one process with one thread, as DataLoader sets
    items = photo_list(args.root, args.images // 2 if args.images > 0 else 0)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    results = []
    for mode in args.modes:
        ds = Photos(items, tf, cache=(mode == "cache"))
        for w in args.workers:
            loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=w,
                                persistent_workers=True, prefetch_factor=4)
            epoch_rate(loader, 1)  # start the workers (and warm the page cache)
            best, rates = epoch_rate(loader, args.repeats)
            print(f"pytorch {mode:5s} workers={w:2d}: {best:8.1f} images/s (epochs: "
                  + ", ".join(f"{r:.1f}" for r in rates) + ")", flush=True)
            results.append({"mode": mode, "workers": w, "images_per_second": best, "epochs": rates})
            del loader
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "images": len(items), "batch": args.batch,
                       "machine": platform.node(), "cpus": os.cpu_count(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
