#!/usr/bin/env python3
"""PyTorch's side of bench/step_bench.cpp (minidl_bench_step): images/s of whole training steps on
one device-resident batch, and the largest batch that fits a memory budget, with PyTorch at its best
eager settings, so a GPU session can put the two side by side from one call (lab/gpulab's check,
phases `step` and `maxbatch`).

The step is minidl's: torchvision's ResNet (2 classes, as minidl's harness), cross-entropy, SGD
lr 0.001 momentum 0.9 without weight decay, or --optimizer adam / adamw (lr 0.001, no weight
decay; bench/pytorch_utilization.py's model and optimizer helpers), zero_grad(set_to_none) after
each step, no host sync inside the loop other than the ones GradScaler.step makes itself (none
with the fused optimizers). --accumulation-steps K: a step is K micro-batches of --batch images,
each loss divided by K, then one optimizer step (images/s counts all K). PyTorch's best settings, always on here:
  - channels_last model and input (--no-channels-last to compare like for like with minidl's NCHW),
  - cudnn.benchmark = True,
  - the fused SGD / Adam / AdamW kernel (torch >= 2.0 on CUDA; capturable Adam under --cuda-graphs),
  - --precision amp: float16 autocast + GradScaler; amp-bf16: bfloat16 autocast, no scaler (as
    minidl's --amp bf16); tf32: float32 with TF32 in cuBLAS and cuDNN;
    fp32: float32 without TF32 anywhere.
Timing: --warmup untimed steps, a synchronize, then steps until --seconds have passed, a final
synchronize, images / elapsed wall time (minidl_bench_step measures the same span). --cuda-graphs
captures the whole step into one CUDA graph after the warm-up and times its replays (PyTorch's
documented whole-network capture), against minidl_bench_step --cuda-graphs.

  python3 bench/pytorch_step.py --model resnet50 --batch 128 --precision amp --seconds 30 --json pt_amp.json
  python3 bench/pytorch_step.py --model resnet50 --precision amp --max-batch-under 11GiB --json pt_max.json
  python3 bench/pytorch_step.py --model resnet50 --batch 256 --precision amp --profile-steps 5 --profile-out pt.md
The profile (lab/gpulab's check, phase `profile`): --warmup steps, then --profile-steps steps under
torch.profiler; each kernel's device time per step, summed by category (convolution, batch norm,
elementwise, ...) beside the same categories of minidl's measured launches (the `model` phase), so a
GPU session sees where PyTorch's step is faster, not only that it is. On a CPU it profiles the aten
operators' CPU time instead (a rehearsal of the plumbing).
The largest batch: torch.cuda.set_per_process_memory_fraction(budget / total memory), then batches
doubled from --batch until one runs out of memory, then bisected; each trial runs --trial-steps
steps (3, as minidl-maxbatch's default) on a fresh model. Exit status 0, 1 on an error other than
running out of memory, 2 for bad input.
"""
import argparse
import contextlib
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_utilization as pu  # noqa: E402  (the model, optimizer and scaler helpers)

PROG = "pytorch_step"
pu.PROG = PROG   # the helpers' log and error lines name this script


