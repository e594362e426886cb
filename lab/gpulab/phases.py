"""The phases of `gpulab check`, one function each, in the order of PHASES. A phase gets the run's
context and its budget in seconds, writes its logs to ctx.logs and returns (status, section):
status 0 passed, 1 failed, 4 cut by its budget (the --resume call runs it again), 5 skipped
(nothing to run here: no sanitizer, no model program, a rehearsal without a GPU); section is its
Markdown for the report."""
import glob
import json
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import ROOT, run_until, say, tail

PASSED, FAILED, CUT, SKIPPED = 0, 1, 4, 5
STOPPED = (124, 137)   # run_until's "stopped at the deadline" and "killed"

DEFAULT_STEP_RUNS = ("minidl:amp:nhwc:graphs pytorch:amp:graphs pytorch:amp minidl:amp:nhwc "
                     "minidl:amp-bf16:nhwc pytorch:amp-bf16 "
                     "minidl:amp:nhwc:chain:graphs minidl:amp:nhwc:chain minidl:amp minidl:tf32 pytorch:tf32")
# CUDA graphs in every mode (GPU_CHECK_STEP_RUNS=graphs): the small CNN with Adam at the Keras study's
# small batches, ResNet-50 AMP with accumulation over 4 micro-batches, each graphed and eager, beside
# PyTorch's eager step and its whole-step capture.
GRAPH_STEP_RUNS = " ".join(
    f"{fw}:{spec}" for spec in ("fp32:smallcnn:adam:graphs:b16", "fp32:smallcnn:adam:b16",
                                "fp32:smallcnn:adam:graphs:b64", "fp32:smallcnn:adam:b64")
    for fw in ("minidl", "pytorch")) + " " + " ".join(
    f"minidl:amp:nhwc{g}:acc4:b{b} pytorch:amp{g}:acc4:b{b}" for b in (32, 256) for g in (":graphs", ""))
STEP_RUN_PRESETS = {"graphs": GRAPH_STEP_RUNS}
DEFAULT_SANITIZER_FILTER = "*-Parity.Conv2dAutotuneNhwcAndTf32:Parity.AutotuneWorkspaceStaysInsideTheBudget"
DEFAULT_BENCH_FILTER = "^(D2DCopy|Add|MulScalarInPlace|Relu|Cast|SumAll|SumRows)/"


@dataclass
class Ctx:
    """What the phases share: the settings, the unpacked stage and the machine."""
    rehearse: bool = False
    bin: Path = Path("bin")
    work: Path = Path(".")
    logs: Path = Path("logs")
    gpu_line: str = ""
    torch_py: str = "python3"
    torch_line: str = "not importable"
    step_seconds: int = 15
    step_runs: list = field(default_factory=lambda: DEFAULT_STEP_RUNS.split())
    step_min: int = 20
    model_configs: str = "resnet50-amp-nhwc,resnet50-amp"
    model_batches: list = field(default_factory=lambda: ["256"])
    sanitizer_filter: str = DEFAULT_SANITIZER_FILTER
    bench_filter: str = DEFAULT_BENCH_FILTER


def status_of(rc, cut=False, failed=False):
    if failed:
        return FAILED
    return CUT if cut or rc in STOPPED else (PASSED if rc == 0 else FAILED)


def read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------- 1 tests
def gtest_counts(text):
    """(passed, failed, skipped, the test running last) of a GoogleTest log."""
    count = lambda rx: len(re.findall(rx, text, re.M))
    running = re.findall(r"^\[ RUN      \] (.*)$", text, re.M)
    return (count(r"^\[       OK \]"), count(r"^\[  FAILED  \] .*\(\d+ ms\)$"),
            count(r"^\[  SKIPPED \] .*\(\d+ ms\)$"), running[-1] if running else "")


