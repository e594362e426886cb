#!/usr/bin/env bash
# How OpenMP's wait policy holds up on a busy machine: a fixed number of
# ResNet-18-small training steps, idle and loaded (one busy-loop process per core beside the run),
# under the old spin-waiting policies and the programs' default (passive), REPS times each,
# interleaved. Prints one TSV row per run; lab/results/bench/cpu_threading_*.md holds a table of them.
#   bench/cpu_threading.sh [BIN_DIR] [REPS] [STEPS]
# Policies: active (OMP_WAIT_POLICY=active, spin for minutes), spin (GOMP_SPINCOUNT=300000: libgomp's
# own default when nothing is set, spin ~3 ms then sleep), passive (nothing set: the programs'
# default since core/thread_policy.h, sleep at once).
set -euo pipefail
bin=${1:-build/bin} reps=${2:-3} steps=${3:-8}
cores=$(nproc)
run=("$bin/minidl-train" --model resnet18-small --image-size 32 --batch-size 32 --split 256,0,0 --epochs 1
     --max-steps "$steps" --workers 0 --quiet)
load_pids=()
start_load() {
  for ((k = 0; k < cores; ++k)); do timeout 600 sh -c 'while :; do :; done' & load_pids+=($!); done
  sleep 1
}
stop_load() {
  for p in "${load_pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait "${load_pids[@]}" 2> /dev/null || true
  load_pids=()
}
trap stop_load EXIT
one() {   # policy load rep
  local env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT)
  case $1 in
    active) env+=(OMP_WAIT_POLICY=active) ;;
    spin) env+=(GOMP_SPINCOUNT=300000) ;;
    passive) ;;
  esac
  local la t0 t1
  la=$(cut -d' ' -f1 /proc/loadavg)
  t0=$(date +%s.%N)
  "${env[@]}" "${run[@]}" > /dev/null
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$la"
}
printf 'policy\tload\trep\tseconds\tloadavg_at_start\n'
"${run[@]}" > /dev/null   # a first run: the page cache, the allocator's first touch
for ((r = 1; r <= reps; ++r)); do
  for load in idle loaded; do
    [[ $load == loaded ]] && start_load
    for policy in active spin passive; do one "$policy" "$load" "$r"; done
    [[ $load == loaded ]] && stop_load
  done
done
