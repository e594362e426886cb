#!/usr/bin/env bash
# The one-call GPU check's plumbing (tools/gpu_check.sh, tools/gpu_phases.sh) on a fake stage, so
# the logic that decides what a 15-minute GPU session measures is checked on every commit without
# a GPU or a 15-minute portable build: the stage's executables are small shell scripts that print
# what the real ones print (GoogleTest lines, the step and max-batch result lines) and sleep.
# Checked: phases run in priority order and what does not fit the deadline is cut from the bottom
# (exit 4); the report and the state go to $OUT after every phase; a failing test executable fails
# the call (exit 1) and is reported; --resume runs only the cut phases and keeps the others'
# sections; a state from another commit is refused.
#   tests/tools/gpu_check_test.sh REPO_ROOT
set -uo pipefail
ROOT="$(cd "${1:?repository root}" && pwd)"
T="$(mktemp -d /tmp/gpu_check_test.XXXXXX)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; grep "^gpu_check: " "$T/log" 2>/dev/null | tail -40; exit 1; }

# A tree like the one the device tool sends: the scripts and bench/pytorch_step.py's place.
mkdir -p "$T/tree/tools" "$T/tree/bench" "$T/stage/bin" "$T/stage/lib" "$T/out"
cp "$ROOT"/tools/gpu_check.sh "$ROOT"/tools/gpu_phases.sh "$ROOT"/tools/gpu_env.sh "$ROOT"/tools/gpu_stage.sh "$T/tree/tools/"
# PyTorch's side: a stub that prints the line pytorch_step.py prints and writes its JSON.
cat >"$T/tree/bench/pytorch_step.py" <<'PY'
import json, sys
a = sys.argv
j = a[a.index("--json") + 1]
if "--profile-out" in a:   # the profile phase: a category table and the JSON step_categories.py reads
    open(a[a.index("--profile-out") + 1], "w").write("| category | launches per step | µs per step | share |\n"
                                                     "| --- | ---: | ---: | ---: |\n| convolution | 3 | 90.0 | 90.0% |\n")
    json.dump({"categories_us_per_step": {"convolution": 90.0}}, open(j, "w"))
    sys.exit(0)
json.dump({"images_per_s": 200.0, "steps": 10, "seconds": 2.0, "peak_allocated_bytes": None}, open(j, "w"))
print("pytorch resnet18-small batch 4 32px: 200.0 images/s")
PY

stub() {   # name, body
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$T/stage/bin/$1"
  chmod +x "$T/stage/bin/$1"
}
gtest_ok='for t in A B C; do echo "[ RUN      ] Suite.$t"; sleep ${STUB_SLEEP:-0}; echo "[       OK ] Suite.$t (1 ms)"; done'
stub kernels_cuda "$gtest_ok"
stub optim_cuda "$gtest_ok"
stub nn_cuda 'echo "[ RUN      ] Nn.Move"; echo "[  SKIPPED ] Nn.Move (0 ms)"'
stub e2e_cuda "$gtest_ok"
stub minidl_bench_cuda 'exit 1'
# The step program: sleeps (a slow step run), then prints its line and writes its JSON.
stub minidl_bench_step 'sleep ${STUB_STEP_SLEEP:-0}; j=""; while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && j=$2; shift; done
echo "{\"images_per_s\": 100.0, \"steps\": 5, \"seconds\": 2.0, \"peak_allocated_bytes\": 1048576}" >"$j"
echo "minidl resnet18-small batch 4: 100.0 images/s"'
stub minidl-maxbatch 'echo "maximum batch: 42 after 5 trials"'
echo "abc1234" >"$T/stage/COMMIT"

pack() {
  rm -rf "$T/tree/build-gpu-stage" && mkdir -p "$T/tree/build-gpu-stage"
  tar -C "$T/stage" -cJf "$T/tree/build-gpu-stage/stage.tar.xz" COMMIT bin lib || fail "packing the fake stage"
}
run_check() {   # env assignments..., then -- args
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  rm -rf "$T/out" && mkdir -p "$T/out"
  (cd "$T/tree" && env -i PATH="$PATH" HOME="$T" OUT="$T/out" "${envs[@]}" bash tools/gpu_check.sh --rehearse "$@") >"$T/log" 2>&1
}
report() { cat "$T/out"/gpu_check_*.md; }