def share(left, later):
    """An executable's seconds: each later one keeps 15 s, or all get an even share when less is left."""
    return max(left - 15 * later, left // (later + 1))


FAILURE_LINE = re.compile(r"^\[  FAILED  \].*\(\d+ ms\)$|Failure$|normalised error|error:", re.M)


def test_executables(bin_dir):
    return [p for p in sorted(Path(bin_dir).glob("*_cuda")) if p.name != "minidl_bench_cuda"]


def tests(ctx, budget):
    end = time.monotonic() + budget
    exes = test_executables(ctx.bin)
    rows, totals, cut = [], [0, 0, 0], False
    for i, exe in enumerate(exes):
        b = share(int(end - time.monotonic()), len(exes) - i - 1)
        say(f"  {exe.name} (at most {b} s)")
        t0, log = time.monotonic(), ctx.logs / f"{exe.name}.log"
        rc = run_until([exe, "--gtest_color=no"], log, b)
        text = read(log)
        passed, failed, skipped, running = gtest_counts(text)
        note = str(rc)
        if rc in STOPPED:
            cut, note = True, f"{rc} (cut at {b} s; running: {running})"
        elif not ctx.rehearse and passed <= 1 and "no CUDA device" in text:
            note, failed = f"{rc}: nvidia-smi sees a GPU but minidl does not (its CUDA cases skipped)", failed + 1
        totals = [totals[0] + passed, totals[1] + failed, totals[2] + skipped]
        rows.append(f"| {exe.name} | {passed} | {failed} | {skipped} | {note} | {int(time.monotonic() - t0)} |")
        for ln in [ln for ln in text.splitlines() if re.match(r"^\[  FAILED  \].*\(\d+ ms\)$", ln)][:20]:
            print(ln)
    md = ["## 1. Tests (the `cuda` label: every *_cuda executable)", "",
          f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped"
          + (f" (cut by the phase's {budget} s)" if cut else "") + ".", "",
          "| executable | passed | failed | skipped | exit | seconds |", "| --- | ---: | ---: | ---: | --- | ---: |",
          *rows]
    if totals[1]:
        found = [ln for e in exes for ln in read(ctx.logs / f"{e.name}.log").splitlines() if FAILURE_LINE.search(ln)]
        md += ["", "```", *found[:60], "```"]
    return status_of(0, cut=cut, failed=totals[1] > 0), "\n".join(md) + "\n"


# ---------------------------------------------------------------- 2 step: minidl beside PyTorch
# PyTorch always runs channels_last; its batch norm is never carried by the convolutions.
MINIDL_ONLY = {"nhwc": "--channels-last", "chain": "--conv-bn-chain", "hostscaler": "--host-scaler"}


def parse_step_spec(spec, rehearse):
    """FRAMEWORK:PRECISION[:OPTION...] -> (framework, precision, batch, extra flags). Options, in
    this order: nhwc (minidl channels-last), chain (minidl --conv-bn-chain), graphs (--cuda-graphs,
    both; not in a rehearsal: the CPU has none), hostscaler (minidl --host-scaler), smallcnn (the
    Keras study's small CNN at 200 px instead of ResNet-50 at 224), adam (--optimizer adam), accN
    (--accumulation-steps N), bN (batch N). ValueError names a bad one."""
    parts = spec.split(":")
    fw, prec = parts[0], (parts[1] if len(parts) > 1 else "")
    batch, extra, minidl_only = 128, [], []
    for opt in parts[2:]:
        if opt in MINIDL_ONLY:
            extra.append(MINIDL_ONLY[opt])
            minidl_only.append(opt)
        elif opt == "graphs":
            extra += [] if rehearse else ["--cuda-graphs"]
        elif opt == "smallcnn":
            extra += [] if rehearse else ["--model", "smallcnn", "--image-size", "200"]
        elif opt == "adam":
            extra += ["--optimizer", "adam"]
        elif re.fullmatch(r"acc\d+", opt):
            extra += ["--accumulation-steps", opt[3:]]
        elif re.fullmatch(r"b\d+", opt):
            batch = int(opt[1:])
        else:
            raise ValueError(f"unknown option '{opt}' in step run '{spec}' "
                             "(nhwc, chain, graphs, hostscaler, smallcnn, adam, accN, bN)")
    if fw not in ("minidl", "pytorch"):
        raise ValueError(f"unknown framework '{fw}' in GPU_CHECK_STEP_RUNS")
    if fw == "pytorch" and minidl_only:
        raise ValueError(f"step run '{spec}': PyTorch takes graphs, smallcnn, adam, accN and bN only "
                         "(it always runs channels_last)")
    return fw, prec, batch, extra


def step_args(rehearse, batch, seconds, extra=()):
    """The step benches' arguments; `extra` (parse_step_spec's) may name another --model and
    --image-size, which replace the defaults here (a flag is given once)."""
    model = ["--model", "resnet18-small", "--image-size", "32"] if rehearse else \
        ["--model", "resnet50", "--image-size", "224"]
    if "--model" in extra:
        model = []
    if rehearse:
        return ["--device", "cpu", *model, "--batch", "4", "--warmup", "1", "--seconds", str(seconds), *extra]
    return ["--device", "cuda", *model, "--batch", str(batch), "--warmup", "15", "--seconds", str(seconds), *extra]


def step_detail(d):
    """The detail cell of a step run's row, from its JSON."""
    peak = f"{d['peak_allocated_bytes'] / 2**20:.0f}" if d.get("peak_allocated_bytes") else "-"
    reserved = f" (reserved {d['peak_reserved_bytes'] / 2**20:.0f})" if d.get("peak_reserved_bytes") else ""
    host = ""
    if d.get("host_seconds") is not None:
        host = f"; host {1e3 * d['host_seconds'] / d['steps']:.1f} of {1e3 * d['seconds'] / d['steps']:.1f} ms a step"
    loss = ""
    if d.get("loss") is not None and d.get("optimizer_steps"):
        loss = f"; loss {d['loss']:.4f} after {d['optimizer_steps']} updates"
    return f"{d['steps']} steps in {d['seconds']:.1f} s; peak {peak} MiB{reserved}{host}{loss}"


def step_ratios(runs, ips):
    """Each minidl run against PyTorch's eager run of the same options (precision, model, optimizer,
    accumulation, batch), a graphed one also against PyTorch's graphed run and against minidl's own
    eager run: 'm / peer: 0.75x' lines."""
    out = []
    for m in runs:
        if not m.startswith("minidl:") or m not in ips:
            continue
        parts = m.split(":")
        shared = [o for o in parts[2:] if o not in MINIDL_ONLY]
        eager = [o for o in shared if o != "graphs"]
        peers = [":".join(["pytorch", parts[1], *eager])]
        if "graphs" in shared:
            peers += [":".join(["pytorch", parts[1], *shared]), ":".join(o for o in parts if o != "graphs")]
        for peer in peers:
            if peer in ips:
                out.append(f"{m} / {peer}: {ips[m] / ips[peer]:.2f}x")
    return out


def step_run(ctx, spec, budget):
    """One step run; (exit status, its JSON or None)."""
    log = ctx.logs / ("step_" + spec.replace(":", "_") + ".log")
    try:
        fw, prec, batch, extra = parse_step_spec(spec, ctx.rehearse)
    except ValueError as e:
        log.write_text(f"{e}\n")
        return 3, None
    jpath = log.with_suffix(".json")
    args = step_args(ctx.rehearse, batch, ctx.step_seconds, extra) + ["--precision", prec, "--json", jpath]
    if fw == "minidl":
        rc = run_until([ctx.bin / "minidl_bench_step", *args], log, budget)
    else:
        rc = run_until([ctx.torch_py, ROOT / "bench/pytorch_step.py", *args], log, budget,
                       env={"PYTHONUNBUFFERED": "1"})
    print(tail(log))
    try:
        return rc, json.loads(jpath.read_text())
    except (OSError, ValueError):
        return rc, None


def step_header(ctx):
    if ctx.rehearse:
        return "Rehearsal: resnet18-small, 32 px, batch 4, on the CPU (not GPU numbers)."
    return (f"ResNet-50, 224 px, batch 128, SGD lr 0.001 momentum 0.9 unless a run's name says otherwise "
            f"(smallcnn: the Keras study's small CNN at 200 px; adam: Adam lr 0.001; accN: N micro-batches a step), "
            f"one device-resident batch, "
            f"{ctx.step_seconds} s of steps after 15 warm-up steps; PyTorch {ctx.torch_line} at its best eager "
            "settings (channels_last, cudnn.benchmark, fused SGD; amp: autocast f16 + GradScaler; amp-bf16: autocast "
            "bf16, no scaler; tf32: TF32 in cuBLAS and cuDNN).")


def step(ctx, budget):
    end = time.monotonic() + budget
    rows, ips, failed, cut = [], {}, False, False
    for spec in ctx.step_runs:
        b = int(end - time.monotonic())
        if b < ctx.step_min:   # a run needs warm-up and some timed steps to mean anything
            rows.append(f"| {spec} | not run: {b} s left | |")
            cut = True
            continue
        say(f"  step {spec} (at most {b} s)")
        rc, d = step_run(ctx, spec, b)
        if d and "images_per_s" in d:
            ips[spec] = round(d["images_per_s"], 1)
            rows.append(f"| {spec} | {ips[spec]:.1f} | {step_detail(d)} |")
        elif rc in STOPPED:
            rows.append(f"| {spec} | cut by the budget | |")
            cut = True
        else:
            why = tail(ctx.logs / ("step_" + spec.replace(":", "_") + ".log"), 2).replace("|", "/")[:200]
            rows.append(f"| {spec} | failed (exit {rc}): {why} | |")
            failed = True
    md = ["## 2. Training step: minidl beside PyTorch", "", step_header(ctx), "",
          "| run | images/s | detail |", "| --- | ---: | --- |", *rows]
    for line in step_ratios(ctx.step_runs, ips):
        md += ["", line]
    return status_of(0, cut=cut, failed=failed), "\n".join(md) + "\n"


# ---------------------------------------------------------------- 3 compute-sanitizer memcheck
def find_sanitizer():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for pat in ("/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda*/bin/compute-sanitizer",
                "/opt/nvidia/*/compute-sanitizer"):
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[0]
    return None


def sanitizer_verdict(rc, text, budget):
    """(status, the section's line) from memcheck's exit status and log."""
    errs = (re.findall(r"ERROR SUMMARY: \d+", text) or [None])[-1]
    passed, _, _, running = gtest_counts(text)
    tests_line = f"{passed} tests passed under memcheck"
    if rc == 0:
        return PASSED, f"clean ({errs or 'no summary'}; {tests_line})"
    if rc in STOPPED:
        status = FAILED if re.search(r"ERROR SUMMARY: [1-9]", text) else CUT
        return status, f"cut at {budget} s ({errs or 'no summary so far'}; {tests_line}; running: {running})"
    if rc == 99:
        excerpt = [ln for ln in text.splitlines() if "=========" in ln][:30]
        return FAILED, "\n".join([f"memcheck errors: {errs}", "", "```", *excerpt, "```"])
    return FAILED, f"exit {rc} ({errs or 'no summary'}; {tests_line}): test failures under the sanitizer"


def sanitizer(ctx, budget):
    san = find_sanitizer()
    if not san:
        return SKIPPED, ("## 3. compute-sanitizer memcheck\n\nnot run: compute-sanitizer not found "
                         "(PATH, /usr/local/cuda*/bin)\n")
    log = ctx.logs / "sanitizer.log"
    # cuDNN autotuning under memcheck takes minutes; the autotune cases are left to the plain run.
    rc = run_until([san, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode", "99",
                    ctx.bin / "kernels_cuda", "--gtest_color=no", f"--gtest_filter={ctx.sanitizer_filter}"],
                   log, budget)
    status, line = sanitizer_verdict(rc, read(log), budget)
    return status, f"## 3. compute-sanitizer memcheck (kernels_cuda, filter `{ctx.sanitizer_filter}`)\n\n{line}\n"


# ---------------------------------------------------------------- 4 the step-time model, calibrated
def model_table(work, gpu_line):
    """The model table the stage names (MODEL_TSV, the H100's; MODEL_TSV_H200 on an H200), as a
    path in the tree, or '' when the stage names none or it is not here."""
    tsv = (Path(work) / "MODEL_TSV").read_text().strip() if (Path(work) / "MODEL_TSV").exists() else ""
    h200 = Path(work) / "MODEL_TSV_H200"
    if "H200" in gpu_line and h200.exists() and h200.read_text().strip():
        tsv = h200.read_text().strip()
    tsv = tsv.splitlines()[0] if tsv else ""
    return tsv if tsv and (ROOT / tsv).is_file() else ""


def model(ctx, budget):
    program = ctx.bin / "minidl-gpumodel-cuda"
    if ctx.rehearse or not program.exists():
        why = "a rehearsal has no GPU to time" if ctx.rehearse else "no minidl-gpumodel-cuda in the stage"
        return SKIPPED, f"## 4. Step-time model: modelled against measured\n\nnot run: {why}\n"
    tsv, t0, rc, parts = model_table(ctx.work, ctx.gpu_line), time.monotonic(), 0, []
    for b in ctx.model_batches:   # one run per batch, each with what is left of the budget
        part = budget - int(time.monotonic() - t0)
        if part < 10:
            parts.append(f"(batch {b}: not run, the phase's {budget} s were spent)")
            rc = 124
            break
        log, out = ctx.logs / f"model_b{b}.log", ctx.logs / f"model_b{b}.md"
        rc = run_until([program, "--measure", "--batch", b, "--configs", ctx.model_configs,
                        *(["--modelled", ROOT / tsv] if tsv else []), "--out", out], log, part, grace=10)
        if rc == 0 and read(out):
            parts.append(read(out).rstrip("\n"))
        else:
            parts.append(f"batch {b}: exit {rc} after at most {part} s: {tail(log, 3)}")
            break
    (ctx.logs / "model.md").write_text("\n".join(parts) + "\n")
    md = (f"## 4. Step-time model: modelled (`{tsv}`) against measured (CUDA events per launch)\n\n"
          + "\n".join(parts) + "\n")
    return status_of(rc), md


# ---------------------------------------------------------------- 4b PyTorch's step by kernel
def profile(ctx, budget):
    """PyTorch's AMP step at batch 256 under torch.profiler, by kernel category, beside minidl's
    measured launches of the model phase in the same categories (bench/step_categories.py)."""
    if ctx.rehearse:
        args = ["--device", "cpu", "--model", "resnet18-small", "--image-size", "32", "--batch", "4",
                "--warmup", "1", "--profile-steps", "2"]
    else:
        args = ["--device", "cuda", "--model", "resnet50", "--image-size", "224", "--batch", "256",
                "--warmup", "15", "--profile-steps", "5"]
    log, table, pjson = ctx.logs / "profile.log", ctx.logs / "profile.md", ctx.logs / "profile.json"
    rc = run_until([ctx.torch_py, ROOT / "bench/pytorch_step.py", *args, "--precision", "amp",
                    "--profile-out", table, "--json", pjson], log, budget, env={"PYTHONUNBUFFERED": "1"})
    md = ["## 4b. PyTorch's AMP step by kernel category (torch.profiler)", ""]
    if rc == 0 and read(table):
        md.append(read(table).rstrip("\n"))
        if read(ctx.logs / "model.md"):
            cats = subprocess.run(["python3", ROOT / "bench/step_categories.py", "--minidl", ctx.logs / "model.md",
                                   "--pytorch", pjson], capture_output=True, text=True).stdout
            md += ["", "minidl's measured launches (section 4's first configuration, batch 256: channels-last by "
                   "default, PyTorch's layout) beside PyTorch's, by category:", "", cats.rstrip("\n")]
    else:
        md.append(f"exit {rc} after at most {budget} s: {tail(log, 3)}")
    return status_of(rc), "\n".join(md) + "\n"


# ---------------------------------------------------------------- 5 short benchmarks
UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1, "s": 1e3}


