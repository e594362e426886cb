"""What every gpulab command needs on and for a GPU machine, written once: messages and exit
codes, is there a usable GPU, where cuDNN/cuBLAS/cudart are (a GPU machine often has them only
inside its PyTorch wheels), which Python imports torch, unpacking a stage, and running a program
under a wall-clock deadline."""
import glob
import os
import re
import shutil
import signal
import site
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository: every command runs from here
PROG = "gpulab"

# Exit statuses of every command.
OK, FAILED, NO_GPU, SETUP, CUT = 0, 1, 2, 3, 4


class Exit(Exception):
    """Ends a command with `code` and one line on stderr (__main__ prints it)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Terminated(Exception):
    """Raised in the main thread by SIGTERM (the remote tool's own time limit)."""


def say(msg):
    print(f"{PROG}: {msg}", flush=True)


def on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: the clean-up must not be interrupted
    raise Terminated()


def catch_sigterm():
    signal.signal(signal.SIGTERM, on_sigterm)


# ---------------------------------------------------------------- the GPU
def parse_smi(line):
    """'NVIDIA H200, 570.1, 143771 MiB' -> (name, driver, memory)."""
    parts = [p.strip() for p in line.split(",")]
    return (parts + ["", "", ""])[:3]


def detect_gpu(rehearse):
    """One line naming the GPU; on a rehearsal a placeholder. Without a usable GPU: Exit(2)."""
    if rehearse:
        return "CPU rehearsal: no GPU used"
    if not shutil.which("nvidia-smi"):
        raise Exit(NO_GPU, "no NVIDIA GPU here (nvidia-smi is not installed); run this on a GPU machine, "
                           "or with --rehearse to check the plumbing on the CPU")
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True)
    text = (q.stdout or q.stderr).strip()
    info = text.splitlines()[0] if text else ""
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    if q.returncode != 0 or not info or not listed:
        raise Exit(NO_GPU, f"no usable NVIDIA GPU: nvidia-smi failed ({info or 'no output'}); check the driver, "
                           "or use --rehearse on a CPU machine")
    name, driver, mem = parse_smi(info)
    return f"{name}, driver {driver}, {mem}"


