"""`gpulab stage`: the build-machine half of a GPU session. A GPU machine has no Eigen,
GoogleTest, Google Benchmark or libjpeg-turbo, and a call carries little, so everything it runs is
built here, portable (-DMINIDL_NATIVE=OFF), and packed to travel:

  build-gpu-stage/stage.tar.xz     (tests) the `cuda` test executables and minidl_bench_cuda
                                   unstripped (memcheck names functions), minidl_bench_step,
                                   minidl-maxbatch, minidl-gpumodel-cuda stripped, their non-CUDA
                                   libraries, COMMIT, MODEL_TSV, MODEL_TSV_H200  -> gpulab check
  build-gpu-studies/studies.tar.xz (studies) minidl-sweep, -train, -maxbatch, -memest stripped,
                                   their libraries, COMMIT                      -> gpulab studies
  .data/catsdogs/                  (photos) copied from ../shared/data/catsdogs; git-ignored
"""
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from . import common
from .common import SETUP, Exit, mib, say

PARTS = ("tests", "studies", "photos")
TEST_EXES = ["kernels_cuda", "optim_cuda", "nn_cuda", "e2e_cuda", "minidl_bench_cuda"]
TOOL_EXES = ["minidl_bench_step", "minidl-maxbatch", "minidl-gpumodel-cuda"]
STUDY_EXES = ["minidl-sweep", "minidl-train", "minidl-maxbatch", "minidl-memest"]
# Copied into the stage's lib/; CUDA, cuBLAS and cuDNN come from the GPU machine.
STAGED_LIBS = ("libgomp", "libbenchmark", "libgtest", "libgmock", "libturbojpeg", "libjpeg")
PHOTOS_DST = Path(".data/catsdogs")


def parse_parts(only):
    parts = [p for p in only.split(",") if p]
    for p in parts:
        if p not in PARTS:
            raise Exit(SETUP, f"--only: '{p}' is not tests, studies or photos")
    return parts


def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True)


def dirty_paths(porcelain):
    """The tracked paths with uncommitted changes, from `git status --porcelain --untracked-files=no`
    ('XY path' or 'XY old -> new' lines)."""
    return [ln[3:].split(" -> ")[-1] for ln in porcelain.splitlines() if len(ln) > 3]


def staged_commit():
    """The short commit id, '+dirty' when uncommitted changes were built in."""
    c = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    return c + ("+dirty" if git("diff", "--quiet", "HEAD").returncode != 0 else "")


def pick_table(entries, gpu):
    """The model table the GPU calibrates, from (time added, path) of lab/results/bench/gpu_model_*.tsv:
    the last added for `gpu` (h100, or h200 with _h200 in the name); tables of the graph mode
    (_graph) and the one-layout channels-last ones (_nhwc) are not candidates. '' when none."""
    fits = [(t, p) for t, p in entries
            if "_graph" not in p and "_nhwc" not in p and (("_h200" in p) == (gpu == "h200"))]
    return max(fits)[1] if fits else ""


def table_entries():
    """(when the commit that added it was made, path) per table; by the commit that added it, with
    --follow past moves, so a later commit that edits every table does not make them all 'last'; an
    uncommitted table counts as the newest."""
    out = []
    for p in sorted(Path("lab/results/bench").glob("gpu_model_*.tsv")):
        t = git("log", "--follow", "--diff-filter=A", "-1", "--format=%ct", "--", str(p)).stdout.strip()
        out.append((int(t) if t else int(time.time()), str(p)))
    return out


def build(build_dir, targets, jobs):
    Path(build_dir).mkdir(parents=True, exist_ok=True)
    say(f"configuring a portable CUDA build in {build_dir}")   # every time: the commit id is compiled in
    steps = [("configure", ["cmake", "-S", ".", "-B", build_dir, "-DMINIDL_CUDA=ON", "-DMINIDL_NATIVE=OFF",
                            "-DCMAKE_BUILD_TYPE=Release"]),
             ("build", ["cmake", "--build", build_dir, f"-j{jobs}", "--target", *targets])]
    for name, cmd in steps:
        if name == "build":
            say(f"building {' '.join(targets)} (slow on few cores: about 8 minutes from scratch on 2)")
        log = Path(build_dir) / f"gpu_stage.{name}.log"
        with open(log, "w") as f:
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                raise Exit(SETUP, f"{name} failed; see {log}")


def copy_programs(build_dir, names, dest, strip):
    for n in names:
        src = Path(build_dir) / "bin" / n
        if not src.is_file():
            raise Exit(SETUP, f"{src} is missing; see {build_dir}/gpu_stage.build.log")
        if strip:
            if subprocess.run(["strip", "-o", dest / n, src]).returncode != 0:
                raise Exit(SETUP, f"strip {n} failed")
        else:
            shutil.copy2(src, dest / n)


def stage_libs(lib, exes):
    for e in exes:
        for name, path in common.ldd(e)[0].items():
            if name.startswith(STAGED_LIBS) and os.path.isfile(path):
                shutil.copy(path, lib / name)


def pack(src, names, tarball):
    say(f"compressing {tarball} (xz -9)")
    with tarfile.open(tarball, "w:xz", preset=9) as t:
        for n in names:
            t.add(src / n, arcname=n)