# 1. Everything fits: every phase runs, in order; the skipped ones say why; exit 0.
pack
run_check GPU_CHECK_DEADLINE=120 -- build-gpu-stage
rc=$?
[[ $rc == 0 ]] || fail "a call where everything fits exited $rc, not 0"
[[ -f "$T/out/gpu_check_state.tar.gz" && -f "$T/out/gpu_check_logs.tar.gz" ]] || fail "state or logs not in \$OUT"
order="$(grep -oE '^gpu_check: (tests|step|sanitizer|model|profile|bench|maxbatch): at most' "$T/log" | awk '{print $2}' | tr -d ':' | xargs)"
[[ "$order" == "tests step sanitizer model profile bench maxbatch" ]] || fail "phases ran in the order '$order'"
report | grep -q '^| tests | passed |' || fail "the report does not say tests passed"
report | grep -q '9 passed, 0 failed, 1 skipped' || fail "the test counts are wrong"
report | grep -q 'minidl:amp / pytorch:amp: 0.50x' || fail "the step section has no minidl / PyTorch ratio"
report | grep -q '| minidl | 42 |' || fail "the max-batch section lacks minidl's 42"
report | grep -q '^| bench | skipped |' || fail "a rehearsal's benchmarks are not marked skipped"
report | grep -q '^| profile | passed |' || fail "the profile phase did not pass"
report | grep -q '^| convolution | 3 | 90.0 | 90.0% |' || fail "the profile section lacks PyTorch's category table"

# 1a. The category table reads the model phase's first table only (one per configuration and
#     batch: a later one's launches are another step's).
cat >"$T/model.md" <<'MD'
### first
| `cuDNN conv forward` | 1 | 1 | 10.0 | 40.0 | 4.00 |
| **sum of the launches** | | | 10.0 | 40.0 | 4.00 |
### second
| `cuDNN conv forward` | 1 | 1 | 10.0 | 500.0 | 50.00 |
MD
echo '{"categories_us_per_step": {"convolution": 20.0}}' >"$T/profile.json"
python3 "$ROOT/bench/step_categories.py" --minidl "$T/model.md" --pytorch "$T/profile.json" |
  grep -q '^| convolution | 40.0 | 20.0 | 2.00 |' || fail "step_categories.py did not read the first table alone"

# 1b. Step runs with options: each minidl run against PyTorch's of the same precision and batch;
#     the stub sees the options' flags; an unknown option fails its run and names the option.
stub minidl_bench_step 'j=""; while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && j=$2; echo "arg $1"; shift; done
echo "{\"images_per_s\": 150.0, \"steps\": 5, \"seconds\": 2.0, \"peak_allocated_bytes\": 1048576}" >"$j"
echo "minidl resnet18-small batch 4: 150.0 images/s"'
pack
run_check GPU_CHECK_DEADLINE=120 GPU_CHECK_PHASES=step \
  GPU_CHECK_STEP_RUNS="minidl:amp:nhwc:hostscaler:b256 pytorch:amp:b256 minidl:amp:bogus minidl:amp:graphs \
  pytorch:amp pytorch:amp:graphs pytorch:amp:nhwc" -- build-gpu-stage
rc=$?
[[ $rc == 1 ]] || fail "a step run with an unknown option gave exit $rc, not 1"
report | grep -q 'minidl:amp:nhwc:hostscaler:b256 / pytorch:amp:b256: 0.75x' || fail "no ratio against the same batch"
report | grep -q "minidl:amp:bogus | failed (exit 3): unknown option 'bogus'" || fail "the unknown option is not reported"
report | grep -q 'minidl:amp:graphs / pytorch:amp: 0.75x' || fail "a graphed run is not compared with PyTorch's eager one"
report | grep -q 'minidl:amp:graphs / pytorch:amp:graphs: 0.75x' || fail "a graphed run is not compared with PyTorch's graphed one"
report | grep -q 'minidl:amp:nhwc:hostscaler:b256 / pytorch:amp:graphs' && fail "an eager run was compared with a graphed one"
report | grep -q "pytorch:amp:nhwc | failed (exit 3): step run 'pytorch:amp:nhwc': PyTorch takes graphs and bN only" ||
  fail "a minidl-only option on a PyTorch run is not refused"
