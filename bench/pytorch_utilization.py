#!/usr/bin/env python3
"""PyTorch baseline of the `utilization` study (minidl-sweep --study utilization): images/s and peak
allocated / reserved memory vs batch size, measured the way minidl's harness measures them, so that
bench/compare_utilization.py can put the two side by side from runs in the same GPU session.

What minidl does (experiments/harness/studies.cpp `utilization`, train.cpp `run_training`) and what
this script copies:
  - per batch size a fresh model and SGD (lr 0.001, momentum 0.9, no weight decay), `--steps`
    optimizer steps (20; the quick study 3) on synthetic images held in host memory; ResNets have
    2 classes and cross-entropy, the small CNN one logit and BCE-with-logits;
  - each step: gather the batch on the host into a new tensor, copy it to the device (pageable
    memory), forward, loss, `loss.item()`, the correct-prediction count (`.item()`, a second
    sync), backward, optimizer step;
  - `images_per_s` = all images / wall time of all steps, THE FIRST ONE INCLUDED (its first step
    pays cuDNN autotuning, lazy cuBLAS/cuDNN handle creation in the first run of the process,
    allocator growth), read after synchronizing the device, as minidl does; `images_per_s_steady`
    leaves out the first --warmup-steps steps (default 1: minidl's images_per_s_steady leaves out
    the first step); peaks are reset after the model is on the device, so they include weights,
    gradients, momentum, activations, workspaces and the batch;
  - the allocator's cache is not emptied between batch sizes (minidl-sweep runs them in one process
    and never empties its cache between runs); reset_peak_memory_stats() starts each batch, so
    peak_reserved starts at what the previous batch left cached (--fresh-cache empties it first).
Where this script differs, and why:
  - `end_sync_s` is the time this script waited in its final synchronize (work still queued when
    the last step's host code returned);
  - the host pool holds min(steps, 2) x batch distinct images, indexed by a fresh permutation per
    step, instead of steps x batch (12 GiB at batch 1024, 224 px): the per-step gather and copy move
    the same bytes, generation is shorter, and dense kernels do not depend on pixel values;
  - images_per_s_steady times the steady steps with CUDA events (host clock on the CPU), minidl
    with the host clock after a device synchronize: the same span;
  - allocated bytes: PyTorch counts blocks rounded up to 512 bytes, minidl the bytes requested (a
    difference far below 0.1 MiB per tensor); both count cuDNN/cuBLAS workspaces they allocate
    through the caching allocator, neither counts the CUDA context;
  - on the CPU PyTorch has no allocator statistics: the memory columns are empty and
    peak_rss_mib (process high-water RSS, reset per batch through /proc/self/clear_refs) is given
    instead; with --amp the CPU uses bfloat16 autocast without a gradient scaler.
PyTorch's best settings (--best): AMP (float16 autocast + GradScaler; with --amp-dtype bf16,
bfloat16 autocast without one), channels_last,
cudnn.benchmark, and the fused SGD kernel where this torch has one. TF32 stays at PyTorch's defaults
(cuDNN on, matmul off), which are also minidl's. --cuda-graphs replays each step from a CUDA graph,
as minidl's study does on a GPU by default (bench/pytorch_train_step.py says how): without it the
small batches compare minidl's replays with PyTorch's eager launches.

  python3 bench/pytorch_utilization.py --device cuda --model resnet50 --image-size 224 \
      --batches 4,8,16,32,64,128,256,512,1024 --steps 20 [--amp [--amp-dtype bf16]] [--channels-last] [--best] \
      [--cuda-graphs] [--cudnn-benchmark | --no-cudnn-benchmark] --out FILE.csv
Works with torch 1.13 (Debian, CPU) and torch 2.x (CUDA). Writes FILE.csv row by row (a killed run
keeps its finished rows) and FILE.json (versions, device, settings, argv, date). Exit status: 0 when
every batch ran (ok, oom or skipped), 1 when a batch failed with another error, 2 for bad input.
"""
import argparse
import csv
import ctypes
import datetime
import gc
import inspect
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
import traceback

import pytorch_train_step  # noqa: E402  (bench/: the eager and the graphed step)

