#!/usr/bin/env bash
# The experiment programs under mpirun with 2 ranks (ctest distributed.mpi2.programs.*, labels cpu;mpi):
#   parity       2 ranks x batch 8 give the weights of 1 rank x batch 16 (SGD with momentum and
#                --lr-scaling linear, Adam, Adam with augmentation), and 2 x 4 x accumulation 2 as well
#   rank0_output only rank 0 prints and writes: rank 1 is given another --out and --save-weights
#   failing_rank a bad --data on rank 1 ends the job non-zero with one message naming rank and cause;
#                MINIDL_WORLD_SIZE=2 without a launcher stops at once with status 2
#   killed_rank  kill -9 of rank 1 during training ends the job, non-zero, in bounded time
#   resume       a 2-rank run stopped mid-epoch and resumed equals the uninterrupted one bit for bit
#   maxbatch     both ranks agree on each trial: rank 1's smaller budget decides the maximum
#   agreed_stop  a divergence seen on rank 1 alone stops both ranks at the same micro-batch
#   sweep        a 2-rank grid writes <grid>-2ranks/ from rank 0 alone, with world_size,
#                per_device_batch and effective_batch, and the accuracies of the 1-process grid
#   unreadable   a photo folder with random-byte files and truncated images (found only while
#                loading, on one rank's shard), no --validate-data: the ranks agree on what they skip
#                and step together to the end (no hang), and count every skipped file
#   sweep_failing_run  a run of a 2-rank sweep that fails on every rank (out of memory under the
#                budget) writes its row (oom, as in one process) and the sweep goes on to the next
# Usage: programs_test.sh CASE MPIEXEC BIN_DIR COMPARE_TOOL. ctest's TIMEOUT fails a hang.
set -euo pipefail
case_name=$1 mpiexec=$2 bin=$3 compare=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/minidl-dist-programs.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
mpirun2() { "$mpiexec" --oversubscribe --allow-run-as-root --bind-to none "$@"; }
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
# The small CNN (no batch norm, no dropout) on 8x8 synthetic images: 64 training images, 16 per
# evaluation split, 4 steps per epoch at the effective batch 16.
tiny=(--model smallcnn --image-size 8 --split 32,8,8 --synthetic-difficulty 0.2 --workers 0 --progress-every 1)

case $case_name in
parity)
  # The third: through data::Loader with the Keras augmentation (each sample augmented as in one process).
  for opt in "--optimizer sgd --momentum 0.9 --lr 0.05 --lr-scaling linear --base-batch 8" "--optimizer adam" \
             "--optimizer adam --augment keras"; do
    read -r -a o <<< "$opt"
    "$bin/minidl-train" "${tiny[@]}" "${o[@]}" --epochs 2 --batch-size 16 --save-weights one.safetensors > one.log
    mpirun2 -np 2 "$bin/minidl-train" "${tiny[@]}" "${o[@]}" --epochs 2 --batch-size 8 --save-weights two.safetensors > two.log
    mpirun2 -np 2 "$bin/minidl-train" "${tiny[@]}" "${o[@]}" --epochs 2 --batch-size 4 --accumulation-steps 2 \
      --save-weights acc.safetensors > acc.log
    grep -q "2 ranks x batch 8 per device x 1 accumulation = effective batch 16" two.log || fail "startup line: $(head -1 two.log)"
    # The learning rate is scaled on the effective batch (16 / 8 x 0.05 = 0.1 with linear scaling).
    lr1=$(grep -o " lr [0-9.e-]*" one.log | head -1) lr2=$(grep -o " lr [0-9.e-]*" two.log | head -1)
    [[ $lr1 == "$lr2" ]] || fail "$opt: lr$lr1 on 1 rank, lr$lr2 on 2 ranks"
    # Validation and test accuracy are of the whole sets (counts summed), so they agree too.
    [[ $(grep -o "test acc [0-9.]*%" one.log) == "$(grep -o "test acc [0-9.]*%" two.log)" ]] || fail "$opt: test accuracy differs"
    "$compare" one.safetensors two.safetensors 1e-5 || fail "$opt: 2 ranks x 8 differ from 1 rank x 16"
    "$compare" one.safetensors acc.safetensors 1e-5 || fail "$opt: 2 ranks x 4 x 2 differ from 1 rank x 16"
  done
  ;;
