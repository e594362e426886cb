"""`gpulab check --rehearse` end to end on a fake stage: phases in priority order, cutting at the
deadline (exit 4), the report and state in $OUT after every phase, a failing test executable
(exit 1), --resume running only what was cut, a state of another commit refused (exit 3), and a
SIGTERM that still leaves a report."""
import re
import signal
import shutil
import subprocess
import tarfile
import time
import unittest

from support import GTEST_OK, REPO, STEP_OK, FakeTree


class CheckRehearsal(FakeTree):

    def setUp(self):
        super().setUp()
        for name in ("kernels_cuda", "optim_cuda", "e2e_cuda"):
            self.stub(name, GTEST_OK)
        self.stub("nn_cuda", 'echo "[ RUN      ] Nn.Move"; echo "[  SKIPPED ] Nn.Move (0 ms)"')
        self.stub("minidl_bench_cuda", "exit 1")
        self.stub("minidl_bench_step", STEP_OK)
        self.stub("minidl-maxbatch", 'echo "maximum batch: 42 after 5 trials"')
        self.pack()

    def check(self, *args, **env):
        return self.run_cmd("check", "--rehearse", *args, **env)

    def test_everything_fits(self):
        self.assertEqual(self.check("build-gpu-stage", GPU_CHECK_DEADLINE="120"), 0, self.log)
        self.assertTrue((self.out / "gpu_check_state.tar.gz").is_file())
        self.assertTrue((self.out / "gpu_check_logs.tar.gz").is_file())
        order = re.findall(r"^gpulab check: (\w+): at most", self.log, re.M)
        self.assertEqual(order, ["tests", "step", "sanitizer", "model", "profile", "bench", "maxbatch"])
        r = self.report()
        for want in ["| tests | passed |", "9 passed, 0 failed, 1 skipped", "minidl:amp / pytorch:amp: 0.50x",
                     "| minidl | 42 |", "| bench | skipped |", "| profile | passed |",
                     "| convolution | 3 | 90.0 | 90.0% |", "CPU rehearsal (--rehearse)"]:
            self.assertIn(want, r)
        self.assertIn("# GPU check, ", self.log.split("report: ")[-1], "the summary is printed last")

    def test_step_options(self):
        runs = ("minidl:amp:nhwc:hostscaler:b256 pytorch:amp:b256 minidl:amp:bogus minidl:amp:graphs pytorch:amp "
                "pytorch:amp:graphs pytorch:amp:nhwc")
        rc = self.check("--phases", "step", GPU_CHECK_DEADLINE="120", GPU_CHECK_STEP_RUNS=runs, STUB_IPS="150.0")
        self.assertEqual(rc, 1, "a step run with an unknown option fails the phase")
        r = self.report()
        self.assertIn("minidl:amp:nhwc:hostscaler:b256 / pytorch:amp:b256: 0.75x", r)
        self.assertIn("minidl:amp:bogus | failed (exit 3): unknown option 'bogus'", r)
        self.assertIn("minidl:amp:graphs / pytorch:amp: 0.75x", r)
        self.assertIn("minidl:amp:graphs / pytorch:amp:graphs: 0.75x", r)
        self.assertNotIn("minidl:amp:nhwc:hostscaler:b256 / pytorch:amp:graphs", r)
        self.assertIn("pytorch:amp:nhwc | failed (exit 3): step run 'pytorch:amp:nhwc': PyTorch takes graphs, smallcnn, adam, accN and bN only", r)
        with tarfile.open(self.out / "gpu_check_logs.tar.gz") as t:
            log = t.extractfile("step_minidl_amp_nhwc_hostscaler_b256.log").read().decode()
        self.assertIn("arg --channels-last", log)
        self.assertIn("arg --host-scaler", log)
        self.assertNotIn("arg --cuda-graphs", log)

    def cut_call(self):
        """A deadline too short: the never-ending step run is stopped at its budget, the phases
        below are cut; exit 4. Returns the state tarball, kept in the tree."""
        rc = self.check(GPU_CHECK_DEADLINE="16", GPU_CHECK_PHASE_MIN="2", GPU_CHECK_STEP_MIN="1", STUB_STEP_SLEEP="60")
        self.assertEqual(rc, 4, self.log)
        shutil.copy(self.out / "gpu_check_state.tar.gz", self.tree / "state1.tar.gz")
        return self.report()

    def test_cut_then_resume(self):
        t0 = time.monotonic()
        r = self.cut_call()
        self.assertLess(time.monotonic() - t0, 14, "the step run was not stopped at its budget")
        self.assertRegex(r, r"\| tests \| passed \| \d+ \| 1 \|")
        self.assertIn("| step | cut |", r)
        self.assertIn("| maxbatch | cut | 0 | 1 |", r)
        self.assertIn("cut by the budget", r)
        rc = self.check("--resume", "state1.tar.gz", "build-gpu-stage", GPU_CHECK_DEADLINE="120")
        self.assertEqual(rc, 0, self.log)
        self.assertIn("gpulab check: tests: done in an earlier call", self.log)
        self.assertIn("gpulab check: step: at most", self.log)
        r = self.report()
        self.assertRegex(r, r"\| tests \| passed \| \d+ \| 1 \|", "the tests row keeps call 1")
        self.assertRegex(r, r"\| step \| passed \| \d+ \| 2 \|", "the step row says call 2")
        self.assertIn("9 passed, 0 failed, 1 skipped", r, "call 1's test section is kept")

    def test_resume_refuses_another_commit(self):
        (self.tmp / "sections").mkdir()
        (self.tmp / "sections/state.json").write_text('{"commit": "abc1234", "records": [["tests", "cut", 0, 1]]}')
        with tarfile.open(self.tree / "state1.tar.gz", "w:gz") as t:
            t.add(self.tmp / "sections/state.json", arcname="state.json")
        (self.stage / "COMMIT").write_text("def5678\n")
        self.pack()
        self.assertEqual(self.check("--resume", "state1.tar.gz", GPU_CHECK_DEADLINE="60"), 3)
        self.assertIn("holds results of commit abc1234, this stage is def5678", self.log)

    def test_failing_tests_fail_the_call(self):
        self.stub("optim_cuda", 'echo "[ RUN      ] Optim.Bad"; echo "x.cpp:3: Failure"; '
                                'echo "[  FAILED  ] Optim.Bad (2 ms)"; exit 1')
        self.pack()
        self.assertEqual(self.check("--phases", "tests", GPU_CHECK_DEADLINE="120"), 1)
        self.assertIn("Optim.Bad", self.report())
        self.assertIn("| tests | failed |", self.report())

    def test_sigterm_writes_the_report_and_exits_4(self):
        p = self.start("check", "--rehearse", GPU_CHECK_DEADLINE="120", STUB_STEP_SLEEP="60")
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "step: at most" in line:
                time.sleep(0.5)
                p.send_signal(signal.SIGTERM)
                break
        self.log = "".join(lines) + p.communicate(timeout=30)[0]
        self.assertEqual(p.returncode, 4, self.log)
        self.assertIn("stopped by SIGTERM", self.report())
        self.assertIn("| tests | passed |", self.report())

    def test_missing_stage_and_bad_phase_are_setup_errors(self):
        self.assertEqual(self.check("nowhere"), 3)
        self.assertIn("nowhere/stage.tar.xz not found", self.log)
        self.assertEqual(self.check("--phases", "tests,bogus"), 3)
        self.assertIn("'bogus' is not one of", self.log)

    @unittest.skipIf(shutil.which("nvidia-smi"), "this machine has a GPU")
    def test_no_gpu_without_rehearse(self):
        self.assertEqual(self.run_cmd("check", "build-gpu-stage"), 2)
        self.assertIn("no NVIDIA GPU here", self.log)