PROG = "pytorch_utilization"
MODELS = ("smallcnn", "resnet18", "resnet34", "resnet50", "resnet18-small", "resnet34-small", "resnet50-small")
# The first five columns are the interface bench/compare_utilization.py and the GPU runner rely on.
COLUMNS = ["batch_size", "images_per_s", "peak_allocated_mib", "peak_reserved_mib", "status",
           "images_per_s_steady", "step_ms_median", "first_step_ms", "wall_s", "end_sync_s", "steps",
           "warmup_steps", "cpu_util_pct", "gpu_busy_pct", "gpu_busy_source", "peak_rss_mib", "model",
           "image_size", "device", "amp", "channels_last", "cudnn_benchmark", "optimizer_impl", "torch",
           "note", "cuda_graphs"]


def log(msg):
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


def die(msg, code=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="pytorch_utilization.py",
        description="PyTorch baseline of minidl's utilization study (images/s and peak memory vs batch size), "
                    "measured with minidl's methodology; see the header of this file.")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    ap.add_argument("--model", default="resnet50", help="one of " + ", ".join(MODELS) + " (default: resnet50)")
    ap.add_argument("--image-size", type=int, default=224, help="square input size in pixels (default: 224)")
    ap.add_argument("--batches", default="4,8,16,32,64,128,256,512,1024",
                    help="comma-separated batch sizes, run in this order (default: 4,8,...,1024)")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per batch size, all timed (default: 20)")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="steps left out of images_per_s_steady only (default: 1, as minidl's "
                         "images_per_s_steady; at most steps - 1)")
    ap.add_argument("--amp", action="store_true", help="mixed precision: float16 autocast + GradScaler "
                    "(CPU: bfloat16, no scaler); off by default")
    ap.add_argument("--amp-dtype", choices=("f16", "bf16"), default=None,
                    help="the autocast dtype of --amp: f16 (with GradScaler; the default on CUDA) or bf16 "
                         "(no scaler, as minidl's --amp bf16; the only one on the CPU)")
    ap.add_argument("--channels-last", action="store_true", help="model and input in channels_last; off by default")
    ap.add_argument("--cudnn-benchmark", dest="cudnn_benchmark", action="store_true", default=None,
                    help="torch.backends.cudnn.benchmark = True (the default, as minidl's --cudnn-benchmark on)")
    ap.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false",
                    help="torch.backends.cudnn.benchmark = False")
    ap.add_argument("--optimizer-impl", choices=("default", "foreach", "fused"), default=None,
                    help="SGD implementation: PyTorch's default choice, foreach or fused (default: default; "
                         "--best: fused where available)")
    ap.add_argument("--best", action="store_true",
                    help="PyTorch's best settings: --amp --channels-last, cudnn.benchmark (unless "
                         "--no-cudnn-benchmark), fused SGD where this torch has it")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="replay each step from a CUDA graph, as minidl's study does on a GPU by default: the first "
                         "step eagerly, the second captured, then replays (bench/pytorch_train_step.py; CUDA only); "
                         "off by default")
    ap.add_argument("--lr", type=float, default=0.001, help="SGD learning rate (default: 0.001, the study's)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9, the study's)")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default: 0)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (torch.set_num_threads); 0: all CPUs, as minidl's OpenMP (default: 0)")
    ap.add_argument("--keep-going-after-oom", action="store_true",
                    help="also run the batches larger than one that ran out of memory (default: record them "
                         "as oom, 'skipped', without running them)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="empty the CUDA cache before each batch size, so peak_reserved does not start from "
                         "what the previous one left (as minidl-sweep --process-per-run); off by default, as "
                         "minidl-sweep's default single process")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds; start no new batch size after this (the rest: status skipped); 0: none")
    ap.add_argument("--out", required=True, help="results CSV; FILE.json beside it gets the provenance")
    a = ap.parse_args(argv)

    if a.model not in MODELS:
        die(f"--model '{a.model}': expected one of {', '.join(MODELS)}")
    try:
        a.batch_list = [int(s) for s in a.batches.split(",") if s.strip()]
    except ValueError:
        die(f"--batches '{a.batches}': expected comma-separated positive integers, e.g. 4,8,16")
    if not a.batch_list:
        die("--batches is empty: give at least one batch size, e.g. --batches 4,8,16")
    if any(b <= 0 for b in a.batch_list):
        die(f"--batches '{a.batches}': every batch size must be > 0")
    dup = sorted({b for b in a.batch_list if a.batch_list.count(b) > 1})
    if dup:
        die(f"--batches '{a.batches}' lists {', '.join(map(str, dup))} more than once")
    if a.steps < 1:
        die(f"--steps must be >= 1, got {a.steps}")
    if a.warmup_steps < 0:
        die(f"--warmup-steps must be >= 0, got {a.warmup_steps}")
    min_size = 16 if a.model.startswith("resnet") else 4
    if a.image_size < min_size:
        die(f"--image-size {a.image_size} is too small for {a.model} (at least {min_size}, as minidl)")
    if a.model == "smallcnn" and a.image_size % 2:
        die(f"--image-size {a.image_size}: the small CNN's 2x2 max-pool needs an even size")
    if a.threads < 0:
        die(f"--threads must be >= 0, got {a.threads}")
    if a.best:
        a.amp = True
        a.channels_last = True
        if a.optimizer_impl is None:
            a.optimizer_impl = "fused"
    if a.cudnn_benchmark is None:
        a.cudnn_benchmark = True
    if a.optimizer_impl is None:
        a.optimizer_impl = "default"
    if a.cuda_graphs and not a.device.startswith("cuda"):
        die(f"--cuda-graphs replays CUDA graphs: it needs --device cuda, not {a.device}")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        die(f"--out {a.out}: folder {out_dir} does not exist")
    return a


