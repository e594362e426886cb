"""`gpulab studies --rehearse` end to end on a fake stage (a minidl-sweep stub that keeps its runs
in results.csv and stops at SIGINT): a plan that finishes, a call cut by its deadline (exit 4)
whose tarball the next call resumes from, a study without photos (exit 1), and `collect`."""
import shutil
import tarfile
import unittest

from support import FakeTree

SWEEP = r'''study=""; out=""; list=0; quick=0; amp=0
while [[ $# -gt 0 ]]; do
  case $1 in --study) study=$2; shift ;; --out) out=$2; shift ;; --list) list=1 ;; --quick) quick=1 ;;
    --amp) amp=1 ;; --help) echo usage; exit 0 ;; esac
  shift
done
name=$study; [[ $amp == 1 ]] && name=$study-amp
dir=$out/$name; [[ $quick == 1 ]] && dir=$dir-quick-cpu
mkdir -p "$dir"
if [[ $list == 1 ]]; then
  for r in 1 2 3; do if grep -qx "run$r" "$dir/results.csv" 2>/dev/null; then echo "run$r done"; else echo "run$r todo"; fi; done
  exit 0
fi
trap 'echo "| $name | cut |" >"$dir/summary.md"; exit 130' INT
for r in 1 2 3; do
  grep -qx "run$r" "$dir/results.csv" 2>/dev/null && continue
  sleep "${STUB_RUN_SLEEP:-0}"
  echo "run$r" >>"$dir/results.csv"
done
echo "| $name | 3 runs |" >"$dir/summary.md"'''


