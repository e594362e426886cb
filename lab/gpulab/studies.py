"""`gpulab studies`: the experiment studies on a GPU machine whose calls last at most a few
minutes and start bare. One call runs the steps of a plan under a wall-clock deadline (SIGINT to
the sweep at its deadline: it stops at a step boundary and writes what it has), resumes from an
earlier call's tarball, and packs everything into ONE tarball in $OUT with a short summary printed
last. `gpulab collect` and `gpulab plot` bring the returned studies into lab/results/experiments/."""
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import common
from .common import CUT, FAILED, OK, ROOT, SETUP, Exit, Terminated, say

STUDIES = ["keras-batch", "utilization", "utilization-amp", "techniques", "lr-scaling", "batch-schedule",
           "conv-bn-chain"]
STEPS = STUDIES + ["pytorch"]
# bench/pytorch_utilization.py's runs: (name, flags), each into results/utilization/pytorch-NAME.csv.
PYTORCH_VARIANTS = (("f32", ()), ("best", ("--best",)), ("best-graphs", ("--best", "--cuda-graphs")))


def parse_plan(plan, rehearse):
    """'utilization:170,keras-batch' -> [(step, cap seconds or None)]. A pytorch step follows the
    last utilization step (capped at 150 s) unless the plan lists one."""
    steps = []
    for token in [t for t in plan.split(",") if t]:
        name, _, cap = token.partition(":")
        if name not in STEPS:
            raise Exit(SETUP, f"PLAN step '{name}': expected {', '.join(STEPS[:-1])} or pytorch")
        if cap and not cap.isdigit():
            raise Exit(SETUP, f"PLAN step '{token}': the cap after ':' is whole seconds")
        steps.append((name, int(cap) if cap else None))
    if not steps:
        raise Exit(SETUP, "no PLAN: e.g. utilization:170,keras-batch:200,techniques (see --help)")
    if all(n != "pytorch" for n, _ in steps):
        last = max((i for i, (n, _) in enumerate(steps) if n.startswith("utilization")), default=None)
        if last is not None:
            steps.insert(last + 1, ("pytorch", 4 if rehearse else 150))
    return steps


@dataclass
class Settings:
    rehearse: bool
    deadline: int
    grace: int
    data: str
    stage: str
    previous: str
    workers: int
    extra: list = field(default_factory=list)

    @property
    def pack_reserve(self):   # packing and the summary after the last step
        return 2 if self.rehearse else 15

    @property
    def min_step(self):       # a step with less time than this is not started
        return 2 if self.rehearse else 30

    @property
    def device(self):
        return "cpu" if self.rehearse else "cuda"


def settings_from(env, rehearse):
    cores = os.cpu_count() or 2
    return Settings(rehearse,
                    deadline=common.env_int(env, "GPU_STUDIES_DEADLINE", 20 if rehearse else 540),
                    grace=common.env_int(env, "GPU_STUDIES_GRACE", 8 if rehearse else 60),
                    data=env.get("GPU_STUDIES_DATA") or ".data/catsdogs",
                    stage=env.get("GPU_STUDIES_STAGE") or "build-gpu-studies",
                    previous=env.get("GPU_STUDIES_PREVIOUS") or ".gpu-results",
                    workers=common.env_int(env, "GPU_STUDIES_WORKERS", cores - 2 if cores > 4 else 2),
                    extra=(env.get("GPU_STUDIES_EXTRA") or "").split())



def set_aside_results(root):
    """A results/ under root left by an earlier call (a warm machine keeps its tree between calls) is
    moved to a new folder beside the temporary files, whose path is returned (None when there was
    none): a call restores what its carried tarballs hold and nothing else."""
    results = Path(root) / "results"
    if not results.exists():
        return None
    dest = Path(tempfile.mkdtemp(prefix="gpu_studies.kept.")) / "results"
    shutil.move(str(results), str(dest))
    return dest

def worse(code, new):
    """The call's exit status so far with a step's: a failure stays, a cut only replaces success."""
    return FAILED if FAILED in (code, new) else (CUT if CUT in (code, new) else OK)