def make_stage(build_dir, unstripped, stripped, dest_dir, tarball_name, commit, extra=None):
    """A stage folder holding one tarball: bin/, lib/, COMMIT and the `extra` files {name: text}."""
    tmp = Path(tempfile.mkdtemp(prefix="gpu_stage."))
    (tmp / "bin").mkdir()
    (tmp / "lib").mkdir()
    copy_programs(build_dir, unstripped, tmp / "bin", strip=False)
    copy_programs(build_dir, stripped, tmp / "bin", strip=True)
    stage_libs(tmp / "lib", sorted((tmp / "bin").iterdir()))
    files = {"COMMIT": commit + "\n", **(extra or {})}
    for name, text in files.items():
        (tmp / name).write_text(text)
    shutil.rmtree(dest_dir, ignore_errors=True)
    Path(dest_dir).mkdir(parents=True)
    tarball = Path(dest_dir) / tarball_name
    pack(tmp, [*files, "bin", "lib"], tarball)
    (Path(dest_dir) / "COMMIT").write_text(commit + "\n")
    say(f"stage: {tarball} ({mib(tarball.stat().st_size)} MiB; unpacked {mib(size_of(tmp))} MiB)")
    dump = subprocess.run(["objdump", "-T", *sorted((tmp / "bin").iterdir())], capture_output=True, text=True)
    say(f"needs {' and '.join(newest_versions(dump.stdout)) or '?'}")
    shutil.rmtree(tmp)


def newest_versions(text):
    """The newest GLIBC_ and GLIBCXX_ symbol versions objdump -T lists: the GPU machine's must be
    at least these."""
    newest = {}
    for kind, v in re.findall(r"\b(GLIBC|GLIBCXX)_([0-9.]+)", text):
        key = tuple(int(x) for x in v.strip(".").split("."))
        newest[kind] = max(newest.get(kind, ((), "")), (key, f"{kind}_{v}"))
    return [newest[k][1] for k in ("GLIBC", "GLIBCXX") if k in newest]


def copy_photos(src):
    src = Path(src)
    if not ((src / "cat").is_dir() and (src / "dog").is_dir()):
        raise Exit(SETUP, f"no photos at {src} (expected cat/ and dog/ folders of JPEGs); give the folder with --photos DIR")
    if size_of(src / "cat") + size_of(src / "dog") != size_of(PHOTOS_DST / "cat") + size_of(PHOTOS_DST / "dog"):
        shutil.rmtree(PHOTOS_DST, ignore_errors=True)
        for c in ("cat", "dog"):
            (PHOTOS_DST / c).mkdir(parents=True)
            for f in (src / c).iterdir():
                if f.is_file():
                    shutil.copy(f, PHOTOS_DST / c)
    if git("check-ignore", "-q", str(PHOTOS_DST)).returncode != 0:
        raise Exit(SETUP, f"{PHOTOS_DST} is not git-ignored: the photos must never be committed (.gitignore: /.data/)")
    counts = [len(list((PHOTOS_DST / c).iterdir())) for c in ("cat", "dog")]
    say(f"photos: {PHOTOS_DST} ({counts[0]} cat, {counts[1]} dog, {mib(size_of(PHOTOS_DST))} MiB)")


def size_of(path):
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def carry_sizes(tests_dir, studies_dir):
    """What each call carries: the tracked and untracked-not-ignored files, plus its carried paths."""
    files = git("ls-files", "-z", "-co", "--exclude-standard").stdout.split("\0")
    tree = sum(os.path.getsize(f) for f in files if f and os.path.isfile(f))
    prev = size_of(".gpu-results")
    call1 = tree + size_of(tests_dir)
    call2 = tree + size_of(studies_dir) + size_of(PHOTOS_DST) + prev
    say(f"carry sizes (limit 64 MiB a call): working tree {mib(tree)} MiB")
    say(f"  gpu check call:   [\"{tests_dir}\"]  {mib(call1)} MiB")
    say(f"  studies calls:    [\".data\", \"{studies_dir}\", \".gpu-results\"]  {mib(call2)} MiB "
        f"(.gpu-results now {mib(prev)} MiB)")
    if max(call1, call2) > 60 * 1048576:
        say("WARNING: a call is within 4 MiB of the 64 MiB limit or over it")


def main(args):
    parts = parse_parts(args.only)
    build_dir = os.environ.get("GPU_STAGE_BUILD") or "build-gpu"
    jobs = os.environ.get("GPU_CHECK_JOBS") or "2"
    tools = TOOL_EXES + os.environ.get("GPU_STAGE_EXTRA_TARGETS", "").split()
    targets = (TEST_EXES + tools if "tests" in parts else []) + (STUDY_EXES if "studies" in parts else [])
    commit = staged_commit()
    # In a checkout shared with others their uncommitted work is built in: say which files, and
    # pack the list (DIRTY) so the GPU reports name it beside '<commit>+dirty'.
    dirty = dirty_paths(git("status", "--porcelain", "--untracked-files=no").stdout) if commit.endswith("+dirty") else []
    notes = {"DIRTY": "\n".join(dirty) + "\n"} if dirty else {}
    if dirty:
        say(f"WARNING: uncommitted changes in {len(dirty)} tracked files are built in ({' '.join(dirty)}); "
            f"the stage and its reports say {commit}")
    if targets:
        build(build_dir, list(dict.fromkeys(targets)), jobs)
    if "tests" in parts:
        entries = table_entries()
        extra = {"MODEL_TSV": pick_table(entries, "h100") + "\n", "MODEL_TSV_H200": pick_table(entries, "h200") + "\n",
                 **notes}
        make_stage(build_dir, TEST_EXES, tools, args.dir, "stage.tar.xz", commit, extra)
        say(f"on the GPU machine: python3 -m lab.gpulab check {args.dir}")
    if "studies" in parts:
        make_stage(build_dir, [], STUDY_EXES, args.studies_dir, "studies.tar.xz", commit, notes)
    if "photos" in parts:
        copy_photos(args.photos or common.ROOT.parent / "shared/data/catsdogs")
    carry_sizes(args.dir, args.studies_dir)
    say(f"staged commit {commit}")
    return common.OK