def parse_bytes(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*", s)
    if not m:
        pu.die(f"--max-batch-under '{s}': expected a size such as 11GiB, 512MiB or 1.5GB")
    unit = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
    return int(float(m.group(1)) * unit)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="pytorch_step.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    ap.add_argument("--model", default="resnet50", help="one of " + ", ".join(pu.MODELS) + " (default: resnet50)")
    ap.add_argument("--image-size", type=int, default=224, help="input side (default: 224)")
    ap.add_argument("--batch", type=int, default=128, help="batch size; with --max-batch-under, the first trial "
                    "(default: 128)")
    ap.add_argument("--precision", choices=("amp", "amp-bf16", "tf32", "fp32"), default="amp",
                    help="default: amp")
    ap.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                    help="NCHW model and input (default: channels_last, PyTorch's best)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (default: 10)")
    ap.add_argument("--seconds", type=float, default=30.0, help="time steps for about this long (default: 30)")
    ap.add_argument("--max-batch-under", default="", help="find the largest batch under this memory budget "
                    "(11GiB) instead of timing")
    ap.add_argument("--trial-steps", type=int, default=3, help="steps per --max-batch-under trial (default: 3)")
    ap.add_argument("--limit", type=int, default=4096, help="never try a batch above this (default: 4096)")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default: 0)")
    ap.add_argument("--profile-steps", type=int, default=0, help="instead of timing: profile this many steps "
                    "after --warmup and print their kernels' time per step by category (default: 0, off)")
    ap.add_argument("--profile-out", default="", help="with --profile-steps: also write the markdown tables here")
    ap.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd",
                    help="sgd (momentum 0.9), adam or adamw; lr 0.001, no weight decay (default: sgd)")
    ap.add_argument("--accumulation-steps", type=int, default=1,
                    help="micro-batches of --batch per optimizer step (default: 1)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="capture the whole step (forward, loss, backward, GradScaler, fused SGD step) into one "
                         "CUDA graph after the warm-up and replay it, as PyTorch's docs' whole-network capture does "
                         "(minidl_bench_step --cuda-graphs' counterpart; CUDA only)")
    ap.add_argument("--json", default="", help="also write the result, with provenance, to this file")
    a = ap.parse_args(argv)
    if a.model not in pu.MODELS:
        pu.die(f"--model '{a.model}': expected one of {', '.join(pu.MODELS)}")
    if a.batch < 1 or a.warmup < 0 or a.seconds <= 0 or a.trial_steps < 1 or a.profile_steps < 0 or \
            a.accumulation_steps < 1:
        pu.die("--batch, --trial-steps and --accumulation-steps must be >= 1, --warmup and --profile-steps >= 0 "
               "and --seconds > 0")
    if a.profile_steps and a.max_batch_under:
        pu.die("--profile-steps and --max-batch-under are separate runs: give one")
    a.budget = parse_bytes(a.max_batch_under) if a.max_batch_under else 0
    # What pytorch_utilization's helpers read.
    a.lr, a.momentum, a.optimizer_impl, a.capturable = 0.001, 0.9, "fused", a.cuda_graphs
    return a


class Step:
    """One model, optimizer and scaler; run() does whole training steps on one resident batch."""

    def __init__(self, torch, a, device, batch):
        self.torch, self.device = torch, device
        fmt = torch.channels_last if a.channels_last and device.type == "cuda" else torch.contiguous_format
        self.model = pu.build_model(torch, a.model, a.image_size).to(device, memory_format=fmt).train()
        self.opt, self.impl, self.note = pu.make_optimizer(torch, self.model.parameters(), a, device)
        self.amp = a.precision in ("amp", "amp-bf16") and device.type == "cuda"
        self.dtype = torch.bfloat16 if a.precision == "amp-bf16" else torch.float16
        self.scaler = pu.make_scaler(torch, device, self.amp and a.precision == "amp")
        self.x = torch.randn(batch, 3, a.image_size, a.image_size, device=device).contiguous(memory_format=fmt)
        self.y = (torch.rand(batch, device=device) > 0.5).long()
        self.binary = a.model == "smallcnn"
        self.accumulation = a.accumulation_steps
        self.updates = 0     # optimizer steps taken (a replay is one; the capture itself runs none)
        self.loss = None     # the last micro-batch's loss (a device tensor: read after the timing)

    def window(self):
        """One optimizer step: the window's micro-batches (forward, loss / K, backward), the scaler
        and the optimizer's step; the gradients are left for the caller to clear."""
        torch = self.torch
        for _ in range(self.accumulation):
            # (torch 1.13's CPU autocast refuses float16 even when disabled: no context at all then.)
            with torch.autocast(device_type="cuda", dtype=self.dtype) if self.amp else contextlib.nullcontext():
                out = self.model(self.x)
            out = out.float()
            if self.binary:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), self.y.float())
            else:
                loss = torch.nn.functional.cross_entropy(out, self.y)
            self.loss = loss   # the micro-batch's mean, before the window's weight
            if self.accumulation > 1:
                loss = loss / self.accumulation
            self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def run(self, steps):
        for _ in range(steps):
            self.window()
            self.opt.zero_grad(set_to_none=True)
            self.updates += 1

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def capture(self):
        """The step as one CUDA graph (PyTorch's whole-network capture): warm-up on a side stream,
        gradients set to None before the capture so the captured backward writes them (static
        addresses in the graph's pool; with accumulation the first micro-batch's backward writes them
        and the others add), then the window's forwards, losses, backwards, scaler and fused step
        captured; replay() replays it. The fused optimizers take the scaler's found-inf flag on the
        device (capturable Adam keeps its step counts there), so nothing in the step syncs the host."""
        torch = self.torch
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.run(3)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.window()
        self.graph = graph

    def replay(self, steps):
        for _ in range(steps):
            self.graph.replay()
            self.updates += 1


