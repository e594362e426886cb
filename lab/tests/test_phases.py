"""The phases' parsing and verdicts, from text: GoogleTest logs, step runs, memcheck, benchmarks."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.gpulab import phases  # noqa: E402


class Tests(unittest.TestCase):
    def test_gtest_counts(self):
        log = ("[ RUN      ] A.a\n[       OK ] A.a (1 ms)\n[ RUN      ] A.b\n[  FAILED  ] A.b (2 ms)\n"
               "[ RUN      ] A.c\n[  SKIPPED ] A.c (0 ms)\n[  FAILED  ] 1 test, listed below:\n[ RUN      ] A.d\n")
        self.assertEqual(phases.gtest_counts(log), (1, 1, 1, "A.d"))

    def test_each_later_executable_keeps_15_s_or_an_even_share(self):
        self.assertEqual(phases.share(60, 3), 15)
        self.assertEqual(phases.share(100, 3), 55)
        self.assertEqual(phases.share(20, 3), 5)
        self.assertEqual(phases.share(20, 0), 20)


class Step(unittest.TestCase):
    def test_spec(self):
        self.assertEqual(phases.parse_step_spec("minidl:amp:nhwc:graphs:hostscaler:b256", False),
                         ("minidl", "amp", 256, ["--channels-last", "--cuda-graphs", "--host-scaler"]))
        self.assertEqual(phases.parse_step_spec("pytorch:tf32:graphs", True), ("pytorch", "tf32", 128, []),
                         "a rehearsal's CPU has no graphs")
        self.assertEqual(phases.parse_step_spec("minidl:amp:nhwc:chain:graphs", False),
                         ("minidl", "amp", 128, ["--channels-last", "--conv-bn-chain", "--cuda-graphs"]))
        self.assertEqual(phases.parse_step_spec("pytorch:fp32:smallcnn:adam:graphs:acc4:b16", False),
                         ("pytorch", "fp32", 16, ["--model", "smallcnn", "--image-size", "200", "--optimizer", "adam",
                                                  "--cuda-graphs", "--accumulation-steps", "4"]))
        self.assertEqual(phases.parse_step_spec("minidl:fp32:smallcnn:adam", True),
                         ("minidl", "fp32", 128, ["--optimizer", "adam"]), "a rehearsal keeps its small model")

    def test_args_take_the_runs_model_once(self):
        args = phases.step_args(False, 16, 15, ["--model", "smallcnn", "--image-size", "200"])
        self.assertEqual(args.count("--model"), 1)
        self.assertEqual(args[args.index("--model") + 1], "smallcnn")
        self.assertEqual(args[args.index("--image-size") + 1], "200")
        plain = phases.step_args(False, 128, 15)
        self.assertEqual(plain[plain.index("--model") + 1], "resnet50")

    def test_the_graphs_preset_pairs_every_run(self):
        runs = phases.STEP_RUN_PRESETS["graphs"].split()
        self.assertEqual(len(runs), 16)
        for r in runs:
            phases.parse_step_spec(r, False)   # every one parses
        ips = {r: 100.0 for r in runs}
        lines = phases.step_ratios(runs, ips)
        self.assertIn("minidl:fp32:smallcnn:adam:graphs:b16 / minidl:fp32:smallcnn:adam:b16: 1.00x", lines)
        self.assertIn("minidl:amp:nhwc:graphs:acc4:b256 / pytorch:amp:graphs:acc4:b256: 1.00x", lines)
        self.assertIn("minidl:amp:nhwc:acc4:b32 / pytorch:amp:acc4:b32: 1.00x", lines)
        self.assertEqual(len(lines), 4 * 3 + 4 * 1)

    def test_bad_specs_name_the_problem(self):
        for spec, words in [("minidl:amp:bogus", "unknown option 'bogus'"),
                            ("pytorch:amp:nhwc", "PyTorch takes graphs, smallcnn, adam, accN and bN only"),
                            ("pytorch:amp:chain", "PyTorch takes graphs, smallcnn, adam, accN and bN only"),
                            ("minidl:amp:accx", "unknown option 'accx'"),
                            ("jax:amp", "unknown framework 'jax'")]:
            with self.assertRaises(ValueError) as e:
                phases.parse_step_spec(spec, False)
            self.assertIn(words, str(e.exception))

    def test_ratios_against_the_same_precision_and_batch(self):
        runs = ["minidl:amp:nhwc:b256", "pytorch:amp:b256", "minidl:amp:graphs", "pytorch:amp", "pytorch:amp:graphs",
                "minidl:tf32", "pytorch:amp:graphs:b256"]
        ips = {"minidl:amp:nhwc:b256": 150.0, "pytorch:amp:b256": 200.0, "minidl:amp:graphs": 100.0,
               "pytorch:amp": 200.0, "pytorch:amp:graphs": 400.0, "minidl:tf32": 50.0, "pytorch:amp:graphs:b256": 1.0}
        self.assertEqual(phases.step_ratios(runs, ips), [
            "minidl:amp:nhwc:b256 / pytorch:amp:b256: 0.75x",
            "minidl:amp:graphs / pytorch:amp: 0.50x",
            "minidl:amp:graphs / pytorch:amp:graphs: 0.25x"])

    def test_detail(self):
        d = {"steps": 10, "seconds": 2.0, "peak_allocated_bytes": 3 * 2**20, "peak_reserved_bytes": 4 * 2**20,
             "host_seconds": 1.0}
        self.assertEqual(phases.step_detail(d), "10 steps in 2.0 s; peak 3 MiB (reserved 4); host 100.0 of 200.0 ms a step")
        self.assertEqual(phases.step_detail({"steps": 1, "seconds": 1.0}), "1 steps in 1.0 s; peak - MiB")
        self.assertEqual(phases.step_detail({"steps": 1, "seconds": 1.0, "loss": 0.25, "optimizer_steps": 16}),
                         "1 steps in 1.0 s; peak - MiB; loss 0.2500 after 16 updates")


class Sanitizer(unittest.TestCase):
    def test_verdicts(self):
        ok = "[       OK ] A.a (1 ms)\n========= ERROR SUMMARY: 0 errors\n"
        self.assertEqual(phases.sanitizer_verdict(0, ok, 75),
                         (phases.PASSED, "clean (ERROR SUMMARY: 0; 1 tests passed under memcheck)"))
        self.assertEqual(phases.sanitizer_verdict(124, "[ RUN      ] A.b\n", 75)[0], phases.CUT)
        cut_with_errors = "========= ERROR SUMMARY: 3 errors\n[ RUN      ] A.b\n"
        self.assertEqual(phases.sanitizer_verdict(124, cut_with_errors, 75)[0], phases.FAILED)
        status, text = phases.sanitizer_verdict(99, "========= Invalid read\n========= ERROR SUMMARY: 1 error\n", 75)
        self.assertEqual(status, phases.FAILED)
        self.assertIn("memcheck errors: ERROR SUMMARY: 1", text)
        self.assertIn("========= Invalid read", text)


class Bench(unittest.TestCase):
    def test_table_leaves_out_aggregates_and_converts_units(self):
        d = {"benchmarks": [{"name": "Add/1", "real_time": 2000, "time_unit": "us", "GB/s": 3000.4, "vs_copy": 0.9},
                            {"name": "Add/1_mean", "run_type": "aggregate", "real_time": 1}]}
        rows = phases.bench_table(d).splitlines()
        self.assertEqual(len(rows), 3)
        self.assertEqual(rows[2], "| Add/1 | 2.000 | 3000 | 0.90 |  |")


class Status(unittest.TestCase):
    def test_status_of(self):
        self.assertEqual(phases.status_of(0), phases.PASSED)
        self.assertEqual(phases.status_of(124), phases.CUT)
        self.assertEqual(phases.status_of(137), phases.CUT)
        self.assertEqual(phases.status_of(2), phases.FAILED)
        self.assertEqual(phases.status_of(0, cut=True, failed=True), phases.FAILED)


if __name__ == "__main__":
    unittest.main()
