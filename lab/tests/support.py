"""A tree like the one the remote tool sends (the package, bench/ stubs) and a fake stage of small
shell scripts that print what the real programs print, so the runners' logic is checked without a
GPU or a portable build."""
import os
import shutil
import subprocess
import tarfile
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# PyTorch's side of the step and profile phases: the lines and JSON bench/pytorch_step.py writes.
PYTORCH_STEP = r'''import json, sys
a = sys.argv
j = a[a.index("--json") + 1]
if "--profile-out" in a:
    open(a[a.index("--profile-out") + 1], "w").write("| category | launches per step | µs per step | share |\n"
                                                     "| --- | ---: | ---: | ---: |\n| convolution | 3 | 90.0 | 90.0% |\n")
    json.dump({"categories_us_per_step": {"convolution": 90.0}}, open(j, "w"))
    sys.exit(0)
json.dump({"images_per_s": 200.0, "steps": 10, "seconds": 2.0, "peak_allocated_bytes": None}, open(j, "w"))
print("pytorch resnet18-small batch 4 32px: 200.0 images/s")
'''

GTEST_OK = ('for t in A B C; do echo "[ RUN      ] Suite.$t"; sleep ${STUB_SLEEP:-0}; '
            'echo "[       OK ] Suite.$t (1 ms)"; done')
STEP_OK = '''sleep ${STUB_STEP_SLEEP:-0}; j=""; while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && j=$2; echo "arg $1"; shift; done
echo "{\\"images_per_s\\": ${STUB_IPS:-100.0}, \\"steps\\": 5, \\"seconds\\": 2.0, \\"peak_allocated_bytes\\": 1048576}" >"$j"
echo "minidl resnet18-small batch 4: ${STUB_IPS:-100.0} images/s"'''


class FakeTree(unittest.TestCase):
    """A temporary tree with lab/gpulab and a stage folder; run() calls the package there with a
    clean environment and $OUT, as the remote tool does."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="gpulab_test."))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.tree, self.stage, self.out = self.tmp / "tree", self.tmp / "stage", self.tmp / "out"
        shutil.copytree(REPO / "lab/gpulab", self.tree / "lab/gpulab", ignore=shutil.ignore_patterns("__pycache__"))
        for d in (self.tree / "bench", self.stage / "bin", self.stage / "lib"):
            d.mkdir(parents=True)
        (self.tree / "bench/pytorch_step.py").write_text(PYTORCH_STEP)
        (self.stage / "COMMIT").write_text("abc1234\n")

    def stub(self, name, body):
        p = self.stage / "bin" / name
        p.write_text(f"#!/usr/bin/env bash\n{body}\n")
        p.chmod(0o755)

    def pack(self, folder="build-gpu-stage", name="stage.tar.xz"):
        d = self.tree / folder
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        with tarfile.open(d / name, "w:xz") as t:
            for n in ("COMMIT", "bin", "lib"):
                t.add(self.stage / n, arcname=n)

    def env(self, **extra):
        return {"PATH": os.environ["PATH"], "HOME": str(self.tmp), "OUT": str(self.out), **extra}

    def start(self, *args, **env):
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir()
        return subprocess.Popen(["python3", "-m", "lab.gpulab", *args], cwd=self.tree, env=self.env(**env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_cmd(self, *args, **env):
        p = self.start(*args, **env)
        self.log = p.communicate(timeout=120)[0]
        return p.returncode

    def report(self):
        found = sorted(self.out.glob("gpu_check_*.md"))
        self.assertTrue(found, f"no report in $OUT; output:\n{self.log}")
        return found[0].read_text()