rank0_output)
  mpirun2 -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 2 --batch-size 8 --out r0 --save-weights r0.safetensors : \
          -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 2 --batch-size 8 --out r1 --save-weights r1.safetensors > out.log
  [[ -f r0/metrics.csv && -f r0/results.json && -f r0.safetensors ]] || fail "rank 0 wrote no results"
  [[ ! -e r1 && ! -e r1.safetensors && ! -e r1.safetensors.optimizer.safetensors ]] || fail "rank 1 wrote files"
  [[ $(grep -c "^epoch 2/2 done" out.log) == 1 ]] || fail "epoch lines printed $(grep -c "^epoch 2/2 done" out.log) times"
  [[ $(grep -c "^epoch 1 step 1/8 " out.log) == 1 ]] || fail "progress lines not from rank 0 alone"
  grep -q '"world_size": 2' r0/results.json || fail "results.json does not record world_size 2"
  grep -q '"effective_batch": 16' r0/results.json || fail "results.json's effective batch is not 16"
  ;;
failing_rank)
  start=$SECONDS
  rc=0
  mpirun2 -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 50 --batch-size 8 : \
          -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 50 --batch-size 8 --data /nonexistent/catsdogs \
          > out.log 2> err.log || rc=$?
  cat err.log
  (( rc != 0 )) || fail "the job exited 0 with a failing rank"
  grep -q "minidl: rank 1 of 2 failed: minidl-train: error: --data '/nonexistent/catsdogs': no such folder" err.log ||
    fail "stderr does not name rank 1 and the cause"
  [[ $(grep -c "failed:" err.log) == 1 ]] || fail "more than one failure message"
  (( SECONDS - start < 30 )) || fail "the job took $((SECONDS - start)) s to end"  # MINIDL_WORLD_SIZE on a process that no launcher started: a usage error at once, not a hang.
  rc=0
  MINIDL_RANK=0 MINIDL_WORLD_SIZE=2 "$bin/minidl-train" "${tiny[@]}" --epochs 1 > single.log 2> single.err || rc=$?
  (( rc == 2 )) && grep -q "minidl-train: error: dist: .* MPI started this process as rank 0 of 1" single.err ||
    fail "MINIDL_WORLD_SIZE=2 without mpirun: status $rc: $(cat single.err)"
  ;;
killed_rank)
  # Rank 1 records its process id, then becomes minidl-train; it is killed once rank 0 trains.
  mpirun2 -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 100000 --batch-size 8 : \
          -np 1 sh -c 'echo $$ > rank1.pid; exec "$0" "$@"' "$bin/minidl-train" "${tiny[@]}" --epochs 100000 --batch-size 8 \
          > out.log 2> err.log &
  job=$!
  for _ in $(seq 600); do
    [[ -s rank1.pid ]] && grep -q "^epoch 2 step" out.log && break
    sleep 0.1
  done
  [[ -s rank1.pid ]] && grep -q "^epoch 2 step" out.log || { kill "$job"; fail "the job did not start training"; }
  kill -9 "$(cat rank1.pid)"
  killed=$SECONDS
  rc=0
  for _ in $(seq 300); do
    kill -0 "$job" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$job" 2> /dev/null; then kill -9 "$job"; fail "the job still runs 30 s after rank 1 was killed"; fi
  wait "$job" || rc=$?
  echo "the job ended $((SECONDS - killed)) s after the kill, status $rc"
  (( rc != 0 )) || fail "the job exited 0 after a rank was killed"
  ;;