def time_steps(torch, a, device):
    s = Step(torch, a, device, a.batch)
    t = time.perf_counter()
    s.run(a.warmup)
    if a.cuda_graphs:
        s.capture()
        step = s.replay
    else:
        step = s.run
    s.sync()
    warmup_s = time.perf_counter() - t
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, t0 = 0, time.perf_counter()
    while steps == 0 or time.perf_counter() - t0 < a.seconds:
        step(1)
        steps += 1
    s.sync()
    secs = time.perf_counter() - t0
    ips = steps * a.batch * a.accumulation_steps / secs
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    loss = float(s.loss.item())   # the same batch every step: how far the steps fitted it
    acc = f" x {a.accumulation_steps} accumulated" if a.accumulation_steps > 1 else ""
    print(f"pytorch {a.model} batch {a.batch}{acc} {a.image_size}px {a.precision}"
          f"{' channels-last' if a.channels_last and device.type == 'cuda' else ''}"
          f"{' cuda-graphs' if a.cuda_graphs else ''}: {ips:.1f} images/s ({steps} steps in {secs:.2f} s after "
          f"{a.warmup} warm-up steps in {warmup_s:.1f} s; {a.optimizer} {s.impl}{'; ' + s.note if s.note else ''}; "
          f"loss {loss:.4f} after {s.updates} updates)", flush=True)
    return {"images_per_s": ips, "steps": steps, "seconds": secs, "warmup_steps": a.warmup,
            "cuda_graphs": a.cuda_graphs, "optimizer": a.optimizer, "accumulation_steps": a.accumulation_steps,
            "loss": loss, "optimizer_steps": s.updates,
            "warmup_seconds": warmup_s, "optimizer_impl": s.impl, "peak_allocated_bytes": peak}