def resolve_device(torch, spec):
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            die(f"--device {spec}: no CUDA GPU is available to this PyTorch ({torch.__version__}, CUDA "
                f"{torch.version.cuda}); use --device cpu")
        try:
            d = torch.device(spec)
        except RuntimeError:
            die(f"--device '{spec}': expected cuda, cuda:N or cpu")
        index = d.index if d.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            die(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    die(f"--device '{spec}': expected cuda, cuda:N or cpu")


def build_model(torch, name, image_size):
    nn = torch.nn
    if name == "smallcnn":
        # minidl's nn/keras_cnn.cpp: conv 32 3x3 'same' + ReLU, max-pool 2, dense 128 + ReLU, dense 1
        # (the sigmoid folded into BCE-with-logits); Glorot-uniform kernels (Keras' default), zero biases.
        pooled = image_size // 2
        m = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(32 * pooled * pooled, 128), nn.ReLU(), nn.Linear(128, 1))
        for layer in (m[0], m[4], m[6]):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        return m
    import torchvision
    base = name[:-len("-small")] if name.endswith("-small") else name
    # weights=None exists from torchvision 0.13 (Debian's 0.14) to today's; 2 classes as minidl's ResNets.
    m = getattr(torchvision.models, base)(weights=None, num_classes=2)
    if name.endswith("-small"):
        # minidl's small-input stem (nn/resnet.cpp): 3x3 stride-1 conv1, no max-pool.
        m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = nn.Identity()
    return m


def is_oom(torch, e):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(e, oom_type):
        return True
    msg = str(e)
    # cuDNN/cuBLAS report a failed workspace or handle allocation with their own codes; the CPU
    # allocator says "can't allocate memory".
    return isinstance(e, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or "ALLOC_FAILED" in msg or "can't allocate memory" in msg
        or isinstance(e, MemoryError))


def one_line(e, limit=300):
    s = " ".join(str(e).split())
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return (type(e).__name__ + ": " + s)[:limit] + where


class NvmlSampler:
    """GPU busy % as minidl's GpuBusyMonitor: NVML's utilization counter (libnvidia-ml.so.1 through
    ctypes, no pynvml needed) sampled every 50 ms while the steps run. Any failure: source says why."""

    class _Util(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    def __init__(self, index, period=0.05):
        self.available = False
        self.why = ""
        self.samples = []
        self._stop = threading.Event()
        self._thread = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            handle = ctypes.c_void_p()
            # minidl passes the CUDA index as the NVML index too (the same GPU unless
            # CUDA_VISIBLE_DEVICES reorders them).
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                raise OSError(f"nvmlDeviceGetHandleByIndex_v2({index}) failed")
            self._lib, self._handle, self._period = lib, handle, period
            u = self._Util()
            if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u)) != 0:
                raise OSError("nvmlDeviceGetUtilizationRates failed")
            self.available = True
        except Exception as e:  # noqa: BLE001 -- no library, no symbol, a ctypes type error: no NVML
            self.why = f"{type(e).__name__}: {e}"

    def _run(self):
        u = self._Util()
        try:
            while not self._stop.is_set():
                if self._lib.nvmlDeviceGetUtilizationRates(self._handle, ctypes.byref(u)) == 0:
                    self.samples.append(u.gpu)
                self._stop.wait(self._period)
        except Exception:  # noqa: BLE001 -- a sampling failure leaves the samples taken so far
            pass

    def start(self):
        if self.available:
            self.samples = []
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return statistics.fmean(self.samples) if self.samples else float("nan")


