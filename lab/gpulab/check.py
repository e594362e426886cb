"""`gpulab check`: a GPU session in one call. The phases (phases.py) run in priority order under
one deadline, each with min(its cap, the time left), so what does not fit is cut from the bottom.
The report and a state tarball are rewritten after every phase and copied to $OUT, so a call cut
at any point returns what it measured, and a second call (--resume STATE) runs only the phases
the first did not finish."""
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import common, phases
from .common import CUT, FAILED, OK, SETUP, Exit, Terminated, say

DEFAULT_PHASES = ["tests", "step", "sanitizer", "model", "profile", "bench", "maxbatch"]
# Sized by the first H100 run (lab/journal.md, the GPU sessions): tests took 15 s, memcheck 5, the
# model 4-7, the benchmarks 10; maxbatch did not finish in 66 or 100 s.
DEFAULT_CAPS = {"tests": 60, "step": 190, "sanitizer": 75, "model": 45, "profile": 45, "bench": 40, "maxbatch": 170}
STATUS_NAMES = {phases.PASSED: "passed", phases.FAILED: "failed", phases.CUT: "cut", phases.SKIPPED: "skipped"}
STATE_TARBALL = "gpu_check_state.tar.gz"
LOGS_TARBALL = "gpu_check_logs.tar.gz"


# ---------------------------------------------------------------- the plan
@dataclass
class Plan:
    phases: list
    deadline: int
    caps: dict
    reserve: int = 10    # seconds kept for the last report
    phase_min: int = 15  # a phase is not started with less than this


def plan_from(env, rehearse, deadline=None, phase_list=None):
    """The plan from the flags, else the environment (GPU_CHECK_*), else the defaults."""
    names = [p for p in (phase_list or env.get("GPU_CHECK_PHASES") or ",".join(DEFAULT_PHASES)).split(",") if p]
    for p in names:
        if p not in phases.PHASES:
            raise Exit(SETUP, f"phases: '{p}' is not one of {', '.join(DEFAULT_PHASES)}")
    caps = {p: common.env_int(env, f"GPU_CHECK_CAP_{p.upper()}", DEFAULT_CAPS[p]) for p in names}
    if deadline is None:
        deadline = common.env_int(env, "GPU_CHECK_DEADLINE", 240 if rehearse else 450)
    return Plan(names, deadline, caps, phase_min=common.env_int(env, "GPU_CHECK_PHASE_MIN", 15))


def phase_budget(plan, phase, left):
    """The seconds a phase gets: its cap, or what is left before the report's reserve."""
    return min(plan.caps[phase], left - plan.reserve)


def context_from(env, rehearse):
    return phases.Ctx(
        rehearse=rehearse,
        step_seconds=common.env_int(env, "GPU_CHECK_STEP_SECONDS", 2 if rehearse else 15),
        step_runs=phases.STEP_RUN_PRESETS.get(env.get("GPU_CHECK_STEP_RUNS", ""),
                                              env.get("GPU_CHECK_STEP_RUNS") or phases.DEFAULT_STEP_RUNS).split(),
        step_min=common.env_int(env, "GPU_CHECK_STEP_MIN", 20),
        model_configs=env.get("GPU_CHECK_MODEL_CONFIGS") or "resnet50-amp-nhwc,resnet50-amp",
        model_batches=(env.get("GPU_CHECK_MODEL_BATCHES") or "256").split(),
        sanitizer_filter=env.get("GPU_CHECK_SANITIZER_FILTER") or phases.DEFAULT_SANITIZER_FILTER,
        bench_filter=env.get("GPU_CHECK_BENCH_FILTER") or phases.DEFAULT_BENCH_FILTER)


# ---------------------------------------------------------------- what ran, across calls
@dataclass
class State:
    """Every phase's status per call, and the commit of the stage that measured them."""
    commit: str = ""
    records: list = field(default_factory=list)   # [phase, status, seconds, call]

    def add(self, phase, status, seconds, call):
        self.records.append([phase, status, seconds, call])

    def latest(self, phase):
        rows = [r for r in self.records if r[0] == phase]
        return rows[-1] if rows else None

    def done(self, phase):
        """Finished in an earlier call: its latest status is not 'cut' (a cut phase runs again)."""
        r = self.latest(phase)
        return r is not None and r[1] != "cut"

    def next_call(self):
        return max((r[3] for r in self.records), default=0) + 1

    def to_json(self):
        return json.dumps({"commit": self.commit, "records": self.records}, indent=1)

    @staticmethod
    def from_json(text):
        d = json.loads(text)
        return State(d.get("commit", ""), [list(r) for r in d.get("records", [])])