def bench_table(d):
    """Google Benchmark's JSON -> a Markdown table (aggregates left out)."""
    rows = ["| benchmark | time (ms) | GB/s | vs D2D copy | TFLOP/s |", "| --- | ---: | ---: | ---: | ---: |"]
    for b in d.get("benchmarks", []):
        if b.get("run_type") == "aggregate":
            continue
        t = b.get("real_time", 0) * UNIT_MS[b.get("time_unit", "ns")]
        f = lambda k, fmt: (fmt % b[k]) if k in b else ""
        rows.append(f"| {b['name']} | {t:.3f} | {f('GB/s', '%.0f')} | {f('vs_copy', '%.2f')} | {f('TFLOP/s', '%.1f')} |")
    return "\n".join(rows)


def bench(ctx, budget):
    program = ctx.bin / "minidl_bench_cuda"
    if ctx.rehearse or not program.exists():
        why = "a rehearsal has no GPU to time" if ctx.rehearse else "no minidl_bench_cuda in the stage"
        return SKIPPED, f"## 5. Benchmarks\n\nnot run: {why}\n"
    log, out = ctx.logs / "bench.log", ctx.logs / "bench.json"
    rc = run_until([program, f"--benchmark_filter={ctx.bench_filter}", f"--benchmark_out={out}",
                    "--benchmark_out_format=json"], log, budget)
    try:
        table = bench_table(json.loads(out.read_text()))
    except (OSError, ValueError, KeyError):   # a cut run leaves the JSON unfinished: the console lines
        console = [ln for ln in read(log).splitlines() if re.match(r"^[A-Za-z0-9_/:.]+ +[0-9.]+ [mun]?s ", ln)]
        table = "\n".join([f"exit {rc}; no JSON; the console lines:", "", "```", *console[:40], "```"])
    return status_of(rc), ("## 5. Benchmarks (CUDA events after warm-up; 256 MiB operands; GB/s counts bytes read + "
                           f"written; target vs_copy >= 0.85)\n\n{table}\n")