def reset_peak_rss():
    # Linux >= 4.0: writing 5 resets the high-water RSS, so VmHWM becomes a per-batch peak.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def make_optimizer(torch, params, a, device):
    """SGD (lr, momentum, no weight decay), or with a.optimizer adam / adamw (lr, no weight decay);
    a.optimizer_impl fused / foreach / default; a.capturable (Adam, AdamW): step counts on the device,
    as a captured CUDA graph needs. Returns (optimizer, implementation, a note when it fell back)."""
    name = getattr(a, "optimizer", "sgd")
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    kw = {"lr": a.lr, "weight_decay": 0.0}
    if name == "sgd":
        kw["momentum"] = a.momentum
    elif getattr(a, "capturable", False):
        kw["capturable"] = True
    impl = a.optimizer_impl
    supported = inspect.signature(cls.__init__).parameters
    note = ""
    label = "SGD" if name == "sgd" else ("Adam" if name == "adam" else "AdamW")
    if impl == "fused":
        if "fused" in supported and device.type == "cuda":
            kw["fused"] = True
        else:
            # --best on a torch (or device) without the fused kernel: its default is its best remaining choice.
            note = f"fused {label} unavailable here: PyTorch's default implementation"
            impl = "default"
    elif impl == "foreach":
        if "foreach" in supported:
            kw["foreach"] = True
        else:
            note = f"foreach {label} unavailable here: PyTorch's default implementation"
            impl = "default"
    return cls(params, **kw), impl, note


class GradScalerShim:
    """The few GradScaler calls used, disabled: the fp32 and CPU paths run the same loop."""

    def scale(self, loss):
        return loss

    def step(self, opt):
        opt.step()

    def update(self):
        pass


def make_scaler(torch, device, amp):
    if not (amp and device.type == "cuda"):
        return GradScalerShim()
    amp_mod = getattr(torch, "amp", None)
    if amp_mod is not None and hasattr(amp_mod, "GradScaler"):
        try:
            return amp_mod.GradScaler("cuda")  # torch >= 2.3; torch.cuda.amp.GradScaler warns there
        except TypeError:
            pass
    return torch.cuda.amp.GradScaler()


