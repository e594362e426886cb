#!/usr/bin/python3
# PyTorch baseline for bench/bench_cpu.cpp: the same GEMMs, ResNet-18 convolution shapes and whole
# ResNet-18 training step (torchvision resnet18, 64x64, batch 32, 10 classes, SGD momentum), timed
# the same way (wall clock after warm-up), so minidl's numbers have a reference from the same machine.
import argparse
import json
import os
import platform
import time

import torch
import torch.nn.functional as F
import torchvision

GEMMS = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (64, 8192, 576), (128, 2048, 1152),
         (256, 512, 2304), (512, 128, 4608), (64, 256, 576)]
# (N, C, H, W, O, k, stride, pad): every distinct convolution of ResNet-18 at 64x64, batch 32.
CONVS = [(32, 3, 64, 64, 64, 7, 2, 3), (32, 64, 16, 16, 64, 3, 1, 1), (32, 64, 16, 16, 128, 3, 2, 1),
         (32, 128, 8, 8, 128, 3, 1, 1), (32, 64, 16, 16, 128, 1, 2, 0), (32, 128, 8, 8, 256, 3, 2, 1),
         (32, 256, 4, 4, 256, 3, 1, 1), (32, 128, 8, 8, 256, 1, 2, 0), (32, 256, 4, 4, 512, 3, 2, 1),
         (32, 512, 2, 2, 512, 3, 1, 1), (32, 256, 4, 4, 512, 1, 2, 0)]
RESNET18_MACS_64 = 148.05e6  # convolutions + classifier per 64x64 image


def timeit(fn, min_time, warmup=2):
    """Seconds per call: warm-up calls, then repeat until min_time seconds of wall clock have passed."""
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / n


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU baseline for bench/bench_cpu.cpp (GEMM, ResNet-18 "
                                             "convolutions, ResNet-18 training step at 64x64, batch 32)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch.set_num_threads (default: all CPUs; Debian's torch otherwise may use 1)")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per micro-benchmark")
    ap.add_argument("--steps-time", type=float, default=10.0, help="seconds of ResNet-18 training steps")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--skip-micro", action="store_true", help="only the whole-network numbers")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    res = {"torch": torch.__version__, "torchvision": torchvision.__version__, "threads": torch.get_num_threads(),
           "python": platform.python_version(), "gemm": [], "conv": []}
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} threads")

    if not args.skip_micro:
        with torch.no_grad():
            for m, n, k in GEMMS:
                a, b = torch.randn(m, k), torch.randn(k, n)
                t = timeit(lambda: torch.matmul(a, b), args.min_time)
                gf = 2 * m * n * k / t / 1e9
                res["gemm"].append({"M": m, "N": n, "K": k, "ms": t * 1e3, "GFLOP/s": gf})
                print(f"matmul M={m} N={n} K={k}: {t * 1e3:.3f} ms, {gf:.1f} GFLOP/s")
        for (n, c, h, w, o, k, s, p) in CONVS:
            x, wt = torch.randn(n, c, h, w), torch.randn(o, c, k, k)
            with torch.no_grad():
                tf = timeit(lambda: F.conv2d(x, wt, None, s, p), args.min_time)
            xg = x.clone().requires_grad_(c != 3)
            wg = wt.clone().requires_grad_(True)
            ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            gy = torch.randn(n, o, ho, wo)

            def fwd_bwd():
                xg.grad = None
                wg.grad = None
                F.conv2d(xg, wg, None, s, p).backward(gy)

            tb = timeit(fwd_bwd, args.min_time)
            flops = 2 * n * o * ho * wo * c * k * k
            passes = 3 if c != 3 else 2
            row = {"N": n, "C": c, "H": h, "W": w, "O": o, "k": k, "s": s, "p": p, "fwd_ms": tf * 1e3,
                   "fwd_GFLOP/s": flops / tf / 1e9, "fwdbwd_ms": tb * 1e3, "fwdbwd_GFLOP/s": passes * flops / tb / 1e9}
            res["conv"].append(row)
            print(f"conv N={n} C={c} H={h} W={w} O={o} k={k} s={s} p={p}: fwd {tf * 1e3:.3f} ms "
                  f"({row['fwd_GFLOP/s']:.1f} GFLOP/s), fwd+bwd {tb * 1e3:.3f} ms ({row['fwdbwd_GFLOP/s']:.1f} GFLOP/s)")

    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.arange(args.batch) % 10

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    model.train()
    t = timeit(step, args.steps_time, warmup=3)
    res["resnet18_train_step"] = {"batch": args.batch, "size": args.size, "ms": t * 1e3,
                                  "images/s": args.batch / t,
                                  "GFLOP/s": 3 * 2 * RESNET18_MACS_64 * args.batch * (args.size / 64) ** 2 / t / 1e9}
    print(f"resnet18 train step batch {args.batch} {args.size}x{args.size}: {t * 1e3:.1f} ms, "
          f"{args.batch / t:.1f} images/s")
    model.eval()
    with torch.no_grad():
        t = timeit(lambda: model(x), args.min_time * 3)
    res["resnet18_inference"] = {"batch": args.batch, "size": args.size, "ms": t * 1e3, "images/s": args.batch / t}
    print(f"resnet18 inference batch {args.batch} {args.size}x{args.size}: {t * 1e3:.1f} ms, {args.batch / t:.1f} images/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
