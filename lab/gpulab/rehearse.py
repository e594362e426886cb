"""`gpulab rehearse`: a call to the remote GPU tool rehearsed here, so a command meant for the GPU
machine is checked before it costs device time. The call's view of the repository (tracked and
untracked-not-ignored files plus the carried paths, nothing else, no .git) is copied to a fresh
folder, the command runs there with a clean environment (PATH, HOME, LANG and OUT only), and what
it left in $OUT is checked against what the tool returns."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from . import common
from .common import SETUP, Exit, mib, say

MAX_CARRY = 64 * 1048576    # the working tree plus the carried paths
MAX_COMMAND = 2000          # characters
MAX_CARRIED_PATHS = 8
MAX_FILES, MAX_FILE = 8, 16 * 1048576   # what comes back from $OUT
NAME = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$")


def check_call(command, carry):
    if len(command) > MAX_COMMAND:
        raise Exit(SETUP, f"the command is {len(command)} characters; the tool takes at most {MAX_COMMAND}")
    if len(carry) > MAX_CARRIED_PATHS:
        raise Exit(SETUP, f"{len(carry)} carried paths; the tool takes at most {MAX_CARRIED_PATHS}")


def out_problems(files):
    """[(relative path, size, why not returned or '')] and whether $OUT breaks a rule, from
    [(relative path, size)]."""
    rows = []
    for rel, size in files:
        why = "name or depth not returned" if not NAME.match(rel) else ("over 16 MiB" if size > MAX_FILE else "")
        rows.append((rel, size, why))
    bad = any(w for _, _, w in rows) or len(files) > MAX_FILES
    return rows, bad


def copy_tree(dest, carry):
    """The files the tool sends, then the carried paths, into dest; their size in bytes."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True, text=True)
    for f in filter(None, listed.stdout.split("\0")):
        if os.path.isfile(f):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / f)
    for c in carry:
        if not os.path.exists(c):
            say(f"carried path {c} does not exist here (the tool removes it there)")
            continue
        if subprocess.run(["git", "check-ignore", "-q", c]).returncode != 0:
            say(f"WARNING: {c} is not git-ignored: it travels anyway, carried or not")
        (dest / c).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if os.path.isdir(c) else shutil.copy2)(c, dest / c)
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def main(args):
    command = " ".join(args.command)
    if not command:
        raise Exit(SETUP, "no command after -- (see --help)")
    check_call(command, args.carry)
    base = Path(args.dir or tempfile.mkdtemp(prefix="gpu_rehearse."))
    tree, out, home = base / "tree", base / "out", base / "home"
    for d in (tree, out):
        shutil.rmtree(d, ignore_errors=True)
    for d in (tree, out, home):
        d.mkdir(parents=True, exist_ok=True)
    size = copy_tree(tree, args.carry)
    say(f"copy in {tree}: {mib(size)} MiB of the 64 MiB a call may carry (carry: {' '.join(args.carry) or 'none'})")
    if size > MAX_CARRY:
        raise Exit(SETUP, "over the 64 MiB limit: the tool would refuse this call")
    say(f"running (limit {args.limit} s): {command}")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8", "OUT": str(out)}
    proc = subprocess.Popen(["bash", "-c", command], cwd=tree, env=env, start_new_session=True)
    try:
        rc = proc.wait(args.limit)
    except subprocess.TimeoutExpired:   # killed at the limit, as the tool does
        common.stop(proc, signal.SIGTERM, 5)
        rc = 124
    say(f"exit status {rc}")
    files = sorted((str(p.relative_to(out)), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    rows, bad = out_problems(files)
    for rel, n, why in rows:
        print(f"  $OUT/{rel}  {n} bytes" + (f"  <- {why}" if why else ""))
    if len(files) > MAX_FILES:
        say(f"{len(files)} files in $OUT: the tool returns at most {MAX_FILES}")
    if bad:
        raise Exit(SETUP, "$OUT breaks a rule of the tool (above)")
    return rc