def exit_code(state, call):
    """This call's verdict: 1 when a phase failed, else 4 when one was cut or not reached, else 0."""
    mine = [r[1] for r in state.records if r[3] == call]
    if any(s not in ("passed", "skipped", "cut") for s in mine):
        return FAILED
    return CUT if "cut" in mine else OK


def run_phases(plan, state, call, clock, run_phase, after_phase):
    """The phases in priority order; each finished one recorded in `state`, then after_phase(name)."""
    for p in plan.phases:
        if state.done(p):
            say(f"{p}: done in an earlier call")
            continue
        budget = phase_budget(plan, p, clock.left())
        if budget < plan.phase_min:
            say(f"{p}: not started ({budget} s left)")
            state.add(p, "cut", 0, call)
            continue
        say(f"{p}: at most {budget} s")
        t0 = clock.elapsed()
        status = STATUS_NAMES[run_phase(p, budget)]
        state.add(p, status, clock.elapsed() - t0, call)
        say(f"{p}: {status} after {clock.elapsed() - t0} s")
        after_phase(p)


# ---------------------------------------------------------------- the report
def render_report(head, plan, state, sections, note):
    """The report's Markdown. head: title, rehearse, command, call, elapsed, commit, date, machine
    (lines), libraries, torch; sections: {phase: Markdown}."""
    md = [f"# GPU check, {head['date']}", ""]
    if head["rehearse"]:
        md += ["**CPU rehearsal (--rehearse): no GPU was used; these are not GPU results.**", ""]
    md += [f"- command: `{head['command']}` (call {head['call']}; deadline {plan.deadline} s; report written at "
           f"{head['elapsed']} s: {note})",
           f"- commit: {head['commit']}", f"- date: {head['now']}", *head["machine"],
           f"- libraries: {head['libraries']}", f"- PyTorch: {head['torch']}",
           f"- phases (priority order): {','.join(plan.phases)}", "",
           "| phase | status | seconds | call |", "| --- | --- | ---: | ---: |"]
    for p in plan.phases:
        r = state.latest(p)
        md.append(f"| {p} | {r[1]} | {r[2]} | {r[3]} |" if r else f"| {p} | not run yet | | |")
    for p in plan.phases:
        md += ["", sections.get(p, f"## {p}\n\nnot run yet\n").rstrip("\n")]
    return "\n".join(md) + "\n"


def summary(report, sections, plan):
    """What is printed last (the remote tool returns only the output's tail): the report's head
    and each section's first 1500 characters."""
    head = report.split("\n## ", 1)[0].rstrip("\n")
    return "\n\n".join([head] + [sections[p][:1500].rstrip("\n") for p in plan.phases if p in sections])


def out_name(name):
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


def report_path(commit, rehearse, date):
    short = commit.split(" ")[0].split("+")[0]
    return Path("lab/results/bench") / f"gpu_check_{date}_{short}{'_rehearsal' if rehearse else ''}.md"


