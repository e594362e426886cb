#!/usr/bin/env bash
# One minidl_bench_step configuration in several fresh processes under each of several
# environments, interleaved, on the GPU machine: the spread between processes (cuDNN's autotuning
# picks its algorithms anew in each) beside the difference a setting makes. gpu_check's step phase
# runs each configuration once, so it cannot tell a setting's effect from one process's luck.
#
#   tools/gpu_repeat.sh DIR ROUNDS ENV... -- BENCH_ARGS...
#     DIR         the check stage (tools/gpu_check.sh --stage; default build-gpu-stage)
#     ROUNDS      processes per environment
#     ENV         "NAME=VALUE ..." for one environment ("-" for none)
#     BENCH_ARGS  minidl_bench_step's arguments
#   e.g. tools/gpu_repeat.sh build-gpu-stage 3 MINIDL_CUDNN_FIND_TRIALS=1 MINIDL_CUDNN_FIND_TRIALS=2 -- \
#          --device cuda --model resnet50 --image-size 224 --batch 128 --precision amp --channels-last \
#          --cuda-graphs --warmup 15 --seconds 5
# Writes $OUT/gpu_repeat.md (rewritten after every process; default OUT=.gpu-results) and prints it.
# Exit status: 0 every process ran, 1 one failed, 3 setup.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_ENV_PROG=gpu_repeat
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"

[[ $# -ge 4 ]] || die 3 "usage: tools/gpu_repeat.sh DIR ROUNDS ENV... -- BENCH_ARGS... (see the header)"
DIR=$1 ROUNDS=$2; shift 2
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die 3 "ROUNDS must be a positive number, got '$ROUNDS'"
ENVS=()
while [[ $# -gt 0 && $1 != -- ]]; do ENVS+=("$1"); shift; done
[[ ${1:-} == -- && ${#ENVS[@]} -gt 0 ]] || die 3 "give at least one ENV, then -- and minidl_bench_step's arguments"
shift
[[ -f "$DIR/stage.tar.xz" ]] || die 3 "$DIR/stage.tar.xz not found: stage it with 'tools/gpu_check.sh --stage' and carry $DIR"
OUT="${OUT:-$ROOT/.gpu-results}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/gpu_repeat.XXXXXX)"
gpu_env_unpack "$DIR/stage.tar.xz" "$WORK" || die 3 "cannot unpack $DIR/stage.tar.xz"
gpu_env_lib_path "$WORK/lib"
COMMIT="$(head -1 "$WORK/COMMIT" 2>/dev/null || echo unknown)"

REPORT="$OUT/gpu_repeat.md"
rows=""
failed=0
write() {
  {
    echo "# minidl_bench_step in fresh processes, $(date -u +%Y-%m-%d) (commit $COMMIT)"
    echo
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
    echo "- arguments: \`$*\`; $ROUNDS processes per environment, interleaved"
    echo
    echo "| round | environment | images/s | line |"
    echo "| ---: | --- | ---: | --- |"
    printf '%s' "$rows"
  } >"$REPORT"
}
for ((r = 1; r <= ROUNDS; ++r)); do
  for e in "${ENVS[@]}"; do
    log="$WORK/run.log"
    envs=()
    [[ $e != - ]] && read -r -a envs <<<"$e"
    env ${envs[@]+"${envs[@]}"} "$WORK/bin/minidl_bench_step" "$@" >"$log" 2>&1
    rc=$?
    line="$(grep -m1 'images/s' "$log" | tr '|' '/')"
    ips="$(grep -m1 -oE '[0-9.]+ images/s' "$log" | awk '{print $1}')"
    [[ $rc == 0 && -n $ips ]] || { failed=1; line="exit $rc: $(tail -2 "$log" | tr '|\n' '/ ' | cut -c1-200)"; }
    rows+="| $r | \`$e\` | ${ips:--} | ${line:0:240} |"$'\n'
    write "$@"
    say "round $r, $e: ${ips:-failed}"
  done
done
cat "$REPORT"
exit $failed