class StudiesRehearsal(FakeTree):

    def setUp(self):
        super().setUp()
        self.stub("minidl-sweep", SWEEP)
        self.pack("build-gpu-studies", "studies.tar.xz")
        for c in ("cat", "dog"):
            (self.tree / ".data/catsdogs" / c).mkdir(parents=True)
            (self.tree / ".data/catsdogs" / c / "1.jpg").write_text("jpeg")

    def studies(self, plan, **env):
        return self.run_cmd("studies", "--rehearse", plan, **env)

    def tarballs(self):
        return sorted(self.out.glob("gpu_studies_rehearsal_2*.tar.gz"))

    def test_a_plan_that_finishes(self):
        self.assertEqual(self.studies("utilization,keras-batch"), 0, self.log)
        summary = (self.out / "gpu_studies_summary.md").read_text()
        self.assertIn("| utilization | finished | 3 of 3 |", summary)
        self.assertIn("| pytorch | skipped: bench/pytorch_utilization.py is not in this tree | | 0 |", summary)
        self.assertIn("| keras-batch | finished | 3 of 3 |", summary)
        self.assertIn("## keras-batch (results/keras-batch-quick-cpu/summary.md)", summary)
        self.assertIn("**CPU rehearsal: not GPU results.**", summary)
        self.assertEqual(len(self.tarballs()), 1)
        with tarfile.open(self.tarballs()[0]) as t:
            names = t.getnames()
        self.assertIn("results/keras-batch-quick-cpu/results.csv", names)
        self.assertTrue(any(n.endswith("/provenance.md") for n in names))
        self.assertTrue(self.log.rstrip().endswith("|"), "the summary is printed last")
        self.assertIn("| keras-batch | finished | 3 of 3 |", self.log[-600:], "then the step table again")

    def test_cut_then_resumed_from_the_tarball(self):
        rc = self.studies("utilization,keras-batch", GPU_STUDIES_DEADLINE="8", GPU_STUDIES_GRACE="2", STUB_RUN_SLEEP="3")
        self.assertEqual(rc, 4, self.log)
        summary = (self.out / "gpu_studies_summary.md").read_text()
        self.assertIn("| utilization | cut by the deadline at 4 s (SIGINT); resumes next call | 1 of 3 |", summary)
        self.assertIn("| keras-batch | not started:", summary)
        self.assertIn("run `python3 -m lab.gpulab studies --rehearse utilization,keras-batch`", summary)
        (self.tree / ".gpu-results").mkdir()
        shutil.copy(self.tarballs()[0], self.tree / ".gpu-results")
        self.assertEqual(self.studies("utilization,keras-batch"), 0, self.log)
        self.assertIn("restored earlier results: gpu_studies_rehearsal_", self.log)
        summary = (self.out / "gpu_studies_summary.md").read_text()
        self.assertIn("| utilization | finished | 3 of 3 |", summary)
        self.assertIn("| keras-batch | finished | 3 of 3 |", summary)

    def test_the_pytorch_baseline_and_its_comparisons(self):
        (self.tree / "bench/pytorch_utilization.py").write_text(
            "import sys\nopen(sys.argv[sys.argv.index('--out') + 1], 'w').write('batch,images_per_s\\n2,1\\n')\n")
        (self.tree / "bench/compare_utilization.py").write_text(
            "import sys\nprint('| compared |', sys.argv[sys.argv.index('--pytorch') + 1])\n")
        self.assertEqual(self.studies("utilization,utilization-amp"), 0, self.log)
        summary = (self.out / "gpu_studies_summary.md").read_text()
        self.assertIn("| pytorch | f32: done; best: done; best-graphs: not on cpu (CUDA graphs) |", summary)
        d = self.tree / "results/utilization-quick-cpu"
        self.assertIn("pytorch-f32.csv", (d / "compare-f32.md").read_text())
        self.assertIn("pytorch-best.csv", (d / "compare-best.md").read_text())
        self.assertTrue((self.tree / "results/utilization-amp-quick-cpu/compare-best.md").is_file(),
                        "--best is compared with the amp table too")
        self.assertIn("### compare-f32.md", summary)
        # The next call measures PyTorch again only where its tarball lacks the CSVs. The results/
        # the first call left in the tree is set aside: a call runs from what it carries.
        (self.tree / ".gpu-results").mkdir()
        shutil.copy(self.tarballs()[0], self.tree / ".gpu-results")
        self.assertEqual(self.studies("utilization"), 0, self.log)
        self.assertIn("a results/ left by an earlier call on this machine was moved to", self.log)
        self.assertIn("f32: measured in an earlier call; best: measured in an earlier call",
                      (self.out / "gpu_studies_summary.md").read_text())

    def test_a_study_without_photos_fails(self):
        shutil.rmtree(self.tree / ".data")
        self.assertEqual(self.studies("techniques"), 1)
        self.assertIn("| techniques | not run: no photos in .data/catsdogs", (self.out / "gpu_studies_summary.md").read_text())

    def test_setup_errors(self):
        self.assertEqual(self.studies("keras"), 3)
        self.assertEqual(self.studies("utilization", GPU_STUDIES_STAGE="nowhere"), 3)
        self.assertIn("no nowhere/studies.tar.xz", self.log)

    def test_collect(self):
        results = self.tmp / "r/results"
        for d in ("keras-batch", "utilization", "keras-batch-quick-cpu", "gpu_studies/20300101T000000Z"):
            (results / d).mkdir(parents=True)
        (results / "keras-batch/summary.md").write_text("| keras |\n")
        (results / "utilization/results.csv").write_text("x\n")
        (results / "gpu_studies/20300101T000000Z/provenance.md").write_text("# call 1\n")
        (results / "gpu_studies/20300101T000000Z/summary.md").write_text("# s\n\n| step | state |\n| a | b |\n\nmore\n")
        tarball = self.tree / "gpu_studies_20300101T000000Z.tar.gz"
        with tarfile.open(tarball, "w:gz") as t:
            t.add(results, arcname="results")
        env = {"PATH": "/usr/bin:/bin"}   # no gnuplot: collect says how to draw later
        self.assertEqual(self.run_cmd("collect", tarball.name, "dest", **env), 0, self.log)
        self.assertEqual((self.tree / "dest/keras-batch-photos-cuda/summary.md").read_text(), "| keras |\n")
        self.assertTrue((self.tree / "dest/utilization-cuda/results.csv").is_file())
        self.assertFalse((self.tree / "dest/keras-batch-quick-cpu-photos-cuda").exists())
        self.assertEqual((self.tree / "dest/utilization-cuda/gpu_calls.md").read_text(),
                         "# call 1\n\n| step | state |\n| a | b |\n\n")
        shutil.copy(tarball, self.tree / "gpu_studies_rehearsal_20300101T000000Z.tar.gz")
        self.assertEqual(self.run_cmd("collect", "gpu_studies_rehearsal_20300101T000000Z.tar.gz"), 3)
        self.assertIn("is a CPU rehearsal: nothing to collect", self.log)
        with tarfile.open(self.tree / "gpu_studies_20300102T000000Z.tar.gz", "w:gz") as t:
            t.add(self.tree / "bench", arcname="bench")
        self.assertEqual(self.run_cmd("collect", "gpu_studies_20300102T000000Z.tar.gz"), 3)
        self.assertIn("no results/ in", self.log)


if __name__ == "__main__":
    unittest.main()
