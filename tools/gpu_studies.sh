#!/usr/bin/env bash
# The experiment studies on a GPU machine reached through the device tool: every call lasts at most
# 600 s and starts bare, so this runs one step of a plan under a wall-clock deadline (SIGINT to the
# sweep at its deadline: it stops at a step boundary and writes what it has), resumes the studies
# from an earlier call's tarball, and packs everything into ONE tarball in $OUT with a short
# summary printed last (the tool returns only the output's tail).
#
#   tools/gpu_studies.sh [--rehearse] PLAN       on the GPU machine (the device tool)
#   tools/gpu_studies.sh --collect TARBALL [DEST] afterwards, here: copies each study of the newest
#                                                tarball into DEST (default lab/results/experiments) as
#                                                <study>-photos-cuda/ (utilization-cuda/,
#                                                utilization-amp-cuda/) with
#                                                gpu_calls.md (every call's provenance), then --plot
#   tools/gpu_studies.sh --plot DIR...           on a machine with gnuplot: draws each DIR/*.png.dat
#                                                and links it from DIR/summary.md
#   PLAN   comma-separated steps, run in this order, each optionally capped as STEP:SECONDS:
#          keras-batch, utilization, techniques, lr-scaling, batch-schedule
#                    build-gpu-studies' minidl-sweep --study STEP --device cuda --workers N
#                    --process-per-run --out results (--data .data/catsdogs except for utilization:
#                    synthetic images); a crashed run becomes a `crashed` row, the study goes on
#          utilization-amp   minidl-sweep --study utilization --amp (synthetic images): the row
#                    to read beside PyTorch's --best (folder results/utilization-amp)
#          pytorch   the PyTorch baseline of the utilization study: bench/pytorch_utilization.py in
#                    f32, then with --best (AMP, channels_last, cudnn.benchmark, fused SGD), each
#                    compared with minidl's table by bench/compare_utilization.py --steady --busy (skipped with a note while those scripts are not in
#                    the tree); --best is also compared with utilization-amp's table when there is
#                    one. Runs after the last utilization step by itself (capped at 150 s) unless listed.
#          e.g. tools/gpu_studies.sh utilization:170,keras-batch:200,techniques
#   --rehearse   no GPU needed: the same plumbing with --device cpu --quick on the staged photos,
#                a 20 s deadline and PyTorch on the CPU; checks a stage and this script, not results.
#
# Environment (each defaults in brackets; --rehearse values after the slash):
#   GPU_STUDIES_DEADLINE [540/20]  seconds from start until the tarball is packed; each step gets at
#                                  most what is left minus the grace and the packing reserve
#   GPU_STUDIES_GRACE    [60/8]    seconds between a sweep's SIGINT and SIGKILL (the sweep stops
#                                  after the current max-batch trial or optimizer step, evaluates the
#                                  cut run, which it then drops, and rewrites its outputs)
#   GPU_STUDIES_DATA     [.data/catsdogs]     the photos (tools/gpu_check.sh --stage copies them)
#   GPU_STUDIES_STAGE    [build-gpu-studies]  holds studies.tar.xz (tools/gpu_check.sh --stage)
#   GPU_STUDIES_PREVIOUS [.gpu-results]       earlier calls: every gpu_studies_2*.tar.gz in it is
#                                  unpacked in name order (each holds all results so far, so the newest
#                                  is enough), then a results/ folder in it is copied over; the sweeps
#                                  skip the runs those results.csv files hold (a rehearsal restores
#                                  and writes gpu_studies_rehearsal_*.tar.gz only)
#   GPU_STUDIES_WORKERS  [cores-2, at least 2]  loader threads (results do not depend on it)
#   GPU_STUDIES_EXTRA    []        more minidl-sweep flags; give the same in every call of a study
#                                  (a resumed sweep matches runs by id only)
#   OUT                            the device tool's folder; without it the tarball goes to .gpu-results/
# Output: results/<study>/ (results.csv, runs.jsonl, results.json, summary.md, <study>.png.dat;
# utilization also pytorch-*.csv and compare-*.md) and results/gpu_studies/<stamp>/ (provenance.md:
# nvidia-smi, driver, libraries, the command, the staged commit; summary.md; one log per step), all
# in $OUT/gpu_studies_<stamp>.tar.gz, and $OUT/gpu_studies_summary.md. A SIGTERM (the tool's own
# limit) gives the running sweep SIGINT and at most 20 s, then packs.
# Exit status: 0 every step finished, 1 a step failed, 2 no usable GPU, 3 setup problem (stage,
# libraries, photos, plan), 4 nothing failed but a step was cut or not started: run the same PLAN
# again with this call's tarball in .gpu-results to resume.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3
GPU_ENV_PROG=gpu_studies
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"