resume)
  # Mixed precision with a short growth interval: the loss scale moves, so a lost scaler state shows.
  args=("${tiny[@]}" --optimizer sgd --momentum 0.9 --warmup-steps 3 --epochs 3 --batch-size 8 --amp --amp-growth-interval 3)
  mpirun2 -np 2 "$bin/minidl-train" "${args[@]}" --save-weights full.safetensors > full.log
  # Stopped after 6 of the 12 steps (in the middle of epoch 2), then resumed to the end.
  mpirun2 -np 2 "$bin/minidl-train" "${args[@]}" --max-steps 6 --save-weights part.safetensors > part.log
  mpirun2 -np 2 "$bin/minidl-train" "${args[@]}" --resume part.safetensors --save-weights resumed.safetensors > resumed.log
  "$compare" full.safetensors resumed.safetensors 0 || fail "the resumed weights differ from the uninterrupted run"
  "$compare" full.safetensors.optimizer.safetensors resumed.safetensors.optimizer.safetensors 0 ||
    fail "the resumed optimizer state differs"
  # The partial epoch's shards depend on the world size: one process refuses to resume it.
  rc=0
  "$bin/minidl-train" "${args[@]}" --resume part.safetensors > one.log 2> one.err || rc=$?
  (( rc == 2 )) && grep -q "stopped inside epoch 2 on 2 rank(s)" one.err || fail "a 1-rank resume of a 2-rank partial epoch: status $rc: $(cat one.err)"
  ;;
maxbatch)
  # CPU budgets: rank 1's is smaller, so the agreed maximum must be the one rank 1 alone finds.
  mb=(--model smallcnn --image-size 32 --steps 1 --probe-small 2 --probe-large 6)
  mpirun2 -np 2 "$bin/minidl-maxbatch" "${mb[@]}" --memory-budget 48MiB --out small > small.log
  mpirun2 -np 2 "$bin/minidl-maxbatch" "${mb[@]}" --memory-budget 96MiB --out large > large.log
  mpirun2 -np 1 "$bin/minidl-maxbatch" "${mb[@]}" --memory-budget 96MiB --out mixed : \
          -np 1 "$bin/minidl-maxbatch" "${mb[@]}" --memory-budget 48MiB --out mixed1 > mixed.log
  max_of() { grep -o '"max_batch": [0-9]*' "$1/maxbatch.json" | grep -o '[0-9]*$'; }
  small=$(max_of small) large=$(max_of large) mixed=$(max_of mixed)
  echo "maximum batch: 48 MiB on both $small, 96 MiB on both $large, 96 MiB on rank 0 and 48 MiB on rank 1 $mixed"
  (( small < large )) || fail "the larger budget does not allow a larger batch ($small vs $large)"
  [[ $mixed == "$small" ]] || fail "the ranks did not agree on rank 1's OOMs: $mixed, not $small"
  [[ ! -e mixed1 ]] || fail "rank 1 wrote maxbatch.json"
  grep -q "2 ranks" mixed.log || fail "the report does not say it ran on 2 ranks"
  ;;
agreed_stop)
  # Only rank 1 sees its loss above --diverge-loss: both ranks stop at the same micro-batch (no
  # rank left in the next step's allreduce), the job ends with the diverged status on both.
  rc=0
  mpirun2 -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 3 --batch-size 8 --out r0 : \
          -np 1 "$bin/minidl-train" "${tiny[@]}" --epochs 3 --batch-size 8 --diverge-loss 0.01 > out.log 2> err.log || rc=$?
  cat out.log
  (( rc == 1 )) || fail "status $rc, not 1 (diverged)"
  grep -q "smallcnn: diverged (another rank's training loss was NaN or above --diverge-loss at step 0)" out.log ||
    fail "rank 0 does not report the divergence of rank 1"
  grep -q '"status": "diverged"' r0/results.json || fail "results.json does not say diverged"
  ;;
