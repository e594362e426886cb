# shellcheck shell=bash
# The phases of tools/gpu_check.sh, one function each (sourced by it, not run on its own), so the
# one-call plan reads as a list and a phase can be rehearsed or reordered alone. A phase gets its
# budget in seconds, writes its Markdown section to $SEC/<phase>.md, its logs to $LOGDIR, and sets
# PHASE_RC: 0 passed, 1 failed, 4 cut by its budget (run again by the --resume call), 5 skipped
# (nothing to run here: no sanitizer, no model program, a rehearsal without a GPU).
# Uses from gpu_check.sh: BIN, WORK, LOGDIR, SEC, REHEARSE, TORCH_PY, ROOT; from gpu_env.sh: say,
# gpu_env_run_until, gpu_env_min.

phase_default_cap() {
  # Sized by the first H100 run (lab/journal.md, the GPU sessions): tests took 15 s, memcheck 5, the model 4-7,
  # the benchmarks 10; maxbatch did not finish in 66 or 100 s (minidl's dry run 40 s, then PyTorch's
  # doubling and bisection with cudnn.benchmark at every batch).
  case $1 in tests) echo 60 ;; step) echo 190 ;; sanitizer) echo 75 ;; model) echo 45 ;; profile) echo 45 ;;
    bench) echo 40 ;; maxbatch) echo 170 ;; *) echo 60 ;; esac
}

count_lines() { grep -cE "$1" "$2" 2>/dev/null || true; }