def not_started(budget, left, kept):
    """Why a step did not start: the seconds it would get (never below 0) and what the call had
    left before the grace and packing (`kept` seconds) were set aside, e.g. 'not started: 0 s for
    it (9 s left, 10 kept for the grace and packing)'."""
    return f"not started: {max(budget, 0)} s for it ({max(left, 0)} s left, {kept} kept for the grace and packing)"


def count_runs(listing):
    """minidl-sweep --list: (runs done, runs in all)."""
    lines = [ln for ln in listing.splitlines() if ln.strip()]
    return sum(ln.endswith(" done") for ln in lines), len(lines)


def sweep_state(rc, elapsed, budget, grace, done, total, error_line=""):
    """(what the step table says, the step's exit class, whether it resumes next call)."""
    if rc == 0 and done != total:
        return "finished with runs left over", CUT, True
    if rc == 0:
        return "finished", OK, False
    if rc == 124:
        return f"cut by the deadline at {budget} s (SIGINT); resumes next call", CUT, True
    if rc == 137 and elapsed >= budget:
        return (f"killed {grace} s after the SIGINT; summary.md/results.json may be stale (the next call rewrites "
                "them)", CUT, True)
    if rc == 137:
        return f"killed (SIGKILL) after {elapsed} s, before its deadline: out of host memory?", FAILED, False
    return f"failed, exit {rc}: {error_line[:200]}", FAILED, False