sweep)
  grid=("${tiny[@]}" --epochs 2 --batch-sizes 16,32 --optimizers sgd,adam --quiet)
  "$bin/minidl-sweep" "${grid[@]}" --out one > one.log
  mpirun2 -np 1 "$bin/minidl-sweep" "${grid[@]}" --out two : -np 1 "$bin/minidl-sweep" "${grid[@]}" --out other > two.log
  [[ ! -e other ]] || fail "rank 1 wrote a results folder"
  one_dir=$(dirname one/*/results.csv) two_dir=$(dirname two/*/results.csv)
  [[ $two_dir == "two/$(basename "$one_dir")-2ranks" ]] || fail "the 2-rank folder is $two_dir (1 rank: $one_dir)"
  [[ -f $two_dir/summary.md && -f $two_dir/results.json ]] || fail "no summary.md / results.json from rank 0"
  col() {  # col FILE RUN_ID_PREFIX COLUMN: the column of the first row whose id starts with the prefix
    python3 -c 'import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["run_id"].startswith(sys.argv[2])]
print(rows[0][sys.argv[3]] if rows else "")' "$@"
  }
  for id in b16-sgd b32-sgd b16-adam b32-adam; do
    b=$(col "$one_dir/results.csv" "$id" batch_size)
    [[ $(col "$two_dir/results.csv" "$id" world_size) == 2 ]] || fail "$id: world_size is not 2"
    [[ $(col "$two_dir/results.csv" "$id" per_device_batch) == $((b / 2)) ]] || fail "$id: per_device_batch is not $((b / 2))"
    [[ $(col "$two_dir/results.csv" "$id" effective_batch) == "$b" ]] || fail "$id: effective_batch is not $b"
    [[ $(col "$one_dir/results.csv" "$id" world_size) == 1 ]] || fail "$id: the 1-process row's world_size is not 1"
    a1=$(col "$one_dir/results.csv" "$id" test_acc) a2=$(col "$two_dir/results.csv" "$id" test_acc)
    [[ $a1 == "$a2" ]] || fail "$id: test accuracy $a1 on 1 rank, $a2 on 2"
  done
  ;;
unreadable)
  # 8x8 PPM images (header, then noise; the content does not matter here), random bytes named
  # .jpg (the header scan drops them), and a JPEG cut inside its pixel data (its header is whole:
  # only the loader finds it, on whichever rank's shard holds it).
  ppm() { { printf 'P6\n8 8\n255\n'; head -c 192 /dev/urandom; } > "$1"; }
  cut() { head -c 650 "$here/../../fuzz/corpus/decode/rgb444.jpg" > "$1"; }
  for class in cat dog; do
    mkdir -p photos/$class
    for i in 1 2 3 4 5; do ppm photos/$class/$i.ppm; done
    head -c 3000 /dev/urandom | tr '\377' x > photos/$class/random.jpg
  done
  cut photos/cat/cut1.jpg; cut photos/cat/cut2.jpg; rm photos/cat/5.ppm
  cut photos/dog/cut1.jpg
  head -c 3000 /dev/urandom | tr '\377' x > photos/dog/random2.jpg
  # 12 usable by their headers (6 per class), all in training; 6 per rank, batches of 2.
  rc=0
  timeout 100 "$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -np 2 "$bin/minidl-train" --data photos \
    --model smallcnn --image-size 8 --split 6,0,0 --batch-size 2 --epochs 3 --workers 0 > out.log 2> err.log || rc=$?
  cat out.log err.log
  (( rc != 124 )) || fail "the job hung"
  (( rc == 0 )) || fail "status $rc"
  grep -q "(12 usable images, 3 unreadable files skipped)" out.log || fail "the header does not count the 3 random files"
  grep -q "s; 6 unreadable files skipped$" out.log || fail "the summary does not count all 6 unreadable files"
  [[ $(grep -c "^epoch [0-9]/3 done" out.log) == 3 ]] || fail "not every epoch ended"
  ;;
sweep_failing_run)
  # Batch 256 does not fit the budget, batch 32 does: the 256 row says oom on 1 and 2 ranks (each
  # rank trains the batch, all of its shard's 256 images on 2 ranks; a batch larger than the shard
  # would be refused), and the sweep goes on to batch 32 (listed after it).
  grid=(--model smallcnn --image-size 8 --split 256,4,4 --synthetic-difficulty 0.2 --workers 0 --epochs 1 --quiet
        --memory-budget 2MiB --batch-sizes 256,32 --optimizers sgd)
  "$bin/minidl-sweep" "${grid[@]}" --out one > one.log
  rc=0
  mpirun2 -np 2 "$bin/minidl-sweep" "${grid[@]}" --rank-batch each --out two > two.log 2> two.err || rc=$?
  cat two.log two.err
  (( rc == 0 )) || fail "status $rc: the failing run ended the job"
  for d in one/*/ two/*/; do
    st=$(python3 -c 'import csv, sys
print(",".join(r["status"] for r in csv.DictReader(open(sys.argv[1]))))' "$d/results.csv")
    [[ $st == "oom,ok" ]] || fail "$d: statuses $st, not oom,ok"
  done
  grep -q "2 runs done now" two.log || fail "the sweep did not finish"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS ($case_name)"
