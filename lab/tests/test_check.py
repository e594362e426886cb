"""The check's planning, without running anything: budgets, cutting from the bottom under a fake
clock, resume bookkeeping, the report, exit statuses."""
import contextlib
import io
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab.gpulab import check, common, phases  # noqa: E402


class FakeClock:
    """Time moves only when a phase 'runs' (by the seconds it spends)."""

    def __init__(self, deadline):
        self.deadline, self.t = deadline, 0

    def elapsed(self):
        return self.t

    def left(self):
        return self.deadline - self.t


def run(plan, state=None, call=1, spend=None, status=None):
    """Runs the plan's phases with fake ones: each spends spend[p] seconds (default its whole
    budget) and returns status[p] (default passed). Returns (state, {phase: budget it got})."""
    clock, state, got, reports = FakeClock(plan.deadline), state or check.State(), {}, []

    def fake(p, budget):
        got[p] = budget
        clock.t += min(budget, (spend or {}).get(p, budget))
        return (status or {}).get(p, phases.PASSED)

    with contextlib.redirect_stdout(io.StringIO()):
        check.run_phases(plan, state, call, clock, fake, reports.append)
    return state, got, reports


class Plan(unittest.TestCase):
    def test_defaults_and_environment(self):
        p = check.plan_from({}, rehearse=False)
        self.assertEqual(p.phases, check.DEFAULT_PHASES)
        self.assertEqual((p.deadline, p.caps["step"], p.phase_min), (450, 190, 15))
        self.assertEqual(check.plan_from({}, rehearse=True).deadline, 240)
        p = check.plan_from({"GPU_CHECK_DEADLINE": "100", "GPU_CHECK_PHASES": "step,tests", "GPU_CHECK_CAP_STEP": "7"},
                            rehearse=False)
        self.assertEqual((p.deadline, p.phases, p.caps), (100, ["step", "tests"], {"step": 7, "tests": 60}))

    def test_flags_win_over_environment(self):
        p = check.plan_from({"GPU_CHECK_DEADLINE": "100", "GPU_CHECK_PHASES": "step"}, False, 30, "tests")
        self.assertEqual((p.deadline, p.phases), (30, ["tests"]))

    def test_bad_settings_are_setup_errors(self):
        with self.assertRaises(common.Exit) as e:
            check.plan_from({"GPU_CHECK_PHASES": "tests,bogus"}, False)
        self.assertEqual(e.exception.code, common.SETUP)
        with self.assertRaises(common.Exit):
            check.plan_from({"GPU_CHECK_DEADLINE": "soon"}, False)

    def test_budget_is_the_cap_or_what_is_left_before_the_reserve(self):
        p = check.plan_from({}, False)
        self.assertEqual(check.phase_budget(p, "tests", 400), 60)
        self.assertEqual(check.phase_budget(p, "step", 100), 90)


class Cutting(unittest.TestCase):
    def test_everything_fits_in_priority_order(self):
        plan = check.plan_from({}, False)
        state, got, reports = run(plan, spend={p: 5 for p in plan.phases})
        self.assertEqual(list(got), check.DEFAULT_PHASES)
        self.assertEqual(reports, check.DEFAULT_PHASES, "the report is rewritten after every phase")
        self.assertEqual(check.exit_code(state, 1), common.OK)

    def test_what_does_not_fit_is_cut_from_the_bottom(self):
        # 450 s: tests 60, step 190, sanitizer 75, model 45 spend their caps (370 s); profile gets
        # 450 - 370 - 10 = 70 -> its cap 45; bench: 450 - 415 - 10 = 25 -> 25; maxbatch: 0 left -> cut.
        plan = check.plan_from({}, False)
        state, got, _ = run(plan)
        self.assertEqual(got, {"tests": 60, "step": 190, "sanitizer": 75, "model": 45, "profile": 45, "bench": 25})
        self.assertEqual(state.latest("maxbatch"), ["maxbatch", "cut", 0, 1])
        self.assertEqual(check.exit_code(state, 1), common.CUT)

    def test_a_phase_with_less_than_the_minimum_is_not_started(self):
        plan = check.plan_from({"GPU_CHECK_DEADLINE": "100"}, False)
        state, got, _ = run(plan)   # tests 60, step 30, then 0 left
        self.assertEqual(list(got), ["tests", "step"])
        self.assertEqual([r[1] for r in state.records[2:]], ["cut"] * 5)

    def test_a_failure_wins_over_a_cut(self):
        plan = check.plan_from({"GPU_CHECK_DEADLINE": "100"}, False)
        state, _, _ = run(plan, status={"tests": phases.FAILED})
        self.assertEqual(check.exit_code(state, 1), common.FAILED)

    def test_statuses_of_phases(self):
        plan = check.plan_from({"GPU_CHECK_PHASES": "tests,step,bench"}, False)
        state, _, _ = run(plan, spend={"tests": 1, "step": 1, "bench": 1},
                          status={"step": phases.CUT, "bench": phases.SKIPPED})
        self.assertEqual([r[1] for r in state.records], ["passed", "cut", "skipped"])
        self.assertEqual(check.exit_code(state, 1), common.CUT)