# ---------------------------------------------------------------- --plot, --collect (on the build machine)
plot_dirs() {
  command -v gnuplot >/dev/null 2>&1 || die 3 "gnuplot is not installed here (apt-get install gnuplot-nox), then: tools/gpu_studies.sh --plot $*"
  local d f png ylab found
  for d in "$@"; do
    found=0
    for f in "$d"/*.png.dat; do
      [[ -f "$f" ]] || continue
      found=1; png="${f%.dat}"
      gnuplot -e "datafile='$f'; outfile='$png'; $(sed -n 's/^# plot: //p' "$f")" "$ROOT/tools/plot_results.gnuplot" \
        || die 1 "gnuplot failed on $f"
      # The line minidl-sweep writes where gnuplot exists replaces its "No plot: ..." line.
      ylab="$(sed -n "s/^# plot: .*ylab='\([^']*\)'.*/\1/p" "$f")"
      # Only the line that names this data file: a study with several plots has one line each.
      [[ -f "$d/summary.md" ]] && sed -i "s|^No plot: .*$(basename "$f").*|![${ylab}]($(basename "$png"))|" "$d/summary.md"
      say "drew $png"
    done
    [[ $found == 1 ]] || say "no *.png.dat in $d: nothing to draw"
  done
}
if [[ "${1:-}" == "--plot" ]]; then
  shift
  [[ $# -gt 0 ]] || die 3 "--plot needs result folders, e.g. tools/gpu_studies.sh --plot lab/results/experiments/keras-batch-photos-cuda"
  plot_dirs "$@"
  exit 0
fi
if [[ "${1:-}" == "--collect" ]]; then
  tarball="${2:-}"; dest="${3:-lab/results/experiments}"
  [[ -f "$tarball" ]] || die 3 "--collect needs the newest gpu_studies_<stamp>.tar.gz a call returned (it holds every call's results)"
  [[ "$(basename "$tarball")" != gpu_studies_rehearsal_* ]] || die 3 "$tarball is a CPU rehearsal: nothing to collect"
  tmp="$(mktemp -d /tmp/gpu_collect.XXXXXX)"
  tar -C "$tmp" -xzf "$tarball" results || die 3 "cannot unpack $tarball"
  collected=()
  for d in "$tmp"/results/*/; do
    study="$(basename "$d")"
    case "$study" in
      gpu_studies|*-quick-*) continue ;;
      utilization|utilization-amp) target="$dest/$study-cuda" ;;   # synthetic images
      *) target="$dest/$study-photos-cuda" ;;
    esac
    mkdir -p "$target" || die 3 "cannot create $target"
    find "$d" -maxdepth 1 -type f -exec cp -t "$target" {} + || die 3 "copying $d failed"
    # Every call that worked on the studies: its provenance (nvidia-smi, driver, libraries, command,
    # staged commit) and its step table.
    for c in "$tmp"/results/gpu_studies/*/; do
      cat "$c/provenance.md"; echo; sed -n '/^| step/,/^$/p' "$c/summary.md"; echo
    done >"$target/gpu_calls.md"
    say "collected $study into $target"
    collected+=("$target")
  done
  [[ ${#collected[@]} -gt 0 ]] || die 3 "no study results in $tarball"
  if command -v gnuplot >/dev/null 2>&1; then plot_dirs "${collected[@]}"
  else say "no gnuplot here: apt-get install gnuplot-nox, then tools/gpu_studies.sh --plot ${collected[*]}"; fi
  exit 0
fi

REHEARSE=0
PLAN=""
COMMAND="tools/gpu_studies.sh $*"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rehearse) REHEARSE=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) die 3 "unknown option '$1' (see --help)" ;;
    *) [[ -z "$PLAN" ]] || die 3 "one PLAN only, e.g. utilization:170,keras-batch:200,techniques (got '$PLAN' and '$1')"
       PLAN="$1"; shift ;;
  esac
done
[[ -n "$PLAN" ]] || die 3 "no PLAN: e.g. tools/gpu_studies.sh utilization:170,keras-batch:200,techniques (see --help)"

r() { [[ $REHEARSE == 1 ]] && echo "$2" || echo "$1"; }   # the GPU value or the rehearsal one
DEADLINE="${GPU_STUDIES_DEADLINE:-$(r 540 20)}"
GRACE="${GPU_STUDIES_GRACE:-$(r 60 8)}"
PACK_RESERVE=$(r 15 2)   # packing and the summary after the last step
MIN_STEP=$(r 30 2)       # a step with less time than this is not started
DATA="${GPU_STUDIES_DATA:-.data/catsdogs}"
STAGE="${GPU_STUDIES_STAGE:-build-gpu-studies}"
PREV="${GPU_STUDIES_PREVIOUS:-.gpu-results}"
WORKERS="${GPU_STUDIES_WORKERS:-$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))}"
read -ra EXTRA <<<"${GPU_STUDIES_EXTRA:-}"
DEVICE=$(r cuda cpu)
QUICK=(); [[ $REHEARSE == 1 ]] && QUICK=(--quick)
TARPREFIX=gpu_studies_$(r "" rehearsal_)   # rehearsal tarballs never mix with real ones
START=$SECONDS
left() { echo $((DEADLINE - (SECONDS - START))); }
# SIGTERM (the device tool's own limit): the running sweep stops at its next step boundary and
# writes its outputs (at most 20 s), then everything is packed.
READY=0
# shellcheck disable=SC2317  # reached through the trap
on_term() {
  trap '' TERM
  gpu_env_stop_child "$(gpu_env_min 20 "$GRACE")"
  [[ $READY == 1 ]] || die 4 "stopped by SIGTERM after $((SECONDS - START)) s, before any step"
  ROWS+="| (runner) | stopped by SIGTERM at $((SECONDS - START)) s | | |"$'\n'
  note_exit 4; pack "stopped by SIGTERM"; cat "$RUNDIR/summary.md"; exit 4
}
trap on_term TERM

# ---------------------------------------------------------------- the plan
STEPS=(); CAPS=()
IFS=, read -ra tokens <<<"$PLAN"
for t in "${tokens[@]}"; do
  name="${t%%:*}"; cap=""; [[ "$t" == *:* ]] && cap="${t#*:}"
  case "$name" in keras-batch|utilization|utilization-amp|techniques|lr-scaling|batch-schedule|pytorch) ;;
    *) die 3 "PLAN step '$name': expected keras-batch, utilization, utilization-amp, techniques, lr-scaling, batch-schedule or pytorch" ;; esac
  [[ -z "$cap" || "$cap" =~ ^[0-9]+$ ]] || die 3 "PLAN step '$t': the cap after ':' is whole seconds"
  STEPS+=("$name"); CAPS+=("$cap")
