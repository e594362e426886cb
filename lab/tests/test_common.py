"""The shared parts: ldd's output, the library path, running under a deadline, the CLI."""
import contextlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.gpulab import __main__ as cli  # noqa: E402
from lab.gpulab import common, rehearse, repeat, stage  # noqa: E402


class Libraries(unittest.TestCase):
    def test_parse_ldd(self):
        text = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibcudnn.so.9 => /x/nvidia/cudnn/lib/libcudnn.so.9 (0x00007f)\n"
                "\tlibcublas.so.13 => not found\n\tlibgomp.so.1 => /usr/lib/libgomp.so.1 (0x00007f)\n")
        found, missing = common.parse_ldd(text)
        self.assertEqual(missing, ["libcublas.so.13"])
        self.assertEqual(common.cuda_libs_line(found), "libcudnn.so.9 -> /x/nvidia/cudnn/lib/libcudnn.so.9")

    def test_library_dirs_stage_first_then_wheels_then_system(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            for sub in ("stage/lib", "site/nvidia/cudnn/lib", "site/nvidia/cu13/lib", "site/nvidia/empty/lib",
                        "site/torch/lib", "sys"):
                (d / sub).mkdir(parents=True)
            for sub in ("site/nvidia/cudnn/lib", "site/nvidia/cu13/lib", "site/torch/lib"):
                (d / sub / "libx.so.1").write_text("")
            dirs = common.library_dirs([d / "stage/lib", d / "missing"], [d / "site", d / "site"],
                                       system=[str(d / "sys"), str(d / "nope")])
        self.assertEqual(dirs, [str(d / "stage/lib"), str(d / "site/nvidia/cu13/lib"), str(d / "site/nvidia/cudnn/lib"),
                                str(d / "site/torch/lib"), str(d / "sys")])

    def test_parse_smi(self):
        self.assertEqual(common.parse_smi("NVIDIA H200, 570.1, 143771 MiB"), ["NVIDIA H200", "570.1", "143771 MiB"])


class RunUntil(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.log = Path(self.dir.name) / "log"

    def test_exit_status_and_log(self):
        self.assertEqual(common.run_until(["bash", "-c", "echo hi; exit 3"], self.log, 10), 3)
        self.assertEqual(self.log.read_text(), "hi\n")

    def test_stopped_at_the_deadline(self):
        t0 = time.monotonic()
        self.assertEqual(common.run_until(["bash", "-c", "echo started; sleep 30"], self.log, 1), 124)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertIn("started", self.log.read_text(), "a stopped program's lines stay in its log")

    def test_killed_after_the_grace(self):
        t0 = time.monotonic()
        rc = common.run_until(["bash", "-c", "trap '' INT; sleep 30"], self.log, 1, sig=2, grace=1)
        self.assertEqual(rc, 137)
        self.assertLess(time.monotonic() - t0, 5)

    def test_no_time_left_runs_nothing(self):
        self.assertEqual(common.run_until(["touch", self.log.with_name("ran")], self.log, 0), 124)
        self.assertFalse(self.log.with_name("ran").exists())
        self.assertIn("not run", self.log.read_text())

    def test_env_int(self):
        self.assertEqual(common.env_int({"X": " 12 "}, "X", 5), 12)
        self.assertEqual(common.env_int({"X": ""}, "X", 5), 5)
        with self.assertRaises(common.Exit):
            common.env_int({"X": "1.5"}, "X", 5)


class Cli(unittest.TestCase):
    def code(self, *argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.parse(list(argv))
            except SystemExit as e:
                return e.code, err.getvalue()
        return 0, ""

    def test_argument_errors_exit_3(self):
        for argv in (["check", "--bogus"], ["nothing"], [], ["check", "--deadline", "soon"], ["repeat", "d", "0", "-"],
                     ["repeat", "d", "2", "A=1"], ["studies"]):
            self.assertEqual(self.code(*argv)[0], common.SETUP, argv)

    def test_help_exits_0(self):
        self.assertEqual(self.code("check", "--help")[0], 0)

    def test_parsed(self):
        a = cli.parse(["check", "--rehearse", "--resume", "s.tar.gz", "--deadline", "90", "stage-dir"])
        self.assertEqual((a.rehearse, a.resume, a.deadline, a.dir, a.argv),
                         (True, "s.tar.gz", 90, "stage-dir", ["--rehearse", "--resume", "s.tar.gz", "--deadline", "90",
                                                              "stage-dir"]))
        a = cli.parse(["repeat", "d", "3", "A=1 B=2", "-", "--", "--device", "cuda"])
        self.assertEqual((a.rounds, a.envs, a.bench_args), (3, ["A=1 B=2", "-"], ["--device", "cuda"]))
        a = cli.parse(["rehearse", "--carry", "x", "--carry", "y", "--", "bash", "-c", "true"])
        self.assertEqual((a.carry, a.command), (["x", "y"], ["bash", "-c", "true"]))

    def test_run_reports_setup_errors_on_stderr(self):
        err = io.StringIO()
        cwd = os.getcwd()
        self.addCleanup(os.chdir, cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.run(["stage", "--only", "tests,docs"])
        self.assertEqual(rc, common.SETUP)
        self.assertIn("gpulab stage: --only: 'docs' is not tests, studies or photos", err.getvalue())


class Stage(unittest.TestCase):
    def test_the_last_added_table_of_each_gpu(self):
        entries = [(10, "gpu_model_a.tsv"), (30, "gpu_model_b_graph.tsv"), (20, "gpu_model_c.tsv"),
                   (25, "gpu_model_d_nhwc.tsv"), (5, "gpu_model_e_h200.tsv"), (20, "gpu_model_b.tsv")]
        self.assertEqual(stage.pick_table(entries, "h100"), "gpu_model_c.tsv")
        self.assertEqual(stage.pick_table(entries, "h200"), "gpu_model_e_h200.tsv")
        self.assertEqual(stage.pick_table([], "h100"), "")

    def test_make_stage_packs_programs_libraries_and_notes(self):
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
            d = Path(d)
            (d / "build/bin").mkdir(parents=True)
            for name in ("kernels_cuda", "minidl_bench_step"):
                shutil.copy("/bin/true", d / "build/bin" / name)
            stage.make_stage(d / "build", ["kernels_cuda"], ["minidl_bench_step"], d / "out", "stage.tar.xz", "abc1234",
                             {"MODEL_TSV": "lab/results/bench/gpu_model_x.tsv\n"})
            with tarfile.open(d / "out/stage.tar.xz") as t:
                names = t.getnames()
                self.assertEqual(t.extractfile("COMMIT").read(), b"abc1234\n")
            self.assertTrue({"COMMIT", "MODEL_TSV", "bin/kernels_cuda", "bin/minidl_bench_step", "lib"} <= set(names))
            self.assertEqual((d / "out/COMMIT").read_text(), "abc1234\n")
            with self.assertRaises(common.Exit) as e:
                stage.make_stage(d / "build", ["nn_cuda"], [], d / "out", "stage.tar.xz", "abc1234")
            self.assertIn("nn_cuda is missing", str(e.exception))

    def test_a_dirty_stage_names_the_uncommitted_files(self):
        # The rehearsal's stage in the shared checkout was '7ddb0d3+dirty' with others' uncommitted
        # kernels built in, and nothing said which: the stage packs the list and the reports name it.
        porcelain = " M kernels/cuda/softmax.cu\nM  bench/bench_cuda.cu\nR  old.h -> include/new.h\n"
        self.assertEqual(stage.dirty_paths(porcelain), ["kernels/cuda/softmax.cu", "bench/bench_cuda.cu", "include/new.h"])
        self.assertEqual(stage.dirty_paths(""), [])
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "COMMIT").write_text("abc1234+dirty\n")
            self.assertEqual(common.stage_commit_line(d), "abc1234+dirty")
            (d / "DIRTY").write_text("kernels/cuda/softmax.cu\nbench/bench_cuda.cu\n")
            self.assertEqual(common.stage_commit_line(d), "abc1234+dirty (uncommitted changes built in: "
                                                          "kernels/cuda/softmax.cu bench/bench_cuda.cu)")

    def test_newest_versions(self):
        text = "0 DF *UND* GLIBC_2.34 x\n0 DF *UND* GLIBC_2.4 y\n0 DF GLIBCXX_3.4.30 z\n0 DF GLIBCXX_3.4.9 w\n"
        self.assertEqual(stage.newest_versions(text), ["GLIBC_2.34", "GLIBCXX_3.4.30"])


class Rehearse(unittest.TestCase):
    def test_out_rules(self):
        rows, bad = rehearse.out_problems([("report.md", 10), ("a/b/c.txt", 1)])
        self.assertFalse(bad)
        rows, bad = rehearse.out_problems([("a b.md", 1), ("a/b/c/d.txt", 1), ("big", 17 * 1048576)])
        self.assertTrue(bad)
        self.assertEqual([w for _, _, w in rows], ["name or depth not returned", "name or depth not returned",
                                                   "over 16 MiB"])
        self.assertTrue(rehearse.out_problems([(f"f{i}", 1) for i in range(9)])[1], "more than 8 files")

    def test_call_limits(self):
        with self.assertRaises(common.Exit):
            rehearse.check_call("x" * 2001, [])
        with self.assertRaises(common.Exit):
            rehearse.check_call("true", ["p"] * 9)


class Repeat(unittest.TestCase):
    def test_env_and_rows(self):
        self.assertEqual(repeat.parse_env("A=1 B=x=y"), {"A": "1", "B": "x=y"})
        self.assertEqual(repeat.parse_env("-"), {})
        with self.assertRaises(common.Exit):
            repeat.parse_env("A")
        row, ips = repeat.result_row(2, "A=1", 0, "warm-up\nminidl: 812.5 images/s | 3 steps\n")
        self.assertEqual((row, ips), ("| 2 | `A=1` | 812.5 | minidl: 812.5 images/s / 3 steps |", "812.5"))
        row, ips = repeat.result_row(1, "-", 134, "boom\naborted\n")
        self.assertEqual((row, ips), ("| 1 | `-` | - | exit 134: boom aborted |", None))


if __name__ == "__main__":
    unittest.main()