class Call:
    """One call of the studies runner: the staged programs, the step table, packing."""

    def __init__(self, s, plan, argv):
        self.s, self.plan, self.argv = s, plan, argv
        self.clock = common.Clock(s.deadline)
        self.rows, self.code, self.todo = [], OK, []
        self.prefix = "gpu_studies_" + ("rehearsal_" if s.rehearse else "")   # rehearsals never mix with real ones
        self.stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.rundir = Path("results/gpu_studies") / self.stamp
        self.ready = False

    def study_dir(self, study):
        return Path("results") / (study + ("-quick-cpu" if self.s.rehearse else ""))

    def left(self):
        return self.clock.left()

    def finish(self, code, todo_step=None):
        self.code = worse(self.code, code)
        if todo_step:
            self.todo.append(todo_step)

    # ------------------------------------------------ set-up
    def set_up(self):
        s = self.s
        self.gpu_line = common.detect_gpu(s.rehearse)
        kept = set_aside_results(Path("."))
        if kept:
            say(f"a results/ left by an earlier call on this machine was moved to {kept}: a call starts from what "
                f"{s.previous}/ holds, so that what it runs depends on what it carries")
        self.rundir.mkdir(parents=True, exist_ok=True)
        say(f"GPU: {self.gpu_line}; plan {' '.join(n for n, _ in self.plan)}; deadline {s.deadline} s")
        tarball = Path(s.stage) / "studies.tar.xz"
        if not tarball.is_file():
            raise Exit(SETUP, f"no {tarball}: run 'python3 -m lab.gpulab stage' on the build machine and carry {s.stage}")
        work = Path(tempfile.mkdtemp(prefix="gpu_studies."))
        common.unpack(tarball, work)
        self.bin, self.work = work / "bin", work
        self.commit = common.first_line(work / "COMMIT")
        common.set_library_path(work / "lib")
        common.check_libraries(sorted(self.bin.iterdir()))
        smoke = subprocess.run([self.bin / "minidl-sweep", "--help"], capture_output=True, text=True)
        if smoke.returncode != 0:
            raise Exit(SETUP, "the staged minidl-sweep does not start here: "
                              + " ".join((smoke.stdout + smoke.stderr).splitlines()[:3]))
        self.libraries = common.cuda_libs_line(common.ldd(self.bin / "minidl-sweep")[0])
        say(f"programs from {s.stage} (commit {self.commit}); {self.libraries}")
        self.restored = self.restore()
        if self.restored != "none":
            say(f"restored earlier results: {self.restored}")
        self.py, self.torch = common.torch_python()
        (self.rundir / "provenance.md").write_text(self.provenance())

    def restore(self):
        """Earlier calls' results: every <prefix>2*.tar.gz in the previous folder in name order (each
        holds all results so far), then a results/ folder there copied over."""
        prev, restored = Path(self.s.previous), []
        if not prev.is_dir():
            return "none"
        for t in sorted(prev.glob(self.prefix + "2*.tar.gz")):
            common.unpack(t, ".", only="results")
            restored = [t.name]
        if (prev / "results").is_dir():
            shutil.copytree(prev / "results", "results", dirs_exist_ok=True)
            restored.append(f"{prev}/results/")
        return " + ".join(restored) or "none"

    def provenance(self):
        s = self.s
        tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        extra = f", extra flags: {' '.join(s.extra)}" if s.extra else ""
        md = [f"# GPU studies call {self.stamp}", ""]
        if s.rehearse:
            md += ["**CPU rehearsal (--rehearse): --device cpu --quick; not GPU results.**", ""]
        md += [f"- command: `python3 -m lab.gpulab studies {' '.join(self.argv)}` (deadline {s.deadline} s, grace "
               f"{s.grace} s, {s.workers} loader workers{extra})",
               f"- plan as run: {' '.join(n for n, _ in self.plan)}",
               f"- staged commit (the programs): {common.stage_commit_line(self.work)}; tree: {tree or 'no .git here'}",
               f"- started: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; restored: {self.restored}",
               *common.machine_lines(self.gpu_line), f"- libraries: {self.libraries}", f"- PyTorch: {self.torch}"]
        if shutil.which("nvidia-smi"):
            q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id,compute_cap,clocks.max.sm,"
                 "clocks.max.mem,power.limit", "--format=csv"]
            run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True)
            md += ["", "```", (run(q).stdout + run(["nvidia-smi"]).stdout).rstrip("\n"), "```"]
        return "\n".join(md) + "\n"

    # ------------------------------------------------ the steps
    def have_photos(self):
        return all(any(Path(self.s.data, c).glob("*.jpg")) for c in ("cat", "dog"))

    def sweep_args(self, study):
        # One process per run: a run that crashes becomes a `crashed` row and the study goes on.
        a = ["--study", study.removesuffix("-amp"), "--device", self.s.device, "--workers", str(self.s.workers),
             "--out", "results", "--process-per-run"] + (["--quick"] if self.s.rehearse else [])
        if study == "utilization-amp":
            a.append("--amp")
        if not study.startswith("utilization"):
            a += ["--data", self.s.data]
        return a + self.s.extra

    def run_sweep(self, study, cap):
        t0 = self.clock.elapsed()
        if not study.startswith("utilization") and not self.have_photos():
            self.rows.append(f"| {study} | not run: no photos in {self.s.data} (carry .data; 'python3 -m lab.gpulab "
                             "stage' copies them) | | 0 |")
            return self.finish(FAILED)
        args = self.sweep_args(study)
        left, kept = self.left(), self.s.grace + self.s.pack_reserve
        budget = min(cap or 999999, left - kept)
        if budget < self.s.min_step:
            self.rows.append(f"| {study} | {not_started(budget, left, kept)} | | 0 |")
            return self.finish(CUT, study)
        say(f"{study}: minidl-sweep {' '.join(args)} (SIGINT after {budget} s)")
        log = self.rundir / f"{study}.log"
        rc = common.run_until([self.bin / "minidl-sweep", *args], log, budget, sig=signal.SIGINT, grace=self.s.grace)
        listing = subprocess.run([self.bin / "minidl-sweep", *args, "--list"], capture_output=True, text=True).stdout
        done, total = count_runs(listing)
        errors = [ln for ln in log.read_text(errors="replace").splitlines() if "error" in ln]
        elapsed = self.clock.elapsed() - t0
        state, code, again = sweep_state(rc, elapsed, budget, self.s.grace, done, total, errors[-1] if errors else "")
        self.finish(code, study if again else None)
        self.rows.append(f"| {study} | {state} | {done} of {total} | {elapsed} |")
        say(f"{study}: {state}; {done} of {total} runs done")

    def run_pytorch(self, cap):
        t0, d = self.clock.elapsed(), self.study_dir("utilization")
        if not Path("bench/pytorch_utilization.py").is_file():
            self.rows.append("| pytorch | skipped: bench/pytorch_utilization.py is not in this tree | | 0 |")
            return
        d.mkdir(parents=True, exist_ok=True)
        states = self.pytorch_variants(cap, t0, d) + self.pytorch_compare(d)
        text = "; ".join(states)
        self.rows.append(f"| pytorch | {text} | | {self.clock.elapsed() - t0} |")
        say(f"pytorch: {text}")

    def pytorch_variants(self, cap, t0, d):
        """f32: like for like with minidl's study; best: PyTorch's best eager settings (AMP,
        channels_last, cudnn.benchmark, fused SGD), the bar to clear; best-graphs: the same steps
        replayed from CUDA graphs, as minidl's study replays its own on a GPU (CUDA only)."""
        r = self.s.rehearse
        states = []
        for variant, flags in PYTORCH_VARIANTS:
            csv = d / f"pytorch-{variant}.csv"
            if csv.is_file() and csv.stat().st_size:
                states.append(f"{variant}: measured in an earlier call")
                continue
            if "--cuda-graphs" in flags and self.s.device != "cuda":
                states.append(f"{variant}: not on {self.s.device} (CUDA graphs)")
                continue
            left, kept = self.left(), 10 + self.s.pack_reserve
            budget = min((cap or 999999) - (self.clock.elapsed() - t0), left - kept)
            if budget < self.s.min_step:
                states.append(f"{variant}: {not_started(budget, left, kept)}")
                self.finish(CUT, "pytorch")
                break
            say(f"pytorch {variant}: bench/pytorch_utilization.py (at most {budget} s)")
            log, part = self.rundir / f"pytorch-{variant}.log", Path(f"{csv}.part")
            rc = common.run_until([self.py, "bench/pytorch_utilization.py", "--device", self.s.device, "--model",
                                   "resnet50", "--image-size", "32" if r else "224", "--batches",
                                   "2,4" if r else "4,8,16,32,64,128,256,512,1024", "--steps", "2" if r else "20",
                                   *flags, "--out", part],
                                  log, budget, grace=10, env={"PYTHONUNBUFFERED": "1"})
            if rc == 0 and part.is_file() and part.stat().st_size:
                part.rename(csv)
                states.append(f"{variant}: done")
            elif rc in (124, 137):
                states.append(f"{variant}: cut at {budget} s (partial rows in {part.name})")
                self.finish(CUT, "pytorch")
                break
            else:
                states.append(f"{variant}: failed, exit {rc} ({common.tail(log, 1, 150)})")
                self.finish(FAILED)
        return states

    def compare(self, minidl_csv, pytorch_csv, label, out, log):
        r = subprocess.run([self.py, "bench/compare_utilization.py", "--minidl", minidl_csv, "--pytorch", pytorch_csv,
                            "--steady", "--busy", "--pytorch-label", label], capture_output=True, text=True)
        Path(log).write_text(r.stderr)
        if r.returncode == 0:
            Path(out).write_text(r.stdout)
            return True
        Path(out).unlink(missing_ok=True)
        self.finish(FAILED)
        return False

    def pytorch_compare(self, d):
        """The side-by-side tables for every baseline measured so far; --best also against the
        utilization-amp table (the same precision on both sides)."""
        if not Path("bench/compare_utilization.py").is_file():
            return ["no bench/compare_utilization.py: no side-by-side table"]
        states, version = [], self.torch.split(" ")[0]
        if (d / "results.csv").is_file():
            for csv in sorted(d.glob("pytorch-*.csv")):
                v = csv.stem.removeprefix("pytorch-")
                if not self.compare(d / "results.csv", csv, f"PyTorch {version} {v}", d / f"compare-{v}.md",
                                    self.rundir / f"compare-{v}.log"):
                    states.append(f"compare {v} failed (see compare-{v}.log)")
        amp = self.study_dir("utilization-amp")
        for v in ("best", "best-graphs"):
            if (amp / "results.csv").is_file() and (d / f"pytorch-{v}.csv").is_file():
                if not self.compare(amp / "results.csv", d / f"pytorch-{v}.csv", f"PyTorch {version} {v}",
                                    amp / f"compare-{v}.md", self.rundir / f"compare-{v}-amp.log"):
                    states.append(f"compare {v} vs minidl amp failed (see compare-{v}-amp.log)")
        return states

    # ------------------------------------------------ packing
    def summary(self, note):
        md = [f"# GPU studies call {self.stamp}: {note}", ""]
        if self.s.rehearse:
            md += ["**CPU rehearsal: not GPU results.**", ""]
        md += [f"- {self.gpu_line}; programs at commit {self.commit}; {self.clock.elapsed()} s of the "
               f"{self.s.deadline} s deadline", f"- plan: {' '.join(n for n, _ in self.plan)}; restored: {self.restored}",
               "", "| step | state | runs done | seconds |", "| --- | --- | --- | ---: |", *self.rows]
        if self.todo:
            again = ("--rehearse " if self.s.rehearse else "") + ",".join(dict.fromkeys(self.todo))
            md += ["", f"To resume: put this call's tarball in .gpu-results/ and run `python3 -m lab.gpulab studies "
                       f"{again}` (carry .gpu-results)."]
        for study in STUDIES:
            d = self.study_dir(study)
            if not (d / "summary.md").is_file():
                continue
            md += ["", f"## {study} ({d}/summary.md)", ""]
            md += [ln[:300] for ln in (d / "summary.md").read_text().splitlines() if ln.startswith("|")]
            for c in sorted(d.glob("compare-*.md")):
                md += ["", f"### {c.name}", "", *c.read_text().splitlines()[:30]]
        return "\n".join(md) + "\n"

    def pack(self, note):
        text = self.summary(note)
        (self.rundir / "summary.md").write_text(text)
        out = os.environ.get("OUT")
        dest = Path(out) if out and os.path.isdir(out) else Path(self.s.previous)
        dest.mkdir(parents=True, exist_ok=True)
        tarball = dest / f"{self.prefix}{self.stamp}.tar.gz"
        with tarfile.open(tarball, "w:gz") as t:
            t.add("results")
        shutil.copy(self.rundir / "summary.md", dest / "gpu_studies_summary.md")
        say(f"packed {tarball} ({common.mib(tarball.stat().st_size)} MiB); logs and provenance in {self.rundir}")
        return text

    def run(self):
        for name, cap in self.plan:
            if name == "pytorch":
                self.run_pytorch(cap)
            else:
                self.run_sweep(name, cap)
        note = {OK: "every step finished", CUT: "cut by the deadline: resume in the next call"}.get(self.code,
                                                                                                 "a step failed")
        text = self.pack(note)
        print()
        print(text, end="")
        print(closing(text), end="")
        return self.code


