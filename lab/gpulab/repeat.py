"""`gpulab repeat`: one minidl_bench_step configuration in several fresh processes under each of
several environments, interleaved: the spread between processes (cuDNN's autotuning picks its
algorithms anew in each) beside the difference a setting makes, which one step run per
configuration (the check's step phase) cannot tell apart."""
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from . import common
from .common import FAILED, OK, SETUP, Exit, say


def parse_env(spec):
    """'A=1 B=2' -> {'A': '1', 'B': '2'}; '-' -> {}."""
    if spec == "-":
        return {}
    out = {}
    for word in spec.split():
        name, eq, value = word.partition("=")
        if not eq or not name:
            raise Exit(SETUP, f"environment '{spec}': expected NAME=VALUE words, or - for none")
        out[name] = value
    return out


def result_row(rnd, spec, rc, log_text):
    """(the report's row, images/s or None)."""
    line = next((ln for ln in log_text.splitlines() if "images/s" in ln), "").replace("|", "/")
    m = re.search(r"([0-9.]+) images/s", log_text)
    ips = m.group(1) if m else None
    if rc != 0 or ips is None:
        ips = None
        line = f"exit {rc}: " + " ".join(log_text.splitlines()[-2:]).replace("|", "/")[:200]
    return f"| {rnd} | `{spec}` | {ips or '-'} | {line[:240]} |", ips


def render(commit, gpu, bench_args, rounds, rows):
    return "\n".join([f"# minidl_bench_step in fresh processes, {time.strftime('%Y-%m-%d', time.gmtime())} "
                      f"(commit {commit})", "", f"- GPU: {gpu}",
                      f"- arguments: `{' '.join(bench_args)}`; {rounds} processes per environment, interleaved", "",
                      "| round | environment | images/s | line |", "| ---: | --- | ---: | --- |", *rows]) + "\n"


def gpu_name():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        return r.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(args):
    envs = [(e, parse_env(e)) for e in args.envs]
    if not envs or not args.bench_args:
        raise Exit(SETUP, "give at least one ENV, then -- and minidl_bench_step's arguments")
    stage = Path(args.dir) / "stage.tar.xz"
    if not stage.is_file():
        raise Exit(SETUP, f"{stage} not found: stage it with 'python3 -m lab.gpulab stage' and carry {args.dir}")
    out = Path(os.environ.get("OUT") or ".gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_repeat."))
    common.unpack(stage, work)
    common.set_library_path(work / "lib")
    commit, gpu, report = common.first_line(work / "COMMIT"), gpu_name(), out / "gpu_repeat.md"
    rows, failed = [], False
    for rnd in range(1, args.rounds + 1):
        for spec, env in envs:
            r = subprocess.run([work / "bin/minidl_bench_step", *args.bench_args], capture_output=True, text=True,
                               env={**os.environ, **env})
            row, ips = result_row(rnd, spec, r.returncode, r.stdout + r.stderr)
            rows.append(row)
            failed = failed or ips is None
            report.write_text(render(commit, gpu, args.bench_args, args.rounds, rows))   # after every process
            say(f"round {rnd}, {spec}: {ips or 'failed'}")
    print(report.read_text(), end="")
    return FAILED if failed else OK