done
# A pytorch step after the last utilization step, unless the plan lists one.
if [[ ",$PLAN," != *",pytorch"[,:]* ]]; then
  for ((i = ${#STEPS[@]} - 1; i >= 0; i--)); do
    [[ "${STEPS[$i]}" == utilization* ]] || continue
    STEPS=("${STEPS[@]:0:i+1}" pytorch "${STEPS[@]:i+1}"); CAPS=("${CAPS[@]:0:i+1}" "$(r 150 4)" "${CAPS[@]:i+1}")
    break
  done
fi

gpu_env_detect_gpu || exit 2
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RUNDIR="results/gpu_studies/$STAMP"
mkdir -p "$RUNDIR" || die 3 "cannot create $RUNDIR"
say "GPU: $GPU_LINE; plan ${STEPS[*]}; deadline ${DEADLINE} s"

# ---------------------------------------------------------------- the staged programs
[[ -f "$STAGE/studies.tar.xz" ]] \
  || die 3 "no $STAGE/studies.tar.xz: run 'tools/gpu_check.sh --stage' on the build machine and carry $STAGE"
WORK="$(mktemp -d /tmp/gpu_studies.XXXXXX)"
gpu_env_unpack "$STAGE/studies.tar.xz" "$WORK" || die 3 "cannot unpack $STAGE/studies.tar.xz (needs xz or python3 with lzma)"
BIN="$WORK/bin"
STAGED_COMMIT="$(head -1 "$WORK/COMMIT" 2>/dev/null || echo unknown)"
gpu_env_lib_path "$WORK/lib"
MISSING="$(gpu_env_missing_libs "$BIN"/*)"
[[ -z "$MISSING" ]] || die 3 "libraries not found with LD_LIBRARY_PATH=$LD_LIBRARY_PATH: $(echo "$MISSING" | xargs) (cuDNN 9 / cuBLAS 13 / cudart 13 come from the machine's PyTorch wheels or CUDA toolkit, the rest from the stage)"
"$BIN/minidl-sweep" --help >"$WORK/smoke.log" 2>&1 \
  || die 3 "the staged minidl-sweep does not start here: $(head -3 "$WORK/smoke.log" | xargs)"
CUDA_LIBS="$(gpu_env_cuda_libs "$BIN/minidl-sweep")"
say "programs from $STAGE (commit $STAGED_COMMIT); $CUDA_LIBS"

# ---------------------------------------------------------------- earlier calls' results
RESTORED="none"
if [[ -d "$PREV" ]]; then
  for t in $(find "$PREV" -maxdepth 1 -name "$TARPREFIX"'2*.tar.gz' | sort); do
    tar -xzf "$t" results || die 3 "cannot unpack $t"
    RESTORED="$(basename "$t")"
  done
  if [[ -d "$PREV/results" ]]; then
    cp -R "$PREV/results/." results/ || die 3 "cannot copy $PREV/results"
    if [[ "$RESTORED" == none ]]; then RESTORED="$PREV/results/"; else RESTORED+=" + $PREV/results/"; fi
  fi
fi
[[ "$RESTORED" == "none" ]] || say "restored earlier results: $RESTORED"

# ---------------------------------------------------------------- provenance (written first)
# The Python that holds PyTorch (the PyTorch baseline runs with it): python3, else a venv in /opt.
gpu_env_torch_python
PY="$TORCH_PY"; TORCH="$TORCH_LINE"
{
  echo "# GPU studies call $STAMP"
  echo
  [[ $REHEARSE == 1 ]] && echo "**CPU rehearsal (--rehearse): --device cpu --quick; not GPU results.**" && echo
  echo "- command: \`$COMMAND\` (deadline ${DEADLINE} s, grace ${GRACE} s, ${WORKERS} loader workers${EXTRA[*]:+, extra flags: ${EXTRA[*]}})"
  echo "- plan as run: ${STEPS[*]}"
  echo "- staged commit (the programs): $STAGED_COMMIT; tree: $(git rev-parse --short HEAD 2>/dev/null || echo "no .git here")"
  echo "- started: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); restored: $RESTORED"
  gpu_env_machine_md
  echo "- libraries: $CUDA_LIBS"
  echo "- PyTorch: $TORCH"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,compute_cap,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
    echo
    nvidia-smi 2>&1
    echo '```'
  fi
} >"$RUNDIR/provenance.md"

# ---------------------------------------------------------------- packing (also on SIGTERM)
ROWS=""        # the summary's step table
EXIT=0         # 1 failed, 4 cut or not started
TODO=()        # steps to run again
note_exit() { if [[ $1 == 1 ]]; then EXIT=1; elif [[ $1 == 4 && $EXIT == 0 ]]; then EXIT=4; fi; }
study_dir() { echo "results/$1$([[ $REHEARSE == 1 ]] && echo -quick-cpu)"; }
PACKED=""
pack() {
  local summary="$RUNDIR/summary.md" s
  {
    echo "# GPU studies call $STAMP: $1"
    echo
    [[ $REHEARSE == 1 ]] && echo "**CPU rehearsal: not GPU results.**" && echo
    echo "- $GPU_LINE; programs at commit $STAGED_COMMIT; $(( SECONDS - START )) s of the ${DEADLINE} s deadline"
    echo "- plan: ${STEPS[*]}; restored: $RESTORED"
    echo
    echo "| step | state | runs done | seconds |"
    echo "| --- | --- | --- | ---: |"
    printf '%s' "$ROWS"
    if [[ ${#TODO[@]} -gt 0 ]]; then
      echo
      echo "To resume: put this call's tarball in .gpu-results/ and run \`tools/gpu_studies.sh $([[ $REHEARSE == 1 ]] && echo "--rehearse ")$(IFS=,; echo "${TODO[*]}")\` (carry .gpu-results)."
    fi
    for s in keras-batch utilization utilization-amp techniques lr-scaling batch-schedule; do
      local d; d="$(study_dir "$s")"
      [[ -f "$d/summary.md" ]] || continue
      echo
      echo "## $s ($d/summary.md)"
      echo
      grep -E '^\|' "$d/summary.md" | cut -c1-300   # long notes (errors) stay in the file
      for c in "$d"/compare-*.md; do [[ -f "$c" ]] && { echo; echo "### $(basename "$c")"; echo; head -30 "$c"; }; done
    done
  } >"$summary"
  local dest="${OUT:-}"
  if [[ -z "$dest" || ! -d "$dest" ]]; then dest="$PREV"; mkdir -p "$dest"; fi
  tar -czf "$dest/$TARPREFIX$STAMP.tar.gz" results 2>/dev/null || say "packing into $dest failed"
  cp "$summary" "$dest/gpu_studies_summary.md" 2>/dev/null
  PACKED="$dest/$TARPREFIX$STAMP.tar.gz"
}
READY=1   # from here on a SIGTERM packs what there is

# ---------------------------------------------------------------- the steps
have_photos() { [[ -n "$(find "$DATA/cat" -maxdepth 1 -name '*.jpg' -print -quit 2>/dev/null)" && -n "$(find "$DATA/dog" -maxdepth 1 -name '*.jpg' -print -quit 2>/dev/null)" ]]; }

run_sweep_step() {
  local study=$1 cap=$2 t0=$SECONDS
  # One process per run: a run that crashes (the CUDA backend's first runs) becomes a `crashed` row
  # and the study goes on, and every run starts with a fresh device and allocator.
  local args=(--study "${study%-amp}" --device "$DEVICE" --workers "$WORKERS" --out results --process-per-run "${QUICK[@]}")
  [[ "$study" == utilization-amp ]] && args+=(--amp)
  if [[ "$study" != utilization* ]]; then
    if ! have_photos; then
      ROWS+="| $study | not run: no photos in $DATA (carry .data; tools/gpu_check.sh --stage copies them) | | 0 |"$'\n'
      note_exit 1; return
    fi
    args+=(--data "$DATA")
  fi
  args+=("${EXTRA[@]}")
  local budget
  budget=$(gpu_env_min "${cap:-999999}" $(( $(left) - GRACE - PACK_RESERVE )))
  if (( budget < MIN_STEP )); then
    ROWS+="| $study | not started: ${budget} s left before the deadline | | 0 |"$'\n'
    TODO+=("$study"); note_exit 4; return
  fi
  say "$study: minidl-sweep ${args[*]} (SIGINT after ${budget} s)"
  gpu_env_run_until INT "$budget" "$GRACE" "$RUNDIR/$study.log" "$BIN/minidl-sweep" "${args[@]}"
  local rc=$?
  local list ndone total state
  list="$("$BIN/minidl-sweep" "${args[@]}" --list 2>/dev/null)"
  total="$(grep -c . <<<"$list")"; ndone="$(grep -cE ' done$' <<<"$list")"
  case $rc in
    0) state="finished" ;;
    124) state="cut by the deadline at ${budget} s (SIGINT); resumes next call"; TODO+=("$study"); note_exit 4 ;;
    137) if (( SECONDS - t0 >= budget )); then
           state="killed ${GRACE} s after the SIGINT; summary.md/results.json may be stale (the next call rewrites them)"
           TODO+=("$study"); note_exit 4
         else
           state="killed (SIGKILL) after $((SECONDS - t0)) s, before its deadline: out of host memory?"; note_exit 1
         fi ;;
    *) state="failed, exit $rc: $(grep -E 'error' "$RUNDIR/$study.log" | tail -1 | cut -c1-200)"; note_exit 1 ;;
  esac
  [[ $rc == 0 && "$ndone" != "$total" ]] && { state="finished with runs left over"; TODO+=("$study"); note_exit 4; }
  ROWS+="| $study | $state | $ndone of $total | $((SECONDS - t0)) |"$'\n'
  say "$study: $state; $ndone of $total runs done"
}

run_pytorch_step() {
  local cap=$1 t0=$SECONDS dir
  dir="$(study_dir utilization)"
  if [[ ! -f bench/pytorch_utilization.py ]]; then
    ROWS+="| pytorch | skipped: bench/pytorch_utilization.py is not in this tree | | 0 |"$'\n'; return
  fi
  mkdir -p "$dir"
  local size batches steps
  size=$(r 224 32); batches=$(r 4,8,16,32,64,128,256,512,1024 2,4); steps=$(r 20 2)
  local variant flags csv budget rc states=""
  # f32: like for like with minidl's study; best: PyTorch's best settings (AMP, channels_last,
  # cudnn.benchmark, fused SGD), the bar to clear.
  for variant in f32 best; do
    flags=(); [[ $variant == best ]] && flags=(--best)
    csv="$dir/pytorch-$variant.csv"
    if [[ -s "$csv" ]]; then states+="$variant: measured in an earlier call; "; continue; fi
    budget=$(gpu_env_min $(( ${cap:-999999} - (SECONDS - t0) )) $(( $(left) - 10 - PACK_RESERVE )))
    if (( budget < MIN_STEP )); then states+="$variant: not started (${budget} s left); "; TODO+=(pytorch); note_exit 4; break; fi
    say "pytorch $variant: bench/pytorch_utilization.py (at most ${budget} s)"
    PYTHONUNBUFFERED=1 gpu_env_run_until TERM "$budget" 10 "$RUNDIR/pytorch-$variant.log" \
      "$PY" bench/pytorch_utilization.py --device "$DEVICE" --model resnet50 --image-size "$size" \
        --batches "$batches" --steps "$steps" "${flags[@]}" --out "$csv.part"
    rc=$?
    if [[ $rc == 0 && -s "$csv.part" ]]; then
      mv "$csv.part" "$csv"; states+="$variant: done; "
    elif [[ $rc == 124 || $rc == 137 ]]; then
      states+="$variant: cut at ${budget} s (partial rows in $(basename "$csv").part); "; TODO+=(pytorch); note_exit 4; break
    else
      states+="$variant: failed, exit $rc ($(tail -1 "$RUNDIR/pytorch-$variant.log" | cut -c1-150)); "; note_exit 1
    fi
  done
  # The side-by-side tables, for every baseline measured so far.
  if [[ -f bench/compare_utilization.py && -f "$dir/results.csv" ]]; then
    for csv in "$dir"/pytorch-*.csv; do
      [[ -f "$csv" ]] || continue
      variant="$(basename "$csv" .csv)"; variant="${variant#pytorch-}"
      "$PY" bench/compare_utilization.py --minidl "$dir/results.csv" --pytorch "$csv" --steady --busy \
        --pytorch-label "PyTorch ${TORCH%% *} $variant" >"$dir/compare-$variant.md" 2>"$RUNDIR/compare-$variant.log" \
        || { states+="compare $variant failed (see compare-$variant.log); "; rm -f "$dir/compare-$variant.md"; note_exit 1; }
    done
  elif [[ ! -f bench/compare_utilization.py ]]; then
    states+="no bench/compare_utilization.py: no side-by-side table; "
  fi
  # PyTorch's best settings beside minidl under --amp: the same precision on both sides.
  local amp; amp="$(study_dir utilization-amp)"
  if [[ -f bench/compare_utilization.py && -f "$amp/results.csv" && -f "$dir/pytorch-best.csv" ]]; then
    "$PY" bench/compare_utilization.py --minidl "$amp/results.csv" --pytorch "$dir/pytorch-best.csv" --steady --busy \
      --pytorch-label "PyTorch ${TORCH%% *} best" >"$amp/compare-best.md" 2>"$RUNDIR/compare-best-amp.log" \
      || { states+="compare best vs minidl amp failed (see compare-best-amp.log); "; rm -f "$amp/compare-best.md"; note_exit 1; }
  fi
  ROWS+="| pytorch | ${states%; } | | $((SECONDS - t0)) |"$'\n'
  say "pytorch: ${states%; }"
}

for i in "${!STEPS[@]}"; do
  case "${STEPS[$i]}" in
    pytorch) run_pytorch_step "${CAPS[$i]}" ;;
    *) run_sweep_step "${STEPS[$i]}" "${CAPS[$i]}" ;;
  esac
done

case $EXIT in
  0) pack "every step finished" ;;
  4) pack "cut by the deadline: resume in the next call" ;;
  *) pack "a step failed" ;;
esac
say "packed $PACKED ($(du -h "$PACKED" 2>/dev/null | cut -f1)); logs and provenance in $RUNDIR"
echo
cat "$RUNDIR/summary.md"
exit "$EXIT"