def main(args):
    s = settings_from(os.environ, args.rehearse)
    call = Call(s, parse_plan(args.plan, args.rehearse), args.argv)
    common.catch_sigterm()
    try:
        call.set_up()
        call.ready = True   # from here on a SIGTERM packs what there is
        return call.run()
    except Terminated:
        if not call.ready:
            raise Exit(CUT, f"stopped by SIGTERM after {call.clock.elapsed()} s, before any step")
        call.rows.append(f"| (runner) | stopped by SIGTERM at {call.clock.elapsed()} s | | |")
        call.code = worse(call.code, CUT)
        text = call.pack("stopped by SIGTERM")
        print(text + closing(text), end="")
        return CUT


# ---------------------------------------------------------------- here: collect and plot
def collect_target(study, dest):
    """Where a returned study goes: None for the runner's own folder and quick CPU runs."""
    if study == "gpu_studies" or "-quick-" in study:
        return None
    return Path(dest) / (f"{study}-cuda" if study in ("utilization", "utilization-amp") else f"{study}-photos-cuda")


def step_table(summary_text):
    """The step table of a call's summary.md: from its '| step' line to the first empty line."""
    out, inside = [], False
    for ln in summary_text.splitlines():
        inside = inside or ln.startswith("| step")
        if inside and not ln.strip():
            break
        if inside:
            out.append(ln)
    return "\n".join(out)


