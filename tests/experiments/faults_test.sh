#!/usr/bin/env bash
# Issue 30's fault matrix (ctest experiments.faults.*): each fault leaves the previous checkpoint or
# results file byte for byte as it was and ends with one clear line.
#   save_weights_kill  kill -9 in the middle of writing --save-weights (the weights file, then the
#                      optimizer file): the old files stay; a pair cut between the two is refused;
#                      the next save of each file removes the killed writer's temporary file
#   results_kill       kill -9 in the middle of writing the sweep's results.csv and runs.jsonl: the
#                      old tables stay and the rerun completes them
#   full_disk          ENOSPC in the middle of --save-weights, and a real file-size limit (ulimit -f,
#                      which needs no privileges and binds root too): a clear line, status 1
#   readonly_out       a read-only --out (chmod; as root, who ignores permissions, the test-only
#                      fault of core/atomic_file.cpp) and an --out below a regular file: status 2
#                      before any training, for minidl-train and minidl-sweep
#   sigterm            SIGTERM stops like SIGINT: status 130, weights and results written, the note
#                      names SIGTERM
# The kill and full-disk faults are placed by MINIDL_TEST_WRITE_FAULT=<kill|full|readonly>:<path
# text> (core/atomic_file.cpp): the one atomic writer stores half of its first write, then gets
# SIGKILL or fails with ENOSPC, so the fault lands mid-write every time.
# Usage: faults_test.sh CASE BIN_DIR. ctest's TIMEOUT fails a hang.
set -euo pipefail
case_name=$1 bin=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/minidl-faults.XXXXXX")
trap 'chmod -R u+w "$work" 2> /dev/null; rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
same() { cmp -s "$1" "$2" || fail "$3: $1 changed"; }
# The small CNN on 8x8 synthetic images: a run takes well under a second.
tiny=(--model smallcnn --image-size 8 --split 16,8,8 --synthetic-difficulty 0.2 --workers 0 --batch-size 8)
status_of() { local rc=0; "$@" > out.log 2> err.log || rc=$?; echo "$rc"; }

case $case_name in
save_weights_kill)
  "$bin/minidl-train" "${tiny[@]}" --epochs 1 --save-weights w.safetensors > first.log
  cp w.safetensors w.before && cp w.safetensors.optimizer.safetensors o.before
  rc=$(MINIDL_TEST_WRITE_FAULT=kill:w.safetensors status_of "$bin/minidl-train" "${tiny[@]}" --epochs 2 --save-weights w.safetensors)
  [[ $rc == 137 ]] || fail "the writer was not killed (status $rc): $(cat err.log)"
  same w.safetensors w.before "kill -9 while writing the weights"
  same w.safetensors.optimizer.safetensors o.before "kill -9 while writing the weights"
  compgen -G "w.safetensors.tmp.*" > /dev/null || fail "the killed writer left no temporary file: $(ls)"
  # Killed between the two files: new weights, old optimizer state. Resuming refuses the pair.
  rc=$(MINIDL_TEST_WRITE_FAULT=kill:w.safetensors.optimizer status_of "$bin/minidl-train" "${tiny[@]}" --epochs 2 --save-weights w.safetensors)
  [[ $rc == 137 ]] || fail "the optimizer writer was not killed (status $rc)"
  same w.safetensors.optimizer.safetensors o.before "kill -9 while writing the optimizer state"
  # Its weights were saved: the first killed writer's temporary file went then; its own stays.
  ! compgen -G "w.safetensors.tmp.*" > /dev/null || fail "the next save left a stale temporary file: $(ls)"
  compgen -G "w.safetensors.optimizer.safetensors.tmp.*" > /dev/null || fail "no temporary file: $(ls)"
  rc=$(status_of "$bin/minidl-train" "${tiny[@]}" --epochs 3 --resume w.safetensors)
  (( rc == 2 )) && grep -q "are from different saves (steps 8 and 4): the save was cut short" err.log ||
    fail "a torn pair was not refused: status $rc: $(cat err.log)"
  # The intact pair resumes.
  cp w.before w.safetensors
  rc=$(status_of "$bin/minidl-train" "${tiny[@]}" --epochs 2 --resume w.safetensors)
  (( rc == 0 )) || fail "the kept checkpoint does not resume: $(cat err.log)"
  # The next save of the optimizer state removes the second killed writer's file.
  "$bin/minidl-train" "${tiny[@]}" --epochs 1 --save-weights w.safetensors > again.log
  ! compgen -G "w.safetensors*.tmp.*" > /dev/null || fail "stale temporary files stayed: $(ls)"
  ;;