# ---------------------------------------------------------------- one call
class Session:
    """One call: the unpacked stage, the state, and writing the report."""

    def __init__(self, args, plan, ctx, clock):
        self.args, self.plan, self.ctx, self.clock = args, plan, ctx, clock
        self.state, self.call, self.sections = State(), 1, {}
        self.head = {}

    def set_up(self):
        ctx, args = self.ctx, self.args
        ctx.gpu_line = common.detect_gpu(args.rehearse)
        say(f"GPU: {ctx.gpu_line}; deadline {self.plan.deadline} s; phases {','.join(self.plan.phases)}")
        stage = Path(args.dir) / "stage.tar.xz"
        if not stage.is_file():
            raise Exit(SETUP, f"{stage} not found: stage it on the build machine with 'python3 -m lab.gpulab stage' "
                              f"and carry {args.dir}")
        ctx.work = Path(tempfile.mkdtemp(prefix="gpu_check."))
        common.unpack(stage, ctx.work)
        ctx.bin, ctx.logs = ctx.work / "bin", ctx.work / "logs"
        self.sec = ctx.work / "sections"
        ctx.logs.mkdir()
        self.sec.mkdir()
        commit = common.first_line(ctx.work / "COMMIT")
        say(f"executables from {args.dir} (commit {commit}), unpacked in {ctx.work} after {self.clock.elapsed()} s")
        common.set_library_path(ctx.work / "lib")
        common.check_libraries(sorted(ctx.bin.iterdir()))
        libraries = common.cuda_libs_line(common.ldd(ctx.bin / "kernels_cuda")[0])
        say(libraries)
        ctx.torch_py, ctx.torch_line = common.torch_python()
        say(f"PyTorch: {ctx.torch_line}")
        if args.rehearse:
            os.environ["MINIDL_PARITY_SELF_TEST"] = "1"   # the parity suites CPU against CPU
        self.resume(commit)
        self.head = {"rehearse": args.rehearse, "command": "python3 -m lab.gpulab check " + " ".join(args.argv),
                     "call": self.call, "commit": common.stage_commit_line(ctx.work), "date": time.strftime("%Y-%m-%d", time.gmtime()),
                     "machine": common.machine_lines(ctx.gpu_line), "libraries": libraries, "torch": ctx.torch_line}
        self.report = report_path(commit, args.rehearse, self.head["date"])

    def resume(self, commit):
        if self.args.resume:
            path = Path(self.args.resume)
            if not path.is_file():
                raise Exit(SETUP, f"--resume {path}: no such file (the {STATE_TARBALL} an earlier call returned)")
            common.unpack(path, self.sec)
            try:
                self.state = State.from_json((self.sec / "state.json").read_text())
            except (OSError, ValueError) as e:
                raise Exit(SETUP, f"--resume {path}: cannot read it ({e})")
            if self.state.commit and self.state.commit != commit:
                raise Exit(SETUP, f"--resume {path}: it holds results of commit {self.state.commit}, this stage is {commit}")
            self.call = self.state.next_call()
            self.sections = {p.stem: p.read_text() for p in self.sec.glob("*.md")}
            done = " ".join(f"{r[0]}({r[1]})" for r in self.state.records)
            say(f"resuming: phases already done: {done}")
        self.state.commit = commit

    def run_phase(self, name, budget):
        try:
            status, md = phases.PHASES[name](self.ctx, budget)
        except (OSError, ValueError, KeyError, TypeError) as e:   # a broken phase fails alone
            status, md = phases.FAILED, f"## {name}\n\nthe phase stopped with an error: {e!r}\n"
        self.sections[name] = md
        (self.sec / f"{name}.md").write_text(md)
        return status

    def write_report(self, note):
        self.head["elapsed"] = self.clock.elapsed()
        self.head["now"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        text = render_report(self.head, self.plan, self.state, self.sections, note)
        self.report.parent.mkdir(parents=True, exist_ok=True)
        self.report.write_text(text)
        (self.sec / "state.json").write_text(self.state.to_json())
        state_tar = self.ctx.work / STATE_TARBALL
        pack(self.sec, state_tar)
        out = os.environ.get("OUT")
        if out and os.path.isdir(out):
            shutil.copy(self.report, Path(out) / out_name(self.report.name))
            shutil.copy(state_tar, Path(out) / STATE_TARBALL)
            pack(self.ctx.logs, Path(out) / LOGS_TARBALL)
        return text


def pack(folder, tarball):
    with tarfile.open(tarball, "w:gz") as t:
        for p in sorted(Path(folder).iterdir()):
            t.add(p, arcname=p.name)


def main(args):
    env = os.environ
    plan = plan_from(env, args.rehearse, args.deadline, args.phases)
    ctx = context_from(env, args.rehearse)
    clock = common.Clock(plan.deadline)
    common.catch_sigterm()
    s = Session(args, plan, ctx, clock)
    try:
        s.set_up()
        s.write_report("starting")
        run_phases(plan, s.state, s.call, clock, s.run_phase, lambda p: s.write_report(f"after {p}"))
    except Terminated:
        if s.head:
            s.write_report(f"stopped by SIGTERM at {clock.elapsed()} s")
            say(f"report: {s.report}")
        raise Exit(CUT, f"stopped by SIGTERM after {clock.elapsed()} s")
    code = exit_code(s.state, s.call)
    cut = [r[0] for r in s.state.records if r[3] == s.call and r[1] == "cut"]
    text = s.write_report("finished" + (f"; cut or not reached: {' '.join(cut)}" if cut else ""))
    say(f"report: {s.report} (logs and state: {ctx.work}{'; copied to $OUT' if env.get('OUT') else ''})")
    print()
    print(summary(text, s.sections, plan))
    return code