def closing(summary_text):
    """Printed after the summary: its first line and step table again (and the resume line), since
    the remote tool returns only the output's last 12,000 characters and the studies' tables
    after the step table are longer than that (15 KB in the 2026-11-28 rehearsal)."""
    lines = summary_text.splitlines()
    resume = [ln for ln in lines if ln.startswith("To resume:")]
    return "\n".join(["", "---", (lines or [""])[0], "", *resume, *([""] if resume else []), step_table(summary_text)]) + "\n"


def collect(args):
    tarball = Path(args.tarball)
    if not tarball.is_file():
        raise Exit(SETUP, "collect needs the newest gpu_studies_<stamp>.tar.gz a call returned (it holds every call's results)")
    if tarball.name.startswith("gpu_studies_rehearsal_"):
        raise Exit(SETUP, f"{tarball} is a CPU rehearsal: nothing to collect")
    tmp = Path(tempfile.mkdtemp(prefix="gpu_collect."))
    common.unpack(tarball, tmp, only="results")
    if not (tmp / "results").is_dir():
        raise Exit(SETUP, f"no results/ in {tarball}")
    calls = "".join(f"{(c / 'provenance.md').read_text()}\n{step_table((c / 'summary.md').read_text())}\n\n"
                    for c in sorted((tmp / "results/gpu_studies").glob("*/")) if (c / "summary.md").is_file())
    collected = []
    for d in sorted(p for p in (tmp / "results").iterdir() if p.is_dir()):
        target = collect_target(d.name, args.dest)
        if target is None:
            continue
        target.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            if f.is_file():
                shutil.copy(f, target)
        (target / "gpu_calls.md").write_text(calls)   # every call's provenance and step table
        say(f"collected {d.name} into {target}")
        collected.append(target)
    if not collected:
        raise Exit(SETUP, f"no study results in {tarball}")
    if shutil.which("gnuplot"):
        return plot_dirs(collected)
    say(f"no gnuplot here: apt-get install gnuplot-nox, then python3 -m lab.gpulab plot {' '.join(map(str, collected))}")
    return OK