# ---------------------------------------------------------------- 6 the largest AMP batch under 11 GiB
def last_number(rx, text):
    found = re.findall(rx, text)
    return found[-1] if found else None


def maxbatch(ctx, budget):
    end = time.monotonic() + budget
    if ctx.rehearse:
        args = ["--device", "cpu", "--model", "smallcnn", "--image-size", "32", "--memory-budget", "64MiB", "--limit", "64"]
    else:
        args = ["--device", "cuda", "--model", "resnet50", "--image-size", "224", "--memory-budget", "11GiB"]
    mlog = ctx.logs / "maxbatch_minidl.log"
    rc1 = run_until([ctx.bin / "minidl-maxbatch", *args, "--amp", "--steps", "3"], mlog,
                    int(end - time.monotonic()) * 55 // 100, sig=signal.SIGINT, grace=10)
    m = last_number(r"maximum batch: (\d+)", read(mlog))
    rc2 = 0
    if ctx.rehearse:
        p = "not run (rehearsal: a memory fraction is a CUDA allocator setting)"
    else:
        plog = ctx.logs / "maxbatch_pytorch.log"
        rc2 = run_until([ctx.torch_py, ROOT / "bench/pytorch_step.py", "--model", "resnet50", "--precision", "amp",
                         "--batch", "128", "--max-batch-under", "11GiB", "--json", ctx.logs / "maxbatch_pytorch.json"],
                        plog, int(end - time.monotonic()), env={"PYTHONUNBUFFERED": "1"})
        p = last_number(r"largest batch under [^:]*: (\d+)", read(plog)) or f"no result (exit {rc2}): {tail(plog, 1, 160)}"
    md = ["## 6. Largest AMP batch under an 11 GiB budget (ResNet-50, 224 px, 3 steps a trial)", "",
          "| framework | largest batch | how |", "| --- | --- | --- |",
          f"| minidl | {m or f'no result (exit {rc1}): {tail(mlog, 1, 160)}'} | minidl-maxbatch --memory-budget "
          "(the allocator caps reserved bytes) |",
          f"| PyTorch | {p} | torch.cuda.set_per_process_memory_fraction(11 GiB / total), doubling then bisection |"]
    if m is None and rc1 not in STOPPED:
        status = FAILED
    else:
        status = CUT if rc1 in STOPPED or rc2 in STOPPED else PASSED
    return status, "\n".join(md) + "\n"


PHASES = {"tests": tests, "step": step, "sanitizer": sanitizer, "model": model, "profile": profile,
          "bench": bench, "maxbatch": maxbatch}
