"""python3 -m lab.gpulab COMMAND ...: the remote-GPU runs of lab/README.md, from the repository root."""
import argparse
import os
import sys

from . import common

CHECK_ENV = """environment (flags win over these):
  GPU_CHECK_DEADLINE        seconds for everything, the report included (default 450; --rehearse 240)
  GPU_CHECK_PHASES          the phases in priority order (default tests,step,sanitizer,model,profile,bench,maxbatch)
  GPU_CHECK_CAP_<PHASE>     a phase's own cap in seconds (TESTS 60, STEP 190, SANITIZER 75, MODEL 45,
                            PROFILE 45, BENCH 40, MAXBATCH 170); a phase gets min(cap, time left - 10 s)
  GPU_CHECK_PHASE_MIN       a phase with fewer seconds left is not started (default 15)
  GPU_CHECK_STEP_SECONDS    timed seconds per step run (default 15; --rehearse 2)
  GPU_CHECK_STEP_RUNS       the step runs in order (default "minidl:amp:nhwc:graphs pytorch:amp:graphs
                            pytorch:amp minidl:amp:nhwc minidl:amp:nhwc:chain:graphs
                            minidl:amp:nhwc:chain minidl:amp minidl:tf32 pytorch:tf32"); each
                            FRAMEWORK:PRECISION[:OPTION...], options in this order: nhwc (minidl), chain
                            (minidl --conv-bn-chain), graphs (both), hostscaler (minidl), smallcnn,
                            adam, accN (accumulation), bN (batch N, default 128); "graphs": the preset
                            of CUDA graphs in every mode (16 runs: GPU_CHECK_PHASES=step in a call of
                            its own, GPU_CHECK_CAP_STEP=420, GPU_CHECK_STEP_SECONDS=8)
  GPU_CHECK_STEP_MIN        seconds a step run needs at least to be started (default 20)
  GPU_CHECK_MODEL_CONFIGS   the model phase's configurations (default resnet50-amp-nhwc,resnet50-amp)
  GPU_CHECK_MODEL_BATCHES   the model phase's batches, one run each (default 256)
  GPU_CHECK_SANITIZER_FILTER  memcheck's --gtest_filter (default: all but the two cuDNN autotune cases)
  GPU_CHECK_BENCH_FILTER    minidl_bench_cuda's --benchmark_filter (copy, elementwise, reductions)
  OUT                       the report, gpu_check_state.tar.gz and gpu_check_logs.tar.gz are copied here
exit status: 0 every phase ran and passed, 1 a failure, 2 no usable GPU, 3 setup (stage, libraries,
arguments), 4 nothing failed but a phase was cut or not reached (run the --resume call)"""

STAGE_ENV = """environment:
  GPU_STAGE_BUILD           the build folder (default build-gpu)
  GPU_CHECK_JOBS            build jobs (default 2)
  GPU_STAGE_EXTRA_TARGETS   more targets for the check stage's bin/ (stripped)
It ends with the size each call carries. Exit status: 0 staged, 3 a configure, build or copy failed."""

STUDIES_ENV = """PLAN: comma-separated steps, in this order, each optionally capped as STEP:SECONDS:
  keras-batch, utilization, techniques, lr-scaling, batch-schedule, conv-bn-chain
                 minidl-sweep --study STEP --device cuda --workers N --process-per-run --out results
                 (--data the photos, except utilization: synthetic images)
  utilization-amp  minidl-sweep --study utilization --amp (results/utilization-amp)
  pytorch        bench/pytorch_utilization.py in f32 and with --best, each compared with minidl's
                 table by bench/compare_utilization.py; follows the last utilization step by itself
                 (capped at 150 s) unless listed
  e.g. python3 -m lab.gpulab studies utilization:170,keras-batch:200,techniques
environment (default; --rehearse value after the slash):
  GPU_STUDIES_DEADLINE [540/20]  seconds until the tarball is packed; each step gets at most what is
                                 left minus the grace and the packing reserve
  GPU_STUDIES_GRACE    [60/8]    seconds between a sweep's SIGINT and SIGKILL
  GPU_STUDIES_DATA     [.data/catsdogs]     the photos ('stage' copies them)
  GPU_STUDIES_STAGE    [build-gpu-studies]  holds studies.tar.xz ('stage')
  GPU_STUDIES_PREVIOUS [.gpu-results]       earlier calls: every gpu_studies_2*.tar.gz there is unpacked
                                 in name order, then a results/ folder there copied over; the sweeps skip
                                 the runs those results hold
  GPU_STUDIES_WORKERS  [cores-2, at least 2]  loader threads
  GPU_STUDIES_EXTRA    []        more minidl-sweep flags (the same in every call of a study)
  OUT                            where the tarball and gpu_studies_summary.md go (else GPU_STUDIES_PREVIOUS)
exit status: 0 every step finished, 1 a step failed, 2 no usable GPU, 3 setup (stage, libraries, photos,
plan), 4 nothing failed but a step was cut or not started: run the same PLAN again with this call's
tarball in .gpu-results to resume"""