# Kernel (or, on a CPU, aten operator) names to categories, first match wins. cuDNN's convolution
# kernels name their direction (fprop / dgrad / wgrad) or "conv"; its layout transposes are apart.
CATEGORIES = (
    ("layout transposes", r"nchwtonhwc|nhwctonchw|transpose"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit_?gemm|winograd|fft"),
    ("batch norm", r"batch_?norm|bn_fw|bn_bw|bn_"),
    ("GEMM", r"gemm|cublas|addmm|matmul|linear"),
    ("pooling", r"pool"),
    ("optimizer and loss scaling", r"multi_tensor|sgd|foreach|unscale|scale"),
    ("reductions", r"reduce|sum|mean|norm"),
    ("loss", r"softmax|nll|cross_entropy"),
    ("elementwise and copies", r"elementwise|vectorized|unrolled|copy|fill|relu|threshold|clamp|add|mul|cat|_to"),
)


def category(name):
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def profile_steps(torch, a, device):
    """--warmup steps, then --profile-steps steps under torch.profiler: time per step by category."""
    from torch.profiler import ProfilerActivity, profile
    s = Step(torch, a, device, a.batch)
    s.run(a.warmup)
    s.sync()
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        s.run(a.profile_steps)
        s.sync()
    rows = {}
    for e in prof.key_averages():
        if cuda:
            # Device kernels only (their self time is the kernel's): torch 2.x's self_device_time_total.
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0)
            if getattr(e, "device_type", None) is not None and "CUDA" not in str(e.device_type):
                continue
        else:
            if not e.key.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        if us and us > 0:
            n0, us0 = rows.get(e.key, (0, 0.0))
            rows[e.key] = (n0 + e.count, us0 + us)
    per_step = {k: (n / a.profile_steps, us / a.profile_steps) for k, (n, us) in rows.items()}
    total = sum(us for _, us in per_step.values()) or 1.0
    cats = {}
    for k, (n, us) in per_step.items():
        c = cats.setdefault(category(k), [0.0, 0.0])
        c[0] += n
        c[1] += us
    what = "kernel time on the GPU" if cuda else "aten operators' self CPU time (a rehearsal: not GPU numbers)"
    lines = [f"PyTorch {torch.__version__}, {a.model}, {a.image_size} px, batch {a.batch}, {a.precision}"
             f"{', channels_last' if a.channels_last and cuda else ''}: {what} per step, over {a.profile_steps} "
             f"steps after {a.warmup} warm-up steps; {total / 1e3:.2f} ms in all.", "",
             "| category | launches per step | µs per step | share |", "| --- | ---: | ---: | ---: |"]
    for c, (n, us) in sorted(cats.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {c} | {n:.0f} | {us:.1f} | {100 * us / total:.1f}% |")
    lines += ["", "The 15 costliest:", "", "| kernel | category | launches per step | µs per step |",
              "| --- | --- | ---: | ---: |"]
    for k, (n, us) in sorted(per_step.items(), key=lambda kv: -kv[1][1])[:15]:
        name = k if len(k) <= 90 else k[:87] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {category(k)} | {n:.0f} | {us:.1f} |")
    md = "\n".join(lines) + "\n"
    print(md, end="", flush=True)
    if a.profile_out:
        with open(a.profile_out, "w") as f:
            f.write(md)
    return {"profile_steps": a.profile_steps, "total_us_per_step": total,
            "categories_us_per_step": {c: v[1] for c, v in cats.items()},
            "kernels": {k: {"launches_per_step": n, "us_per_step": us} for k, (n, us) in per_step.items()}}


def fits(torch, a, device, batch):
    """Whether --trial-steps steps at `batch` run under the budget; everything is freed after."""
    s = None
    try:
        s = Step(torch, a, device, batch)
        s.run(a.trial_steps)
        s.sync()
        return True
    except Exception as e:  # noqa: BLE001 -- only an out-of-memory error is an answer
        if not pu.is_oom(torch, e):
            raise
        return False
    finally:
        del s
        torch.cuda.empty_cache()


def max_batch(torch, a, device):
    total = torch.cuda.get_device_properties(device).total_memory
    if a.budget > total:
        pu.die(f"--max-batch-under {a.max_batch_under} is more than this GPU's {total / 2**30:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(a.budget / total, device)
    good, bad, b, trials = 0, 0, a.batch, []
    while b <= a.limit:   # doubling until the first failure
        ok = fits(torch, a, device, b)
        trials.append((b, ok))
        pu.log(f"batch {b}: {'fits' if ok else 'out of memory'}")
        if not ok:
            bad = b
            break
        good, b = b, b * 2
    if good == 0 and bad:   # the first trial failed: bisect below it
        good = 0
    if bad:
        while bad - good > 1:
            mid = (good + bad) // 2
            ok = fits(torch, a, device, mid)
            trials.append((mid, ok))
            pu.log(f"batch {mid}: {'fits' if ok else 'out of memory'}")
            good, bad = (mid, bad) if ok else (good, mid)
    print(f"pytorch {a.model} {a.image_size}px {a.precision}: largest batch under {a.max_batch_under}: {good}"
          f"{' (the --limit)' if not bad else ''} ({len(trials)} trials of {a.trial_steps} steps)", flush=True)
    return {"max_batch": good, "budget_bytes": a.budget, "trials": trials, "limit_reached": not bad}


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    device = pu.resolve_device(torch, a.device)
    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = True
    # amp: PyTorch's defaults for the f32 parts (TF32 convolutions, f32 GEMMs); tf32: TF32 everywhere;
    # fp32: no TF32 at all. minidl_bench_step sets its switches of the same names the same way.
    torch.backends.cudnn.allow_tf32 = a.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    if a.cuda_graphs and (device.type != "cuda" or a.budget or a.profile_steps):
        pu.die("--cuda-graphs times steps on a CUDA device (not with --max-batch-under or --profile-steps)")
    if a.budget and device.type != "cuda":
        pu.die("--max-batch-under needs --device cuda (a memory fraction is a CUDA allocator setting)")
    if a.budget:
        result = max_batch(torch, a, device)
    elif a.profile_steps:
        result = profile_steps(torch, a, device)
    else:
        result = time_steps(torch, a, device)
    if a.json:
        prov = pu.provenance(torch, argparse.Namespace(
            model=a.model, image_size=a.image_size, batch_list=[a.batch], steps=0, warmup_steps=a.warmup,
            amp=a.precision in ("amp", "amp-bf16"), amp_dtype="bf16" if a.precision == "amp-bf16" else "f16",
            channels_last=a.channels_last, cudnn_benchmark=True, optimizer_impl="fused",
            best=True, fresh_cache=False, keep_going_after_oom=False, time_limit=0, lr=a.lr,
            momentum=a.momentum, seed=a.seed), device)
        prov["program"] = "bench/pytorch_step.py"
        prov.update(framework="pytorch", precision=a.precision, batch=a.batch, **result)
        pu.write_json(a.json, prov)
    return 0


if __name__ == "__main__":
    sys.exit(main())