# ---------------------------------------------------------------- libraries
def python_roots():
    """site-packages folders where PyTorch's wheels may keep nvidia/*/lib and torch/lib: this
    Python's, and the usual places of another environment (the python3 on PATH may not be PyTorch's)."""
    roots = list(site.getsitepackages()) + [site.getusersitepackages()]
    for pat in ["/opt/*/.venv/lib/python3*/site-packages", "/opt/conda/lib/python3*/site-packages",
                "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                "/usr/lib/python3/dist-packages"]:
        roots += sorted(glob.glob(pat))
    return [r for r in roots if os.path.isdir(r)]


def library_dirs(first, roots, system=None):
    """LD_LIBRARY_PATH's folders: `first` (the stage's own lib/), then each root's nvidia/*/lib,
    nvidia/*/*/lib (nvidia/cu13/lib) and torch/lib that hold a lib*.so*, then the system's CUDA
    folders. Each folder once."""
    dirs = [os.path.abspath(d) for d in first if os.path.isdir(d)]
    for r in roots:
        for pat in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
            for d in sorted(glob.glob(os.path.join(r, pat))):
                if glob.glob(os.path.join(d, "lib*.so*")) and d not in dirs:
                    dirs.append(d)
    if system is None:
        system = ["/usr/local/nvidia/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib",
                  *sorted(glob.glob("/usr/local/cuda-*/lib64")), "/usr/lib/x86_64-linux-gnu"]
    return dirs + [d for d in system if os.path.isdir(d)]


def set_library_path(stage_lib):
    dirs = library_dirs([stage_lib], python_roots())
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = ":".join(dirs + ([old] if old else []))


def parse_ldd(text):
    """ldd's output -> ({name: path}, [names not found])."""
    found, missing = {}, []
    for line in text.splitlines():
        m = re.match(r"\s*(\S+) => (.*?)(?: \(0x[0-9a-f]+\))?$", line)
        if not m:
            continue
        if m.group(2).strip() == "not found":
            missing.append(m.group(1))
        else:
            found[m.group(1)] = m.group(2).strip()
    return found, missing


def ldd(exe):
    r = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
    return parse_ldd(r.stdout)


def missing_libs(exes):
    return sorted({name for e in exes for name in ldd(e)[1]})


def cuda_libs_line(found):
    """'libcudnn.so.9 -> PATH, ...' for the cuDNN, cuBLAS and cudart an executable resolves."""
    return ", ".join(f"{n} -> {p}" for n, p in found.items() if re.match(r"lib(cudnn|cublas|cudart)\.so", n))


def check_libraries(exes):
    """Exit(3) naming what the staged programs cannot find."""
    missing = missing_libs(exes)
    if missing:
        raise Exit(SETUP, f"libraries not found with LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}: "
                          f"{' '.join(missing)} (cuDNN 9 / cuBLAS 13 / cudart 13 are expected from the machine's "
                          "PyTorch or CUDA toolkit; the others from the stage)")


# ---------------------------------------------------------------- the machine, PyTorch
def machine_lines(gpu_line):
    mem = "?"
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f"{kib / 1048576:.0f} GiB"
    except (OSError, AttributeError):
        pass
    u = os.uname()
    lines = [f"- GPU: {gpu_line}", f"- host: {u.machine}, {os.cpu_count()} cores, {mem} memory, kernel {u.release}"]
    nvcc = shutil.which("nvcc") or next(iter(glob.glob("/usr/local/cuda/bin/nvcc")), None)
    if nvcc:
        v = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release [0-9.]+", v)
        lines.append(f"- CUDA toolkit: {m.group(0) if m else '?'}")
    return lines


TORCH_PROBE = ("import torch; print(torch.__version__, 'CUDA', torch.version.cuda, "
               "'cuDNN', torch.backends.cudnn.version())")


def torch_python():
    """(the first of python3, /opt/*/.venv/bin/python3 that imports torch, its versions line);
    ('python3', 'not importable') when none does."""
    for p in ["python3"] + sorted(glob.glob("/opt/*/.venv/bin/python3")):
        if not shutil.which(p):
            continue
        try:
            r = subprocess.run([p, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            continue
        if r.returncode == 0:
            return p, f"{r.stdout.strip()} ({p})"
    return "python3", "not importable"


# ---------------------------------------------------------------- stages and programs
def unpack(tarball, dest, only=None):
    """Unpacks a tarball (a .tar.xz stage with Python's lzma: a minimal image may have no
    xz-utils); `only`: the members under that top folder."""
    try:
        with tarfile.open(tarball, "r:*") as t:
            members = [m for m in t.getmembers() if only is None or m.name.split("/")[0] == only]
            if hasattr(tarfile, "data_filter"):
                t.extractall(dest, members=members, filter="tar")
            else:
                t.extractall(dest, members=members)
    except (OSError, tarfile.TarError) as e:
        raise Exit(SETUP, f"cannot unpack {tarball}: {e}")


def first_line(path, default="unknown"):
    try:
        return Path(path).read_text().splitlines()[0].strip() or default
    except (OSError, IndexError):
        return default


def stage_commit_line(work):
    """The unpacked stage's commit for a report: COMMIT's first line, and the files of a '+dirty'
    stage (its DIRTY list) after it."""
    commit = first_line(Path(work) / "COMMIT")
    try:
        dirty = Path(work, "DIRTY").read_text().split()
    except OSError:
        dirty = []
    return commit + (f" (uncommitted changes built in: {' '.join(dirty)})" if dirty else "")


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc, sig, grace):
    """Sends `sig` to the program's process group, SIGKILL after `grace` seconds; its exit code."""
    _signal_group(proc, sig)
    try:
        proc.wait(grace)
        return False
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        return True


def run_until(cmd, log, secs, sig=signal.SIGTERM, grace=5, env=None, stop_grace=20):
    """Runs `cmd` with stdout and stderr to `log`, line-buffered (stdbuf) so a program stopped at
    the deadline leaves its lines. At `secs` it gets `sig` (SIGINT for the experiment programs,
    which stop at a step boundary and write what they have; SIGTERM for the rest), `grace` seconds
    later SIGKILL. Returns its exit status, 124 when stopped by `sig`, 137 when killed; secs <= 0:
    not run, 124. A SIGTERM of our own (Terminated) stops it the same way (at most `stop_grace`
    seconds) and is raised again."""
    log = Path(log)
    if secs <= 0:
        log.write_text("not run: no time left before the deadline\n")
        return 124
    cmd = [str(c) for c in cmd]
    if shutil.which("stdbuf"):
        cmd = ["stdbuf", "-oL", "-eL"] + cmd
    full_env = None if env is None else {**os.environ, **env}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
        try:
            return proc.wait(secs)
        except subprocess.TimeoutExpired:
            return 137 if stop(proc, sig, grace) else 124
        except BaseException:
            stop(proc, sig, min(grace, stop_grace))
            raise


def tail(path, n=1, width=None):
    """The last n lines of a log as one line ('' when there is none)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    s = " ".join(lines)
    return s[:width] if width else s


class Clock:
    """Seconds since the command started, and what is left of its deadline."""

    def __init__(self, deadline, now=time.monotonic):
        self.deadline, self.now, self.t0 = deadline, now, now()

    def elapsed(self):
        return int(self.now() - self.t0)

    def left(self):
        return self.deadline - self.elapsed()


def env_int(env, name, default):
    v = env.get(name, "")
    if v == "":
        return default
    if not re.fullmatch(r"-?\d+", v.strip()):
        raise Exit(SETUP, f"{name}={v!r}: expected whole seconds")
    return int(v)


def mib(n):
    return f"{n / 1048576:.1f}"
