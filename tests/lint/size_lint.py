#!/usr/bin/env python3
"""Every tracked file stays small: the repository travels whole to every remote GPU call, beside
the folders a call carries, under a fixed size limit, and a results file that balloons (a report
whose raw output was pasted thousands of times once made the tree 22 MiB larger) can push a call
over it. Large results are committed compressed (lab/README.md, "Committing results").

  python3 tests/lint/size_lint.py [--root DIR] [--max-kib N] [--self-test]

Exit status 0: every tracked file is at most --max-kib (default 2048); 1: the larger ones, one
`path: size` each, largest first; 0 with a message outside a git checkout (nothing to list).
"""
import argparse
import os
import subprocess
import sys


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [p for p in out.decode("utf-8", "replace").split("\0") if p]


def too_large(root, paths, max_bytes):
    sizes = []
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full) and not os.path.islink(full):
            n = os.path.getsize(full)
            if n > max_bytes:
                sizes.append((n, p))
    return sorted(sizes, reverse=True)


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "small.txt"), "w") as f:
            f.write("x" * 10)
        with open(os.path.join(d, "big.md"), "w") as f:
            f.write("y" * 5000)
        found = too_large(d, ["small.txt", "big.md", "missing.txt"], 4096)
        assert found == [(5000, "big.md")], found
        assert too_large(d, ["small.txt"], 4096) == []
    print("size_lint self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".")
    ap.add_argument("--max-kib", type=int, default=2048)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    paths = tracked_files(a.root)
    if paths is None:
        print(f"size_lint: {a.root} is not a git checkout (or git is missing): nothing to check")
        return 0
    found = too_large(a.root, paths, a.max_kib * 1024)
    for n, p in found:
        print(f"{p}: {n / 1048576:.1f} MiB (over {a.max_kib} KiB: compress it, or keep only what a reader needs)")
    if not found:
        print(f"size_lint: {len(paths)} tracked files, none over {a.max_kib} KiB")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
