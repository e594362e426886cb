"""The studies runner's planning and bookkeeping, and collect's choices, from values alone."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.gpulab import common, studies  # noqa: E402


class Plan(unittest.TestCase):
    def test_caps_and_the_pytorch_step_after_the_last_utilization_step(self):
        self.assertEqual(studies.parse_plan("utilization:170,utilization-amp,keras-batch:200", False),
                         [("utilization", 170), ("utilization-amp", None), ("pytorch", 150), ("keras-batch", 200)])
        self.assertEqual(studies.parse_plan("utilization", True), [("utilization", None), ("pytorch", 4)])
        self.assertEqual(studies.parse_plan("pytorch:60,utilization", False), [("pytorch", 60), ("utilization", None)])
        self.assertEqual(studies.parse_plan("techniques", False), [("techniques", None)])
        self.assertEqual(studies.parse_plan("conv-bn-chain:240", False), [("conv-bn-chain", 240)])

    def test_bad_plans_are_setup_errors(self):
        for plan in ("", "keras", "techniques:1.5", "techniques:soon"):
            with self.assertRaises(common.Exit) as e:
                studies.parse_plan(plan, False)
            self.assertEqual(e.exception.code, common.SETUP, plan)

    def test_settings(self):
        s = studies.settings_from({}, rehearse=True)
        self.assertEqual((s.deadline, s.grace, s.pack_reserve, s.min_step, s.device), (20, 8, 2, 2, "cpu"))
        s = studies.settings_from({"GPU_STUDIES_DEADLINE": "300", "GPU_STUDIES_EXTRA": "--seeds 2"}, rehearse=False)
        self.assertEqual((s.deadline, s.grace, s.extra, s.device), (300, 60, ["--seeds", "2"], "cuda"))


class Restore(unittest.TestCase):
    def test_results_left_by_an_earlier_call_are_set_aside(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            self.assertIsNone(studies.set_aside_results(d))
            (Path(d) / "results" / "keras-batch").mkdir(parents=True)
            (Path(d) / "results" / "keras-batch" / "results.csv").write_text("run_id\nb16\n")
            kept = studies.set_aside_results(d)
            self.assertFalse((Path(d) / "results").exists(), "the next call starts without it")
            self.assertEqual((kept / "keras-batch" / "results.csv").read_text(), "run_id\nb16\n")


class Bookkeeping(unittest.TestCase):
    def test_exit_status_so_far(self):
        self.assertEqual(studies.worse(common.OK, common.CUT), common.CUT)
        self.assertEqual(studies.worse(common.CUT, common.OK), common.CUT)
        self.assertEqual(studies.worse(common.CUT, common.FAILED), common.FAILED)
        self.assertEqual(studies.worse(common.FAILED, common.CUT), common.FAILED)

    def test_a_step_not_started_never_says_a_negative_time(self):
        # The 20 s rehearsal printed "not started: -1 s left before the deadline" with 9 s left:
        # the budget is what is left less the grace and the packing reserve.
        self.assertEqual(studies.not_started(-1, 9, 10), "not started: 0 s for it (9 s left, 10 kept for the grace and packing)")
        self.assertEqual(studies.not_started(20, 95, 75), "not started: 20 s for it (95 s left, 75 kept for the grace and packing)")
        self.assertEqual(studies.not_started(-80, -5, 75), "not started: 0 s for it (0 s left, 75 kept for the grace and packing)")

    def test_count_runs(self):
        self.assertEqual(studies.count_runs("a 1 done\nb 2 todo\n\nc 3 done\n"), (2, 3))

    def test_sweep_state(self):
        self.assertEqual(studies.sweep_state(0, 10, 100, 60, 3, 3), ("finished", common.OK, False))
        self.assertEqual(studies.sweep_state(0, 10, 100, 60, 2, 3), ("finished with runs left over", common.CUT, True))
        state, code, again = studies.sweep_state(124, 100, 100, 60, 1, 3)
        self.assertEqual((code, again), (common.CUT, True))
        self.assertIn("cut by the deadline at 100 s", state)
        self.assertEqual(studies.sweep_state(137, 160, 100, 60, 1, 3)[1:], (common.CUT, True),
                         "killed after the grace: resumes")
        state, code, again = studies.sweep_state(137, 20, 100, 60, 1, 3)
        self.assertEqual((code, again), (common.FAILED, False))
        self.assertIn("out of host memory?", state)
        self.assertEqual(studies.sweep_state(2, 5, 100, 60, 0, 3, "error: bad flag")[0], "failed, exit 2: error: bad flag")


class Collect(unittest.TestCase):
    def test_targets(self):
        self.assertEqual(studies.collect_target("keras-batch", "d"), Path("d/keras-batch-photos-cuda"))
        self.assertEqual(studies.collect_target("utilization-amp", "d"), Path("d/utilization-amp-cuda"))
        self.assertIsNone(studies.collect_target("gpu_studies", "d"))
        self.assertIsNone(studies.collect_target("keras-batch-quick-cpu", "d"))

    def test_step_table(self):
        text = "# call\n\n- x\n\n| step | state |\n| --- | --- |\n| a | finished |\n\n## a\n| other |\n"
        self.assertEqual(studies.step_table(text), "| step | state |\n| --- | --- |\n| a | finished |")

    def test_the_step_table_is_printed_again_last(self):
        summary = ("# GPU studies call X: cut by the deadline\n\n- a\n\n| step | state |\n| --- | --- |\n| techniques | cut |\n\n"
                   "To resume: put this call's tarball in .gpu-results/ ...\n\n## keras-batch\n\n" + "| 16 | 0.5 |\n" * 2000)
        text = studies.closing(summary)
        self.assertEqual(text, "\n---\n# GPU studies call X: cut by the deadline\n\nTo resume: put this call's tarball in "
                               ".gpu-results/ ...\n\n| step | state |\n| --- | --- |\n| techniques | cut |\n")
        self.assertLess(len(text), 12000, "inside the output tail the remote tool returns")

    def test_plot_link_replaces_the_no_plot_line_of_its_data_file(self):
        settings, ylab = studies.plot_settings("# plot: plottitle='T'; ylab='accuracy'; logx=1\n1 2\n")
        self.assertEqual((settings, ylab), ("plottitle='T'; ylab='accuracy'; logx=1", "accuracy"))
        summary = "x\nNo plot: gnuplot missing (a.png.dat)\nNo plot: gnuplot missing (b.png.dat)\n"
        self.assertEqual(studies.link_plot(summary, "a.png.dat", "a.png", "accuracy"),
                         "x\n![accuracy](a.png)\nNo plot: gnuplot missing (b.png.dat)\n")


if __name__ == "__main__":
    unittest.main()