class RepeatAndRehearse(FakeTree):

    def test_repeat_interleaves_environments(self):
        self.stub("minidl_bench_step", 'echo "warm-up"; [[ -n ${FAIL:-} ]] && exit 5; echo "minidl: ${IPS:-100} images/s"')
        self.pack()
        rc = self.run_cmd("repeat", "build-gpu-stage", "2", "IPS=120", "-", "FAIL=1", "--", "--seconds", "1")
        self.assertEqual(rc, 1, "a failed process fails the call")
        rows = [ln for ln in (self.out / "gpu_repeat.md").read_text().splitlines() if ln.startswith("| 1 ") or
                ln.startswith("| 2 ")]
        self.assertEqual([r.split(" | ")[1:3] for r in rows], [["`IPS=120`", "120"], ["`-`", "100"], ["`FAIL=1`", "-"]] * 2)
        self.assertIn("- arguments: `--seconds 1`; 2 processes per environment", (self.out / "gpu_repeat.md").read_text())

    def test_rehearse_runs_the_check_in_a_copy_of_what_a_call_sees(self):
        for name in ("kernels_cuda", "nn_cuda", "optim_cuda", "e2e_cuda"):
            self.stub(name, GTEST_OK)
        self.stub("minidl_bench_step", STEP_OK)
        self.stub("minidl-maxbatch", 'echo "maximum batch: 42 after 5 trials"')
        self.pack()
        (self.tree / ".gitignore").write_text("/build-gpu-stage/\n__pycache__/\n")
        subprocess.run("git init -q && git add -A", shell=True, cwd=self.tree, check=True)
        (self.tree / "untracked.txt").write_text("travels\n")
        rc = self.run_cmd("rehearse", "--dir", str(self.tmp / "call"), "--carry", "build-gpu-stage", "--",
                          "ls untracked.txt && test ! -d .git && python3 -m lab.gpulab check --rehearse --phases tests")
        self.assertEqual(rc, 0, self.log)
        self.assertIn("of the 64 MiB a call may carry (carry: build-gpu-stage)", self.log)
        self.assertIn("$OUT/gpu_check_state.tar.gz", self.log)
        rc = self.run_cmd("rehearse", "--dir", str(self.tmp / "call"), "--", "for i in 1 2 3 4 5 6 7 8 9; do touch $OUT/f$i; done")
        self.assertEqual(rc, 3, "nine files in $OUT break the rule")


class StepCategories(unittest.TestCase):
    def test_reads_the_model_phase_first_table_only(self):
        """The profile phase's category table reads the model phase's first table only (one per
        configuration and batch: a later one's launches are another step's)."""
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "model.md").write_text(
                "### first\n| `cuDNN conv forward` | 1 | 1 | 10.0 | 40.0 | 4.00 |\n"
                "| **sum of the launches** | | | 10.0 | 40.0 | 4.00 |\n### second\n"
                "| `cuDNN conv forward` | 1 | 1 | 10.0 | 500.0 | 50.00 |\n")
            (Path(d) / "profile.json").write_text('{"categories_us_per_step": {"convolution": 20.0}}')
            out = subprocess.run(["python3", REPO / "bench/step_categories.py", "--minidl", Path(d) / "model.md",
                                  "--pytorch", Path(d) / "profile.json"], capture_output=True, text=True).stdout
        self.assertIn("| convolution | 40.0 | 20.0 | 2.00 |", out)


if __name__ == "__main__":
    unittest.main()