results_kill)
  grid=("${tiny[@]}" --epochs 1 --optimizers sgd --quiet --out res)
  "$bin/minidl-sweep" "${grid[@]}" --batch-sizes 8 > first.log
  dir=$(dirname res/*/results.csv)
  cp "$dir/results.csv" csv.before && cp "$dir/runs.jsonl" jsonl.before
  for file in runs.jsonl results.csv; do
    rc=$(MINIDL_TEST_WRITE_FAULT=kill:$file status_of "$bin/minidl-sweep" "${grid[@]}" --batch-sizes 8,16)
    [[ $rc == 137 ]] || fail "the sweep was not killed while writing $file (status $rc): $(cat err.log)"
    same "$dir/results.csv" csv.before "kill -9 while writing $file"
    [[ $file == results.csv ]] || same "$dir/runs.jsonl" jsonl.before "kill -9 while writing $file"
  done
  "$bin/minidl-sweep" "${grid[@]}" --batch-sizes 8,16 > rerun.log
  grep -q "1 runs done now, 1 already done" rerun.log || fail "the rerun did not finish the table: $(cat rerun.log)"
  [[ $(grep -c '^b' "$dir/results.csv") == 2 ]] || fail "results.csv: $(cat "$dir/results.csv")"
  ;;
full_disk)
  "$bin/minidl-train" "${tiny[@]}" --epochs 1 --save-weights w.safetensors > first.log
  cp w.safetensors w.before
  rc=$(MINIDL_TEST_WRITE_FAULT=full:w.safetensors status_of "$bin/minidl-train" "${tiny[@]}" --epochs 2 --save-weights w.safetensors)
  (( rc == 1 )) || fail "status $rc with a full disk: $(cat err.log)"
  grep -q "^minidl-train: error: cannot write '$work/w.safetensors': No space left on device (the previous file is unchanged)$" err.log ||
    grep -q "^minidl-train: error: cannot write 'w.safetensors': No space left on device (the previous file is unchanged)$" err.log ||
    fail "unclear message: $(cat err.log)"
  same w.safetensors w.before "a full disk"
  ls w.safetensors.tmp.* > /dev/null 2>&1 && fail "a temporary file was left behind"
  # A real limit: 64 KiB per file (the weights are about 270 KiB).
  rc=$( (ulimit -f 64; status_of "$bin/minidl-train" "${tiny[@]}" --epochs 2 --save-weights w.safetensors) )
  (( rc == 1 )) && grep -q "cannot write 'w.safetensors': File too large (the previous file is unchanged)" err.log ||
    fail "ulimit -f: status $rc: $(cat err.log)"
  same w.safetensors w.before "a file-size limit"
  ;;
readonly_out)
  mkdir ro
  echo "done" > ro/results.json
  chmod a-w ro
  fault=()
  # Root writes into a read-only folder anyway: the writer's test-only fault stands in for it.
  [[ $(id -u) == 0 ]] && fault=(env MINIDL_TEST_WRITE_FAULT=readonly:"$work/ro/")
  rc=$(status_of "${fault[@]}" "$bin/minidl-train" "${tiny[@]}" --epochs 1 --out "$work/ro")
  (( rc == 2 )) && grep -q "^minidl-train: error: --out $work/ro/results.json: cannot create '$work/ro/results.json': \(Read-only file system\|Permission denied\) (the previous file is unchanged); give a path in a writable folder$" err.log ||
    fail "read-only --out: status $rc: $(cat err.log)"
  grep -q "^epoch" out.log && fail "it trained before finding out"
  [[ $(cat ro/results.json) == done ]] || fail "ro/results.json changed"
  rc=$(status_of "${fault[@]}" "$bin/minidl-sweep" "${tiny[@]}" --epochs 1 --quiet --out "$work/ro")
  (( rc == 2 )) && grep -q "^minidl-sweep: error: --out .*results.csv: cannot create" err.log ||
    fail "read-only sweep --out: status $rc: $(cat err.log)"
  # A folder that cannot exist: its parent is a file (no permission matters, root included).
  touch plain
  rc=$(status_of "$bin/minidl-train" "${tiny[@]}" --epochs 1 --out plain/out)
  (( rc == 2 )) && grep -q "^minidl-train: error: --out plain/out/results.json: cannot create the folder 'plain/out': Not a directory" err.log ||
    fail "--out below a file: status $rc: $(cat err.log)"
  ;;
sigterm)
  "$bin/minidl-train" "${tiny[@]}" --epochs 100000 --progress-every 1 --save-weights w.safetensors --out o > out.log 2> err.log &
  job=$!
  for _ in $(seq 300); do
    grep -q "^epoch 2 step" out.log 2> /dev/null && break   # (out.log may not exist yet)
    sleep 0.1
  done
  grep -q "^epoch 2 step" out.log || { kill -9 "$job"; fail "it did not start training"; }
  kill -TERM "$job"
  rc=0
  wait "$job" || rc=$?
  (( rc == 130 )) || fail "status $rc after SIGTERM: $(tail -3 err.log)"
  # The signal lands inside an epoch ("at step N") or, as often on a fast run, between two ("before epoch N").
  grep -qE "^smallcnn: interrupted \(SIGTERM (at step|before epoch) [0-9]+\)" out.log || fail "the summary: $(tail -3 out.log)"
  grep -q '"status": "interrupted"' o/results.json || fail "results.json was not written"
  [[ -s w.safetensors && -s w.safetensors.optimizer.safetensors ]] || fail "the weights were not saved"
  rc=$(status_of "$bin/minidl-train" "${tiny[@]}" --epochs 3 --resume w.safetensors)
  (( rc == 0 )) || fail "the SIGTERM checkpoint does not resume: $(cat err.log)"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS ($case_name)"