class Parser(argparse.ArgumentParser):
    """Argument errors exit 3 (setup), as every other mistake in the call does; 2 means no GPU."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(common.SETUP, f"{self.prog}: error: {message}\n")


def seconds(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not whole seconds")
    return int(text)


def rounds(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"ROUNDS must be a positive number, got '{text}'")
    return int(text)


def add_check(sub):
    p = sub.add_parser("check", help="on the GPU machine: the one-call GPU check", epilog=CHECK_ENV,
                       description="Runs the phases of the GPU check in priority order under one deadline; "
                                   "writes lab/results/bench/gpu_check_<date>_<commit>.md after every phase.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default="build-gpu-stage", help="the stage folder (default build-gpu-stage)")
    p.add_argument("--rehearse", action="store_true", help="no GPU: the same plumbing on the CPU")
    p.add_argument("--resume", metavar="STATE", help="gpu_check_state.tar.gz of an earlier call: its finished "
                                                     "phases are kept, the others run")
    p.add_argument("--deadline", type=seconds, help="seconds for everything (else GPU_CHECK_DEADLINE)")
    p.add_argument("--phases", help="comma-separated phases in priority order (else GPU_CHECK_PHASES)")


def add_stage(sub):
    p = sub.add_parser("stage", help="here: build and pack what the GPU calls run", epilog=STAGE_ENV,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", default="build-gpu-stage", help="the check stage (default build-gpu-stage)")
    p.add_argument("--studies-dir", default="build-gpu-studies", help="the studies stage (default build-gpu-studies)")
    p.add_argument("--only", default="tests,studies,photos", help="comma-separated subset of tests,studies,photos")
    p.add_argument("--photos", help="the photo folder to copy (default ../shared/data/catsdogs beside the repository)")


def add_studies(sub):
    p = sub.add_parser("studies", help="on the GPU machine: the experiment studies, resumable across calls",
                       epilog=STUDIES_ENV, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", help="the steps, e.g. utilization:170,keras-batch:200,techniques")
    p.add_argument("--rehearse", action="store_true",
                   help="no GPU: --device cpu --quick on the staged photos, a 20 s deadline, PyTorch on the CPU")
    p = sub.add_parser("collect", help="here: a returned studies tarball into lab/results/experiments/")
    p.add_argument("tarball", help="the newest gpu_studies_<stamp>.tar.gz (it holds every call's results)")
    p.add_argument("dest", nargs="?", default="lab/results/experiments", help="(default lab/results/experiments)")
    p = sub.add_parser("plot", help="here, with gnuplot: draws each DIR/*.png.dat and links it from DIR/summary.md")
    p.add_argument("dirs", nargs="+", metavar="DIR")


def add_repeat(sub):
    p = sub.add_parser("repeat", help="on the GPU machine: one minidl_bench_step configuration in fresh "
                                      "processes under each environment, interleaved",
                       epilog="Writes $OUT/gpu_repeat.md (default OUT=.gpu-results) after every process. "
                              "Exit status: 0 every process ran, 1 one failed, 3 setup. e.g. repeat "
                              "build-gpu-stage 3 MINIDL_CUDNN_FIND_TRIALS=1 MINIDL_CUDNN_FIND_TRIALS=2 -- --device "
                              "cuda --model resnet50 --batch 128 --precision amp --seconds 5")
    p.add_argument("dir", help="the check stage (from 'stage')")
    p.add_argument("rounds", type=rounds, help="processes per environment")
    p.add_argument("envs", nargs="+", metavar="ENV", help="'NAME=VALUE ...' for one environment, - for none")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: minidl_bench_step's arguments")


def add_rehearse(sub):
    p = sub.add_parser("rehearse", help="here: a remote-GPU call rehearsed in a copy of what it would see",
                       epilog="Exit status: the command's, or 3 when the copy is too large or $OUT breaks a rule.")
    p.add_argument("--carry", action="append", default=[], metavar="PATH",
                   help="a git-ignored path the call carries (repeat, as the tool's carry list)")
    p.add_argument("--dir", help="where the copy goes (default a new /tmp/gpu_rehearse.*): DIR/tree, DIR/out")
    p.add_argument("--limit", type=seconds, default=600, help="the call's timeout in seconds (default 600)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command, run by bash -c in the copy")


def parser():
    p = Parser(prog="python3 -m lab.gpulab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=Parser)
    for add in (add_check, add_stage, add_studies, add_repeat, add_rehearse):
        add(sub)
    return p


def split_dashes(argv):
    """repeat's ENV... and rehearse's command are separated from what follows by --."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def parse(argv):
    head, tail = split_dashes(argv)
    args = parser().parse_args(head)
    if args.cmd == "repeat":
        if tail is None:
            parser().error("repeat: give at least one ENV, then -- and minidl_bench_step's arguments")
        args.bench_args = tail
    if args.cmd == "rehearse":
        args.command = tail or []
    args.argv = argv[1:]
    return args


def run(argv):
    args = parse(argv)
    common.PROG = f"gpulab {args.cmd}"
    os.chdir(common.ROOT)   # paths in arguments and settings are relative to the repository
    from . import check, rehearse, repeat, stage, studies
    commands = {"check": check.main, "stage": stage.main, "studies": studies.main, "collect": studies.collect,
                "plot": lambda a: studies.plot_dirs(a.dirs), "repeat": repeat.main, "rehearse": rehearse.main}
    try:
        return commands[args.cmd](args)
    except common.Exit as e:
        print(f"{common.PROG}: {e}", file=sys.stderr, flush=True)
        return e.code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