def run_batch(torch, a, device, b, nvml):
    """One batch size: a fresh model and optimizer, --steps timed steps. Returns a dict of numbers."""
    is_cuda = device.type == "cuda"
    torch.manual_seed(a.seed)
    model = build_model(torch, a.model, a.image_size)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=fmt)
    model.train()
    opt, impl, note = make_optimizer(torch, model.parameters(), a, device)
    bf16 = a.amp_dtype == "bf16" or not is_cuda
    scaler = make_scaler(torch, device, a.amp and not bf16)
    amp_dtype = torch.bfloat16 if bf16 else torch.float16
    kind = pytorch_train_step.GraphedStep if a.cuda_graphs else pytorch_train_step.EagerStep
    step = kind(torch, model, opt, scaler, device, a.amp, amp_dtype, a.model == "smallcnn", a.channels_last)

    # Host data, made before the clock starts (minidl builds its synthetic set before t0 too).
    pool_n = b * min(a.steps, 2)
    g = torch.Generator().manual_seed(a.seed + 1)
    pool_x = torch.randn(pool_n, 3, a.image_size, a.image_size, generator=g)
    pool_y = torch.randint(0, 2, (pool_n,), generator=g)
    order = [torch.randperm(pool_n, generator=g)[:b] for _ in range(a.steps)]

    if is_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps)]
    else:
        reset_peak_rss()
    host_marks = []
    if is_cuda and nvml is not None:
        nvml.start()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for s in range(a.steps):
        if is_cuda:
            starts[s].record()
        h0 = time.perf_counter()
        idx = order[s]
        loss_value = step(pool_x.index_select(0, idx), pool_y.index_select(0, idx))
        if is_cuda:
            ends[s].record()
        host_marks.append((h0, time.perf_counter()))
        if not math.isfinite(loss_value):
            note = (note + "; " if note else "") + f"non-finite loss at step {s + 1}"
    t_enqueued = time.perf_counter()
    if is_cuda:
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    busy = nvml.stop() if (is_cuda and nvml is not None) else float("nan")
    wall = t1 - t0
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

    if is_cuda:
        step_ms = [starts[s].elapsed_time(ends[s]) for s in range(a.steps)]
    else:
        step_ms = [(e - s) * 1e3 for s, e in host_marks]
    w = min(a.warmup_steps, a.steps - 1)
    steady_ms = float("nan")
    if w < a.steps:
        steady_ms = (starts[w].elapsed_time(ends[-1]) if is_cuda
                     else (host_marks[-1][1] - host_marks[w][0]) * 1e3)
    if is_cuda and nvml is not None and nvml.available:
        busy_source = "nvml"
    elif is_cuda:
        # minidl's fallback: summed event time of the steps over the wall time (an upper bound).
        busy = min(100.0, 100.0 * sum(step_ms) / 1e3 / wall) if wall > 0 else float("nan")
        busy_source = "cuda-events"  # why NVML is missing: "nvml" in FILE.json
    else:
        busy_source = "none: cpu device"
    r = {
        "images_per_s": b * a.steps / wall,
        "images_per_s_steady": b * (a.steps - w) / (steady_ms / 1e3) if steady_ms > 0 else float("nan"),
        "step_ms_median": statistics.median(step_ms[w:]) if step_ms[w:] else float("nan"),
        "first_step_ms": step_ms[0],
        "wall_s": wall,
        "end_sync_s": t1 - t_enqueued,
        "warmup_steps": w,
        "cpu_util_pct": 100.0 * cpu_s / wall / (os.cpu_count() or 1),
        "gpu_busy_pct": busy,
        "gpu_busy_source": busy_source,
        "optimizer_impl": impl,
        "note": note,
    }
    if is_cuda:
        r["peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        r["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
    else:
        r["peak_rss_mib"] = peak_rss_mib()
    return r


def fmt(v, digits=1):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.{digits}f}"
    return str(v)


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        c = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        d = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10)
        if c.returncode == 0:
            return c.stdout.strip() + ("-dirty" if d.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def provenance(torch, a, device):
    import torchvision
    p = {
        "program": "bench/pytorch_utilization.py",
        "argv": sys.argv,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "settings": {
            "model": a.model, "image_size": a.image_size, "batches": a.batch_list, "steps": a.steps,
            "warmup_steps": a.warmup_steps, "amp": a.amp,
            "amp_dtype": getattr(a, "amp_dtype", None) or ("f16" if device.type == "cuda" else "bf16"),
            "channels_last": a.channels_last,
            "cudnn_benchmark": a.cudnn_benchmark, "optimizer_impl": a.optimizer_impl, "best": a.best,
            "cuda_graphs": a.cuda_graphs,
            "fresh_cache": a.fresh_cache, "keep_going_after_oom": a.keep_going_after_oom,
            "time_limit_s": a.time_limit,
            "optimizer": f"sgd lr {a.lr} momentum {a.momentum} weight_decay 0", "seed": a.seed,
            "cudnn_allow_tf32": getattr(torch.backends.cudnn, "allow_tf32", None),
            "matmul_allow_tf32": getattr(torch.backends.cuda.matmul, "allow_tf32", None),
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        },
    }
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        p["gpu"] = {"name": prop.name, "total_memory_mib": prop.total_memory / 2**20,
                    "capability": f"{prop.major}.{prop.minor}"}
    else:
        name = "unknown CPU"
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        p["cpu"] = name
    return p


def sidecar_path(out):
    return (out[:-4] if out.endswith(".csv") else out) + ".json"


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import importlib
        import torch
        importlib.import_module("torchvision")  # fail here, before any work, when it is missing
    except ImportError as e:
        die(f"{e}; install PyTorch and torchvision (Debian: bash tools/install_deps.sh --golden, "
            f"then run with /usr/bin/python3)")
    device = resolve_device(torch, a.device)
    if device.type == "cpu":
        torch.set_num_threads(a.threads or os.cpu_count() or 1)
    else:
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    nvml = NvmlSampler(device.index or 0) if device.type == "cuda" else None

    prov = provenance(torch, a, device)
    if nvml is not None:
        prov["nvml"] = "available" if nvml.available else f"unavailable ({nvml.why}): GPU busy % from CUDA events"
    prov["results"] = []
    json_path = sidecar_path(a.out)
    write_json(json_path, prov)
    log(f"torch {torch.__version__} on {prov.get('gpu', {}).get('name', prov.get('cpu'))}: {a.model} "
        f"{a.image_size}px, batches {a.batches}, {a.steps} steps, amp {a.amp} ({a.amp_dtype or 'f16'}), channels_last {a.channels_last}, "
        f"cudnn.benchmark {a.cudnn_benchmark}, optimizer {a.optimizer_impl}, cuda graphs {a.cuda_graphs}")

    common = {"model": a.model, "image_size": a.image_size, "device": str(device), "amp": int(a.amp),
              "channels_last": int(a.channels_last), "cudnn_benchmark": int(a.cudnn_benchmark),
              "torch": torch.__version__, "steps": a.steps, "cuda_graphs": int(a.cuda_graphs)}
    rows = []
    failed = False
    oom_at = None
    t_start = time.perf_counter()
    with open(a.out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        wr.writeheader()
        f.flush()
        for b in a.batch_list:
            row = dict(common, batch_size=b, optimizer_impl=a.optimizer_impl)
            t_b = time.perf_counter()
            if oom_at is not None and b > oom_at and not a.keep_going_after_oom:
                row.update(status="oom", note=f"skipped: batch {oom_at} ran out of memory")
            elif a.time_limit > 0 and t_b - t_start > a.time_limit:
                row.update(status="skipped", note=f"--time-limit {a.time_limit:g} s reached")
            else:
                res, err = None, None
                if a.fresh_cache and device.type == "cuda":
                    torch.cuda.empty_cache()
                try:
                    res = run_batch(torch, a, device, b, nvml)
                except Exception as e:  # noqa: BLE001 -- one batch's failure must not end the sweep
                    err = ("oom" if is_oom(torch, e) else "error", one_line(e))
                    if err[0] == "error":
                        # Whoever reads the log of an unattended run needs the whole story.
                        traceback.print_exc(file=sys.stderr)
                if nvml is not None:
                    nvml.stop()
                # The exception and its frames (model, activations) are gone here; free them now.
                gc.collect()
                if res is not None:
                    row.update(status="ok", **{k: fmt(v, 3 if k in ("wall_s", "end_sync_s") else 1)
                                                for k, v in res.items()})
                else:
                    row.update(status=err[0], note=err[1])
                    if device.type == "cuda":
                        # The peak reached before the failure, then a clean slate for the next batch. After
                        # a CUDA error other than OOM the context may be unusable: the next rows say so.
                        try:
                            row["peak_allocated_mib"] = fmt(torch.cuda.max_memory_allocated(device) / 2**20)
                            row["peak_reserved_mib"] = fmt(torch.cuda.max_memory_reserved(device) / 2**20)
                            torch.cuda.empty_cache()
                            torch.cuda.reset_peak_memory_stats(device)
                        except Exception as e2:  # noqa: BLE001
                            row["note"] += f"; cleanup failed: {one_line(e2, 120)}"
                    if err[0] == "oom":
                        oom_at = b if oom_at is None else min(oom_at, b)
                    else:
                        failed = True
            wr.writerow(row)
            f.flush()
            os.fsync(f.fileno())
            rows.append(row)
            prov["results"].append(row)
            write_json(json_path, prov)
            if row["status"] == "ok":
                mem = (f"peak allocated {row.get('peak_allocated_mib') or '-'} / reserved "
                       f"{row.get('peak_reserved_mib') or '-'} MiB" if device.type == "cuda"
                       else f"peak RSS {row.get('peak_rss_mib') or '-'} MiB")
                log(f"batch {b}: {row['images_per_s']} images/s (steady {row['images_per_s_steady'] or '-'}), "
                    f"first step {row['first_step_ms']} ms, {mem}, {time.perf_counter() - t_b:.1f} s")
            else:
                log(f"batch {b}: {row['status']}: {row.get('note', '')}")

    mem_title = ("peak_alloc_MiB", "peak_res_MiB") if device.type == "cuda" else ("peak_rss_MiB", "")
    print(f"{'batch':>6} {'images/s':>10} {'steady':>10} {'step_ms':>9} {mem_title[0]:>15} {mem_title[1]:>13}  status")
    for r in rows:
        m1 = r.get("peak_allocated_mib", "") if device.type == "cuda" else r.get("peak_rss_mib", "")
        m2 = r.get("peak_reserved_mib", "") if device.type == "cuda" else ""
        print(f"{r['batch_size']:>6} {r.get('images_per_s', ''):>10} {r.get('images_per_s_steady', ''):>10} "
              f"{r.get('step_ms_median', ''):>9} {m1:>15} {m2:>13}  {r['status']}")
    print(f"wrote {a.out} and {json_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