def plot_settings(dat_text):
    """(gnuplot settings of the '# plot: ' first line, its ylab)."""
    m = re.search(r"^# plot: (.*)$", dat_text, re.M)
    settings = m.group(1) if m else ""
    y = re.search(r"ylab='([^']*)'", settings)
    return settings, y.group(1) if y else ""


def link_plot(summary_text, dat_name, png_name, ylab):
    """summary.md's 'No plot: ...' line naming this data file becomes the image's link."""
    return re.sub(rf"^No plot: .*{re.escape(dat_name)}.*$", f"![{ylab}]({png_name})", summary_text, flags=re.M)


def plot_dirs(dirs):
    if not shutil.which("gnuplot"):
        raise Exit(SETUP, "gnuplot is not installed here (apt-get install gnuplot-nox)")
    for d in map(Path, dirs):
        dats = sorted(d.glob("*.png.dat"))
        if not dats:
            say(f"no *.png.dat in {d}: nothing to draw")
        for f in dats:
            png = f.with_suffix("")
            settings, ylab = plot_settings(f.read_text())
            cmd = ["gnuplot", "-e", f"datafile='{f}'; outfile='{png}'; {settings}", ROOT / "tools/plot_results.gnuplot"]
            if subprocess.run(cmd).returncode != 0:
                raise Exit(FAILED, f"gnuplot failed on {f}")
            if (d / "summary.md").is_file():
                (d / "summary.md").write_text(link_plot((d / "summary.md").read_text(), f.name, png.name, ylab))
            say(f"drew {png}")
    return OK