class Resume(unittest.TestCase):
    def first_call(self):
        plan = check.plan_from({"GPU_CHECK_DEADLINE": "100"}, False)
        state, _, _ = run(plan, status={"step": phases.CUT})
        return check.State.from_json(state.to_json())   # as the state tarball carries it

    def test_keeps_finished_phases_and_runs_the_rest(self):
        state = self.first_call()
        self.assertTrue(state.done("tests"))
        self.assertFalse(state.done("step"), "step was cut")
        self.assertEqual(state.next_call(), 2)
        plan = check.plan_from({}, False)
        state, got, _ = run(plan, state, call=2, spend={p: 1 for p in plan.phases})
        self.assertNotIn("tests", got)
        self.assertEqual(list(got), check.DEFAULT_PHASES[1:])
        self.assertEqual(state.latest("tests")[3], 1)
        self.assertEqual(state.latest("step")[3], 2)
        self.assertEqual(check.exit_code(state, 2), common.OK, "the earlier call's cuts do not count")

    def test_a_phase_cut_again_runs_in_the_next_call(self):
        state = check.State("abc", [["tests", "passed", 3, 1], ["step", "cut", 0, 1], ["step", "cut", 9, 2]])
        self.assertFalse(state.done("step"))
        self.assertEqual(state.next_call(), 3)
        self.assertEqual(state.latest("step"), ["step", "cut", 9, 2])


class Report(unittest.TestCase):
    def render(self, state, sections, rehearse=False):
        head = {"date": "D", "rehearse": rehearse, "command": "python3 -m lab.gpulab check x", "call": 2,
                "elapsed": 12, "commit": "abc1234", "now": "N", "machine": ["- GPU: G"], "libraries": "L",
                "torch": "T"}
        plan = check.plan_from({"GPU_CHECK_PHASES": "tests,step,bench"}, False)
        return check.render_report(head, plan, state, sections, "after step"), plan

    def test_content(self):
        state = check.State("abc1234", [["tests", "passed", 3, 1], ["step", "cut", 40, 2]])
        text, plan = self.render(state, {"tests": "## 1. Tests\n\n9 passed\n"})
        self.assertIn("- command: `python3 -m lab.gpulab check x` (call 2; deadline 450 s; report written at 12 s: "
                      "after step)", text)
        self.assertIn("| tests | passed | 3 | 1 |\n| step | cut | 40 | 2 |\n| bench | not run yet | | |", text)
        self.assertIn("## 1. Tests\n\n9 passed\n\n## step\n\nnot run yet\n\n## bench", text)
        self.assertNotIn("CPU rehearsal", text)
        tail = check.summary(text, {"tests": "## 1. Tests\n\n9 passed\n"}, plan)
        self.assertTrue(tail.startswith("# GPU check, D"))
        self.assertTrue(tail.endswith("| bench | not run yet | | |\n\n## 1. Tests\n\n9 passed"))

    def test_rehearsal_says_so(self):
        text, _ = self.render(check.State(), {}, rehearse=True)
        self.assertIn("**CPU rehearsal (--rehearse): no GPU was used; these are not GPU results.**", text)

    def test_names(self):
        self.assertEqual(str(check.report_path("abc1234+dirty", False, "2030-01-02")),
                         "lab/results/bench/gpu_check_2030-01-02_abc1234.md")
        self.assertTrue(str(check.report_path("abc", True, "d")).endswith("_abc_rehearsal.md"))
        self.assertEqual(check.out_name("a b+c.md"), "a-b-c.md")


if __name__ == "__main__":
    unittest.main()