mkdir -p "$T/logs" && tar -xzf "$T/out/gpu_check_logs.tar.gz" -C "$T/logs" || fail "unpacking the logs"
slog="$(find "$T/logs" -name step_minidl_amp_nhwc_hostscaler_b256.log | head -1)"
[[ -n "$slog" ]] || fail "no log named after the step run"
grep -q 'arg --channels-last' "$slog" && grep -q 'arg --host-scaler' "$slog" ||
  fail "the options' flags did not reach minidl_bench_step"
stub minidl_bench_step 'sleep ${STUB_STEP_SLEEP:-0}; j=""; while [[ $# -gt 0 ]]; do [[ $1 == --json ]] && j=$2; shift; done
echo "{\"images_per_s\": 100.0, \"steps\": 5, \"seconds\": 2.0, \"peak_allocated_bytes\": 1048576}" >"$j"
echo "minidl resnet18-small batch 4: 100.0 images/s"'
pack

# 2. A short deadline: a step run that never ends is stopped at the phase's budget, the phase is
#    cut and the phases below it are not reached; exit 4.
run_check GPU_CHECK_DEADLINE=30 GPU_CHECK_STEP_MIN=5 STUB_STEP_SLEEP=60 -- build-gpu-stage
rc=$?
[[ $rc == 4 ]] || fail "a call cut by its deadline exited $rc, not 4"
report | grep -q '^| step | cut |' || fail "the cut step phase is not reported as cut"
report | grep -qE '^\| maxbatch \| (cut|not run yet) \|' || fail "maxbatch should be cut or not reached"
cp "$T/out/gpu_check_state.tar.gz" "$T/tree/state1.tar.gz"

# 3. The fallback call resumes: only the phases not finished run; one report with both calls.
run_check GPU_CHECK_DEADLINE=120 -- --resume state1.tar.gz build-gpu-stage
rc=$?
[[ $rc == 0 ]] || fail "the resumed call exited $rc, not 0"
grep -q '^gpu_check: tests: done in an earlier call' "$T/log" || fail "the resumed call ran the tests again"
grep -q '^gpu_check: step: at most' "$T/log" || fail "the resumed call did not run the cut step phase"
report | grep -q '^| tests | passed | [0-9]* | 1 |' || fail "the tests row should keep call 1"
report | grep -q '^| step | passed | [0-9]* | 2 |' || fail "the step row should say call 2"
report | grep -q '9 passed, 0 failed, 1 skipped' || fail "the resumed report lost call 1's test section"

# 4. A failing test executable fails the call (exit 1) and the report names the failed test.
stub optim_cuda 'echo "[ RUN      ] Optim.Bad"; echo "x.cpp:3: Failure"; echo "[  FAILED  ] Optim.Bad (2 ms)"; exit 1'
pack
run_check GPU_CHECK_DEADLINE=120 GPU_CHECK_PHASES=tests -- build-gpu-stage
rc=$?
[[ $rc == 1 ]] || fail "a failing test executable gave exit $rc, not 1"
report | grep -q 'Optim.Bad' || fail "the report does not name the failed test"

# 5. A state from another commit's stage is refused (exit 3).
echo "def5678" >"$T/stage/COMMIT"
pack
run_check GPU_CHECK_DEADLINE=60 -- --resume state1.tar.gz build-gpu-stage
rc=$?
[[ $rc == 3 ]] || fail "a state from another commit gave exit $rc, not 3"
grep -q 'holds results of commit abc1234' "$T/log" || fail "the refusal does not name the commits"
echo "gpu_check plumbing: all cases passed"