# ---------------------------------------------------------------- 1 tests
phase_tests() {
  local budget=$1 end=$((SECONDS + $1)) exes=() exe name later b t0 rc pass fail skip note md=""
  local tpass=0 tfail=0 tskip=0 cut=0
  for exe in "$BIN"/*_cuda; do [[ "$(basename "$exe")" != minidl_bench_cuda ]] && exes+=("$exe"); done
  for i in "${!exes[@]}"; do
    exe="${exes[$i]}"; name="$(basename "$exe")"; later=$(( ${#exes[@]} - i - 1 ))
    # Each later executable keeps 15 s, or its even share when less is left.
    b=$(( end - SECONDS - 15 * later ))
    (( b < (end - SECONDS) / (later + 1) )) && b=$(( (end - SECONDS) / (later + 1) ))
    say "  $name (at most ${b} s)"
    t0=$SECONDS
    gpu_env_run_until TERM "$b" 5 "$LOGDIR/$name.log" "$exe" --gtest_color=no
    rc=$?
    pass="$(count_lines '^\[       OK \]' "$LOGDIR/$name.log")"
    fail="$(count_lines '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$LOGDIR/$name.log")"
    skip="$(count_lines '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$LOGDIR/$name.log")"
    note=$rc
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      cut=1
      note="$rc (cut at ${b} s; running: $(grep -E '^\[ RUN      \]' "$LOGDIR/$name.log" | tail -1 | sed 's/^\[ RUN      \] //'))"
    elif [[ $REHEARSE == 0 && "$pass" -le 1 ]] && grep -q "no CUDA device" "$LOGDIR/$name.log"; then
      note="$rc: nvidia-smi sees a GPU but minidl does not (its CUDA cases skipped)"; tfail=$((tfail + 1))
    fi
    tpass=$((tpass + pass)); tfail=$((tfail + fail)); tskip=$((tskip + skip))
    md+="| $name | $pass | $fail | $skip | $note | $((SECONDS - t0)) |"$'\n'
    grep -E '^\[  FAILED  \].*\([0-9]+ ms\)$' "$LOGDIR/$name.log" | head -20
  done
  {
    echo "## 1. Tests (the \`cuda\` label: every *_cuda executable)"
    echo
    echo "$tpass passed, $tfail failed, $tskip skipped$([[ $cut == 1 ]] && echo " (cut by the phase's ${budget} s)")."
    echo
    echo "| executable | passed | failed | skipped | exit | seconds |"
    echo "| --- | ---: | ---: | ---: | --- | ---: |"
    printf '%s' "$md"
    if [[ $tfail -gt 0 ]]; then
      echo
      echo '```'
      grep -hE '^\[  FAILED  \].*\([0-9]+ ms\)$|Failure$|normalised error|error:' "$LOGDIR"/*_cuda.log 2>/dev/null | head -60
      echo '```'
    fi
  } >"$SEC/tests.md"
  if [[ $tfail -gt 0 ]]; then PHASE_RC=1; elif [[ $cut == 1 ]]; then PHASE_RC=4; else PHASE_RC=0; fi
}

# ---------------------------------------------------------------- 2 step: minidl beside PyTorch
# One run: FRAMEWORK:PRECISION[:OPTION...], options in this order: nhwc (minidl channels-last),
# graphs (--cuda-graphs, both frameworks), hostscaler (minidl --host-scaler: the AMP scaler decides
# on the host, a sync a step), bN (batch N instead of 128). minidl_bench_step and
# bench/pytorch_step.py take the same flags, model, optimizer and timing rule; PyTorch always runs
# channels_last (its best). Each minidl run is compared with PyTorch's eager run of its precision
# and batch, and a graphed one with PyTorch's graphed run too.
step_name() { local s=${1//:/_}; echo "step_$s"; }   # minidl:amp:nhwc -> step_minidl_amp_nhwc
step_run() {
  local spec=$1 budget=$2 fw prec opt secs args json rc batch=128 extra=() minidl_only=()
  local log="$LOGDIR/$(step_name "$spec").log"
  IFS=: read -r fw prec _ <<<"$spec"
  local -a opts=(); IFS=: read -r -a opts <<<"$spec"
  for opt in "${opts[@]:2}"; do
    case $opt in
      nhwc) extra+=(--channels-last); minidl_only+=("$opt") ;;   # PyTorch always runs channels_last
      graphs) [[ $REHEARSE == 1 ]] || extra+=(--cuda-graphs) ;;   # a rehearsal's CPU has no graphs
      hostscaler) extra+=(--host-scaler); minidl_only+=("$opt") ;;
      b[0-9]*) batch=${opt#b} ;;
      *) echo "unknown option '$opt' in step run '$spec' (nhwc, graphs, hostscaler, bN)" >"$log"; return 3 ;;
    esac
  done
  if [[ $fw == pytorch && ${#minidl_only[@]} -gt 0 ]]; then
    echo "step run '$spec': PyTorch takes graphs and bN only (it always runs channels_last)" >"$log"; return 3
  fi
  secs=${GPU_CHECK_STEP_SECONDS:-$([[ $REHEARSE == 1 ]] && echo 2 || echo 15)}
  if [[ $REHEARSE == 1 ]]; then
    args=(--device cpu --model resnet18-small --image-size 32 --batch 4 --warmup 1 --seconds "$secs")
  else
    args=(--device cuda --model resnet50 --image-size 224 --batch "$batch" --warmup 15 --seconds "$secs")
  fi
  json="${log%.log}.json"
  case $fw in
    minidl) gpu_env_run_until TERM "$budget" 5 "$log" "$BIN/minidl_bench_step" "${args[@]}" --precision "$prec" \
              ${extra[@]+"${extra[@]}"} --json "$json" ;;
    pytorch) PYTHONUNBUFFERED=1 gpu_env_run_until TERM "$budget" 5 "$log" "$TORCH_PY" "$ROOT/bench/pytorch_step.py" \
              "${args[@]}" --precision "$prec" ${extra[@]+"${extra[@]}"} --json "$json" ;;
    *) echo "unknown framework '$fw' in GPU_CHECK_STEP_RUNS" >"$log"; return 3 ;;
  esac
  rc=$?
  tail -1 "$log"
  return $rc
}

phase_step() {
  local budget=$1 end=$((SECONDS + $1)) runs spec rc b rows="" failed=0 cut=0 ips json prec
  # The fastest setting each side has first (graphed channels-last AMP; PyTorch graphed, then
  # eager), then the eager layouts and TF32: seven runs of 15 s fit the 190 s cap (d10cebe's call
  # measured 20-30 s a run, PyTorch's import and autotuning included).
  runs=${GPU_CHECK_STEP_RUNS:-minidl:amp:nhwc:graphs pytorch:amp:graphs pytorch:amp minidl:amp:nhwc minidl:amp minidl:tf32 pytorch:tf32}
  declare -A IPS=()
  for spec in $runs; do
    b=$((end - SECONDS))
    # A run needs warm-up and some timed steps to mean anything (GPU_CHECK_STEP_MIN, default 20 s).
    if (( b < ${GPU_CHECK_STEP_MIN:-20} )); then rows+="| $spec | not run: ${b} s left | |"$'\n'; cut=1; continue; fi
    say "  step $spec (at most ${b} s)"
    step_run "$spec" "$b"; rc=$?
    json="$LOGDIR/$(step_name "$spec").json"
    ips="$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["images_per_s"])' "$json" 2>/dev/null)"
    if [[ -n "$ips" ]]; then
      IPS[$spec]=$ips
      rows+="| $spec | $ips | $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%d steps in %.1f s; peak %s MiB%s%s" % (d["steps"], d["seconds"], "%.0f" % (d["peak_allocated_bytes"] / 2**20) if d.get("peak_allocated_bytes") else "-", " (reserved %.0f)" % (d["peak_reserved_bytes"] / 2**20) if d.get("peak_reserved_bytes") else "", "; host %.1f of %.1f ms a step" % (1e3 * d["host_seconds"] / d["steps"], 1e3 * d["seconds"] / d["steps"]) if d.get("host_seconds") is not None else ""))' "$json" 2>/dev/null) |"$'\n'
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
      rows+="| $spec | cut by the budget | |"$'\n'; cut=1
    else
      rows+="| $spec | failed (exit $rc): $(tail -2 "${json%.json}.log" | tr '|\n' '/ ' | cut -c1-200) | |"$'\n'; failed=1
    fi
  done
  {
    echo "## 2. Training step: minidl beside PyTorch"
    echo
    if [[ $REHEARSE == 1 ]]; then echo "Rehearsal: resnet18-small, 32 px, batch 4, on the CPU (not GPU numbers)."
    else echo "ResNet-50, 224 px, batch 128, SGD lr 0.001 momentum 0.9, one device-resident batch, ${GPU_CHECK_STEP_SECONDS:-15} s of steps after 15 warm-up steps; PyTorch $TORCH_LINE at its best eager settings (channels_last, cudnn.benchmark, fused SGD; amp: autocast f16 + GradScaler; tf32: TF32 in cuBLAS and cuDNN)."; fi
    echo
    echo "| run | images/s | detail |"
    echo "| --- | ---: | --- |"
    printf '%s' "$rows"
    # Each minidl run against the PyTorch run of the same precision and batch.
    local m peer
    for m in $runs; do
      [[ $m == minidl:* && -n "${IPS[$m]:-}" ]] || continue
      IFS=: read -r _ prec _ <<<"$m"
      # Against PyTorch's eager run, and against its graphed one when both graph.
      local b; b="$(grep -o ':b[0-9]*' <<<"$m" | head -1)"
      for peer in "pytorch:$prec$b" "pytorch:$prec:graphs$b"; do
        [[ $peer == *graphs* && $m != *graphs* ]] && continue
        [[ -n "${IPS[$peer]:-}" ]] || continue
        echo
        echo "$m / $peer: $(python3 -c "print('%.2f' % (${IPS[$m]} / ${IPS[$peer]}))")x"
      done
    done
  } >"$SEC/step.md"
  if [[ $failed == 1 ]]; then PHASE_RC=1; elif [[ $cut == 1 ]]; then PHASE_RC=4; else PHASE_RC=0; fi
}

# ---------------------------------------------------------------- 3 compute-sanitizer memcheck
phase_sanitizer() {
  local budget=$1 san filter rc errs tests
  san="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)"
  if [[ -z "$san" ]]; then
    printf '## 3. compute-sanitizer memcheck\n\nnot run: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)\n' >"$SEC/sanitizer.md"
    PHASE_RC=5; return
  fi
  # cuDNN autotuning under memcheck takes minutes; the autotune cases are left to the plain run.
  filter="${GPU_CHECK_SANITIZER_FILTER:-*-Parity.Conv2dAutotuneNhwcAndTf32:Parity.AutotuneWorkspaceStaysInsideTheBudget}"
  gpu_env_run_until TERM "$budget" 5 "$LOGDIR/sanitizer.log" \
    "$san" --tool memcheck --leak-check no --error-exitcode 99 "$BIN/kernels_cuda" --gtest_color=no --gtest_filter="$filter"
  rc=$?
  errs="$(grep -oE 'ERROR SUMMARY: [0-9]+' "$LOGDIR/sanitizer.log" | tail -1)"
  tests="$(count_lines '^\[       OK \]' "$LOGDIR/sanitizer.log") tests passed under memcheck"
  {
    echo "## 3. compute-sanitizer memcheck (kernels_cuda, filter \`$filter\`)"
    echo
    case $rc in
      0) echo "clean (${errs:-no summary}; $tests)"; PHASE_RC=0 ;;
      124|137) echo "cut at ${budget} s (${errs:-no summary so far}; $tests; running: $(grep -E '^\[ RUN      \]' "$LOGDIR/sanitizer.log" | tail -1))"
               PHASE_RC=4; grep -q 'ERROR SUMMARY: [1-9]' "$LOGDIR/sanitizer.log" && PHASE_RC=1 ;;
      99) echo "memcheck errors: ${errs}"; echo; echo '```'; grep -m 30 -E '=========' "$LOGDIR/sanitizer.log"; echo '```'; PHASE_RC=1 ;;
      *) echo "exit $rc (${errs:-no summary}; $tests): test failures under the sanitizer"; PHASE_RC=1 ;;
    esac
  } >"$SEC/sanitizer.md"
}

# ---------------------------------------------------------------- 4 the step-time model, calibrated
phase_model() {
  local budget=$1 rc tsv
  if [[ ! -x "$BIN/minidl-gpumodel-cuda" || $REHEARSE == 1 ]]; then
    printf '## 4. Step-time model: modelled against measured\n\nnot run: %s\n' \
      "$([[ $REHEARSE == 1 ]] && echo "a rehearsal has no GPU to time" || echo "no minidl-gpumodel-cuda in the stage")" >"$SEC/model.md"
    PHASE_RC=5; return
  fi
  # The model table the stage names (the last committed lab/results/bench/gpu_model_*.tsv, chosen by
  # tools/gpu_stage.sh) is what the GPU calibrates: per kernel, its modelled microseconds beside
  # the CUDA-event times of the same step.
  tsv="$(head -1 "$WORK/MODEL_TSV" 2>/dev/null)"
  # On an H200, the H200's model (minidl-gpumodel --gpu h200) when the stage has one.
  [[ ${GPU_LINE:-} == *H200* && -s "$WORK/MODEL_TSV_H200" ]] && tsv="$(head -1 "$WORK/MODEL_TSV_H200")"
  [[ -n "$tsv" && -f "$ROOT/$tsv" ]] && tsv="$ROOT/$tsv" || tsv=""
  # One run per batch (GPU_CHECK_MODEL_BATCHES, default the model's target, 256), each with what
  # is left of the phase's budget.
  local b t0=$SECONDS part
  : >"$LOGDIR/model.md"
  rc=0
  for b in ${GPU_CHECK_MODEL_BATCHES:-256}; do
    part=$((budget - (SECONDS - t0)))
    if ((part < 10)); then echo "(batch $b: not run, the phase's ${budget} s were spent)" >>"$LOGDIR/model.md"; rc=124; break; fi
    gpu_env_run_until TERM "$part" 10 "$LOGDIR/model_b$b.log" "$BIN/minidl-gpumodel-cuda" --measure --batch "$b" \
      --configs "${GPU_CHECK_MODEL_CONFIGS:-resnet50-amp-nhwc,resnet50-amp}" ${tsv:+--modelled "$tsv"} --out "$LOGDIR/model_b$b.md"
    rc=$?
    cat "$LOGDIR/model_b$b.log" >>"$LOGDIR/model.log"
    if [[ $rc == 0 && -s "$LOGDIR/model_b$b.md" ]]; then cat "$LOGDIR/model_b$b.md" >>"$LOGDIR/model.md"
    else echo "batch $b: exit $rc after at most ${part} s: $(tail -3 "$LOGDIR/model_b$b.log" | tr '\n' ' ')" >>"$LOGDIR/model.md"; break; fi
  done
  {
    echo "## 4. Step-time model: modelled (\`${tsv#"$ROOT"/}\`) against measured (CUDA events per launch)"
    echo
    cat "$LOGDIR/model.md"
  } >"$SEC/model.md"
  case $rc in 0) PHASE_RC=0 ;; 124|137) PHASE_RC=4 ;; *) PHASE_RC=1 ;; esac
}

# ---------------------------------------------------------------- 4b PyTorch's step by kernel
# PyTorch's AMP step at the model phase's batch (256), channels_last, under torch.profiler: each
# kernel's time per step by category, and beside it minidl's measured launches (the model phase's
# table) in the same categories (bench/step_categories.py), so the report says where the two
# steps differ, not only by how much.
phase_profile() {
  local budget=$1 rc args
  if [[ $REHEARSE == 1 ]]; then
    args=(--device cpu --model resnet18-small --image-size 32 --batch 4 --warmup 1 --profile-steps 2)
  else
    args=(--device cuda --model resnet50 --image-size 224 --batch 256 --warmup 15 --profile-steps 5)
  fi
  PYTHONUNBUFFERED=1 gpu_env_run_until TERM "$budget" 5 "$LOGDIR/profile.log" "$TORCH_PY" "$ROOT/bench/pytorch_step.py" \
    "${args[@]}" --precision amp --profile-out "$LOGDIR/profile.md" --json "$LOGDIR/profile.json"
  rc=$?
  {
    echo "## 4b. PyTorch's AMP step by kernel category (torch.profiler)"
    echo
    if [[ $rc == 0 && -s "$LOGDIR/profile.md" ]]; then
      cat "$LOGDIR/profile.md"
      if [[ -s "$LOGDIR/model.md" ]]; then
        echo
        echo "minidl's measured launches (section 4's first configuration, batch 256: channels-last by default, PyTorch's layout) beside PyTorch's, by category:"
        echo
        python3 "$ROOT/bench/step_categories.py" --minidl "$LOGDIR/model.md" --pytorch "$LOGDIR/profile.json"
      fi
    else
      echo "exit $rc after at most ${budget} s: $(tail -3 "$LOGDIR/profile.log" | tr '\n' ' ')"
    fi
  } >"$SEC/profile.md"
  case $rc in 0) PHASE_RC=0 ;; 124|137) PHASE_RC=4 ;; *) PHASE_RC=1 ;; esac
}

# ---------------------------------------------------------------- 5 short benchmarks
phase_bench() {
  local budget=$1 rc table
  if [[ ! -x "$BIN/minidl_bench_cuda" || $REHEARSE == 1 ]]; then
    printf '## 5. Benchmarks\n\nnot run: %s\n' "$([[ $REHEARSE == 1 ]] && echo "a rehearsal has no GPU to time" || echo "no minidl_bench_cuda in the stage")" >"$SEC/bench.md"
    PHASE_RC=5; return
  fi
  gpu_env_run_until TERM "$budget" 5 "$LOGDIR/bench.log" "$BIN/minidl_bench_cuda" \
    --benchmark_filter="${GPU_CHECK_BENCH_FILTER:-^(D2DCopy|Add|MulScalarInPlace|Relu|Cast|SumAll|SumRows)/}" \
    --benchmark_out="$LOGDIR/bench.json" --benchmark_out_format=json
  rc=$?
  # A cut run leaves the JSON unfinished (unreadable): then the console lines are the table.
  table="$(python3 - "$LOGDIR/bench.json" 2>/dev/null <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = ["| benchmark | time (ms) | GB/s | vs D2D copy | TFLOP/s |", "| --- | ---: | ---: | ---: | ---: |"]
for b in d.get("benchmarks", []):
    if b.get("run_type") == "aggregate":
        continue
    t = b.get("real_time", 0) * {"ns": 1e-6, "us": 1e-3, "ms": 1, "s": 1e3}[b.get("time_unit", "ns")]
    f = lambda k, fmt: (fmt % b[k]) if k in b else ""
    rows.append(f"| {b['name']} | {t:.3f} | {f('GB/s', '%.0f')} | {f('vs_copy', '%.2f')} | {f('TFLOP/s', '%.1f')} |")
print("\n".join(rows))
PY
)" || table="exit $rc; no JSON; the console lines:"$'\n\n```\n'"$(grep -E '^[A-Za-z0-9_/:.]+ +[0-9.]+ [mun]?s ' "$LOGDIR/bench.log" | head -40)"$'\n```'
  {
    echo "## 5. Benchmarks (CUDA events after warm-up; 256 MiB operands; GB/s counts bytes read + written; target vs_copy >= 0.85)"
    echo
    echo "$table"
  } >"$SEC/bench.md"
  case $rc in 0) PHASE_RC=0 ;; 124|137) PHASE_RC=4 ;; *) PHASE_RC=1 ;; esac
}

# ---------------------------------------------------------------- 6 the largest AMP batch under 11 GiB
phase_maxbatch() {
  local budget=$1 end=$((SECONDS + $1)) rc1 rc2=0 m p args=()
  if [[ $REHEARSE == 1 ]]; then
    args=(--device cpu --model smallcnn --image-size 32 --memory-budget 64MiB --limit 64)
  else
    args=(--device cuda --model resnet50 --image-size 224 --memory-budget 11GiB)
  fi
  gpu_env_run_until INT "$(( (end - SECONDS) * 55 / 100 ))" 10 "$LOGDIR/maxbatch_minidl.log" \
    "$BIN/minidl-maxbatch" "${args[@]}" --amp --steps 3
  rc1=$?
  m="$(grep -oE 'maximum batch: [0-9]+' "$LOGDIR/maxbatch_minidl.log" | grep -oE '[0-9]+$' | tail -1)"
  if [[ $REHEARSE == 1 ]]; then
    p="not run (rehearsal: a memory fraction is a CUDA allocator setting)"
  else
    PYTHONUNBUFFERED=1 gpu_env_run_until TERM "$((end - SECONDS))" 5 "$LOGDIR/maxbatch_pytorch.log" \
      "$TORCH_PY" "$ROOT/bench/pytorch_step.py" --model resnet50 --precision amp --batch 128 --max-batch-under 11GiB \
      --json "$LOGDIR/maxbatch_pytorch.json"
    rc2=$?
    p="$(grep -oE 'largest batch under [^:]*: [0-9]+' "$LOGDIR/maxbatch_pytorch.log" | grep -oE '[0-9]+$' | tail -1)"
    p="${p:-no result (exit $rc2): $(tail -1 "$LOGDIR/maxbatch_pytorch.log" | cut -c1-160)}"
  fi
  {
    echo "## 6. Largest AMP batch under an 11 GiB budget (ResNet-50, 224 px, 3 steps a trial)"
    echo
    echo "| framework | largest batch | how |"
    echo "| --- | --- | --- |"
    echo "| minidl | ${m:-no result (exit $rc1): $(tail -1 "$LOGDIR/maxbatch_minidl.log" | cut -c1-160)} | minidl-maxbatch --memory-budget (the allocator caps reserved bytes) |"
    echo "| PyTorch | $p | torch.cuda.set_per_process_memory_fraction(11 GiB / total), doubling then bisection |"
  } >"$SEC/maxbatch.md"
  if [[ -z "$m" && $rc1 -ne 124 && $rc1 -ne 137 ]]; then PHASE_RC=1
  elif [[ $rc1 -eq 124 || $rc1 -eq 137 || $rc2 -eq 124 || $rc2 -eq 137 ]]; then PHASE_RC=4
  else PHASE_RC=0; fi
}
