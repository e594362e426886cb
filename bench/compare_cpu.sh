#!/usr/bin/env bash
# minidl beside PyTorch (Debian's python3-torch) and TF-Keras (tensorflow-cpu from PyPI, in a venv
# this script creates) on the CPU: the same models, SGD, the same thread count, back to back in one
# run. Writes lab/results/bench/cpu_peers_<date>_<commit>.md with images/s, the ratios,
# GFLOP/s and the share of the FMA peak measured by minidl_bench_cpu_step --peak in the same run.
set -euo pipefail

usage() {
  cat <<USAGE
usage: bash bench/compare_cpu.sh [--quick] [--threads N] [--build DIR] [--out DIR] [--venv DIR]
                                 [--steps N] [--warmup N] [--rounds N] [--skip-keras] [--skip-pytorch]
  --quick         tiny images and batches, one timed step: checks the plumbing (1-3 minutes, mostly TensorFlow imports)
  --threads N     threads for every framework (default: all cores, $(nproc))
  --build DIR     minidl build folder with bin/minidl_bench_cpu_step (default: build)
  --out DIR       where the results file goes (default: lab/results/bench)
  --venv DIR      the tensorflow-cpu venv, created when missing (default: ~/.cache/minidl/venv-tf)
  --steps N       timed steps per case after the warm-up steps; the median is reported (default: 5:
                  with 2, the peers' rows moved by up to 40% between two runs minutes apart)
  --rounds N      run every case N times, round after round, and report each framework's median
                  round (default 1; on the shared 2-core VM a framework moved by 10-15% between idle
                  runs an hour apart, and rounds spread that drift over every framework)
  --warmup N      untimed steps first, for every framework (default: 2, the steady state a training
                  run sees: after one warm-up step minidl's small CNN at batch 64 still took about 40,000
                  page faults, fresh memory touched for the first time, in the next step, and about 250
                  in the third; PyTorch and Keras get the same warm-up)
Measure on an otherwise idle machine: the file records the load average before and after.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
quick=0 threads=$(nproc) build="$root/build" out="$root/lab/results/bench" steps=5 warmup=2 rounds=1
venv="${MINIDL_TF_VENV:-$HOME/.cache/minidl/venv-tf}" skip_keras=0 skip_torch=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --venv) venv=$2; shift ;;
    --steps) steps=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --skip-keras) skip_keras=1 ;;
    --skip-pytorch) skip_torch=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_cpu: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "compare_cpu: --rounds wants a positive integer, got '$rounds'" >&2; exit 2; }
step_bin="$build/bin/minidl_bench_cpu_step"
if [[ ! -x "$step_bin" ]]; then
  echo "compare_cpu: $step_bin is missing: cmake --build $build --target minidl_bench_cpu_step" >&2
  exit 2
fi
py=/usr/bin/python3
if [[ $skip_torch -eq 0 ]] && ! "$py" -c "import torch, torchvision" 2>/dev/null; then
  echo "compare_cpu: PyTorch is missing: bash tools/install_deps.sh --golden (or --skip-pytorch)" >&2
  exit 2
fi
if [[ $skip_keras -eq 0 && ! -x "$venv/bin/python" ]]; then
  echo "compare_cpu: creating $venv with tensorflow-cpu (once, about 600 MB)" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "tensorflow-cpu==2.21.0"
fi

# Cases: model image-size batch. The small CNN rows also show how the time per image follows the
# batch; the resnet18-small rows are minidl's alone (the batch-schedule studies' model).
if [[ $quick -eq 1 ]]; then
  cases=("smallcnn 32 4" "smallcnn 32 8" "resnet18 32 4" "resnet50 32 2")
  mini_only=("resnet18-small 16 4")
  steps=1 warmup=1
else
  cases=("smallcnn 200 16" "smallcnn 200 64" "smallcnn 200 256" "resnet18 64 32" "resnet50 128 16")
  mini_only=("resnet18-small 32 16" "resnet18-small 32 256")
fi

export OMP_NUM_THREADS=$threads
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
raw="$tmp/raw.jsonl"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
"$step_bin" --peak --threads "$threads" | sed 's/^/{"kind": "peak", /; s/{"kind": "peak", {/{"kind": "peak", /' >>"$raw"
for round in $(seq "$rounds"); do
for c in "${cases[@]}" "${mini_only[@]}"; do
  read -r model size batch <<<"$c"
  echo "compare_cpu: round $round of $rounds: $model ${size}px batch $batch" >&2
  if [[ $round -eq 1 && $skip_torch -eq 0 && $model != *-small ]]; then  # the FLOPs once per case
    "$py" "$root/bench/cpu_peers.py" flops --model "$model" --image-size "$size" | sed 's/^{/{"kind": "flops", /' >>"$raw"
  fi
  "$step_bin" --model "$model" --image-size "$size" --batch-size "$batch" --steps "$steps" --warmup "$warmup" \
    --threads "$threads" | sed "s/^{/{\"kind\": \"run\", \"round\": $round, /" >>"$raw"
  [[ $model == *-small ]] && continue
  if [[ $skip_torch -eq 0 ]]; then
    # PyTorch at its best: the ResNets in both layouts (on the Zen 5 VM channels_last ran ResNet-18
    # 12-40% faster), the table keeps the faster; the small CNN's step is its dense layer, the same
    # in either layout (15.1 and 15.4 images/s at batch 16), so NCHW only.
    formats=(nchw)
    [[ $model == resnet* ]] && formats=(nchw channels_last)
    for fmt in "${formats[@]}"; do
      "$py" "$root/bench/cpu_peers.py" pytorch --model "$model" --image-size "$size" --batch-size "$batch" \
        --steps "$steps" --warmup "$warmup" --threads "$threads" --memory-format "$fmt" | sed "s/^{/{\"kind\": \"run\", \"round\": $round, /" >>"$raw"
    done
  fi
  if [[ $skip_keras -eq 0 ]]; then
    TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" "$root/bench/cpu_peers.py" keras --model "$model" --image-size "$size" \
      --batch-size "$batch" --steps "$steps" --warmup "$warmup" --threads "$threads" 2>/dev/null | sed "s/^{/{\"kind\": \"run\", \"round\": $round, /" >>"$raw"
  fi
done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$(($(date +%s) - start))

commit=$(git -C "$root" rev-parse --short HEAD)
dirty=$(git -C "$root" status --porcelain --untracked-files=no | grep -q . && echo "+dirty" || true)
suffix=$([[ $quick -eq 1 ]] && echo "_quick" || true)
mkdir -p "$out"
file="$out/cpu_peers_$(date -u +%Y-%m-%d)_${commit}${suffix}.md"
"$py" - "$raw" "$file" <<PY
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peak = next(r for r in rows if r["kind"] == "peak")["fma_peak_gflops"]
flops = {(r["model"], r["image_size"]): r for r in rows if r["kind"] == "flops"}
runs = [r for r in rows if r["kind"] == "run"]
cases = []
for r in runs:
    key = (r["model"], r["image_size"], r["batch"])
    if key not in cases:
        cases.append(key)
def get(fw, key):
    """The framework's median round of the case (the lower median for an even count), in its faster
    layout when it ran two (PyTorch's ResNets)."""
    rs = [r for r in runs if r["framework"] == fw and (r["model"], r["image_size"], r["batch"]) == key]
    layouts = {}
    for r in rs:
        layouts.setdefault(r.get("memory_format", ""), []).append(r)
    medians = [sorted(l, key=lambda r: r["images_per_s"])[(len(l) - 1) // 2] for l in layouts.values()]
    return max(medians, key=lambda r: r["images_per_s"]) if medians else None
def ips(r):
    if not r:
        return "-"
    layout = " (channels_last)" if r.get("memory_format") == "channels_last" else ""
    return f'{r["images_per_s"]:.1f}{layout}'
def cpu_ms(r):
    return f'{1000 * (r["user_s_per_step"] + r["sys_s_per_step"]) / r["batch"]:.1f}' if r else "-"
versions = {r["framework"]: r.get("version", "") for r in runs}
L = []
L.append("# minidl beside PyTorch and Keras on the CPU" + (" (--quick: plumbing check, not a measurement)" if $quick else ""))
L.append("")
L.append("Written by \`bash bench/compare_cpu.sh$([[ $quick -eq 1 ]] && echo ' --quick') --threads $threads\` (issue 28).")
L.append("")
L.append("- **commit**: \`${commit}${dirty}\`; **date**: $(date -u '+%Y-%m-%d %H:%M') UTC; **run time**: ${elapsed} s")
L.append("- **machine**: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $threads threads for every framework")
L.append("- **load average** (1, 5, 15 min) before: $load_before; after: $load_after. A run whose load before exceeds")
L.append("  a fraction of a core measured other engineers' work too: its timings are under load, not final.")
L.append(f"- **FMA peak** ({r'minidl_bench_cpu_step --peak'}, same threads, same run): {peak:.1f} GFLOP/s")
L.append(f"- **versions**: PyTorch {versions.get('pytorch', '-')}; {versions.get('keras', 'Keras -')}")
L.append("- **models**: the small CNN of the Keras study (conv 32 3x3 + ReLU, max-pool 2, dense 128 + ReLU, dense 1),")
L.append("  torchvision's ResNet-18/50 (v1.5) with 2 classes, the same layers in Keras (channels-last, its own layout);")
L.append("  SGD lr 0.01, random inputs, $warmup warm-up step(s), then the median of $steps timed steps.")
L.append("- **rounds**: $rounds: every case ran $rounds time(s), round after round; a row shows each framework's")
L.append("  median round (the lower median for an even count).")
L.append("- **PyTorch's layout**: the ResNets run in NCHW and in channels_last (oneDNN's NHWC kernels), and the")
L.append("  table shows the faster, naming channels_last when it won; the small CNN runs in NCHW (its step is the")
L.append("  dense layer: 15.1 and 15.4 images/s at batch 16 in the two layouts).")
L.append("- **GFLOP/s**: training FLOPs per image (2 per multiply-add of every conv and dense layer: forward, weight")
L.append("  gradient, input gradient except the first layer's) x images/s. Convolutions are 99.99% of a ResNet's FLOPs,")
L.append("  so a ResNet row's share of the peak is a lower bound on its convolutions' share.")
L.append("- **CPU ms/img**: user + system CPU time per image (all threads), which the load disturbs less than wall time.")
L.append("")
L.append("| model | px | batch | minidl img/s | PyTorch img/s | Keras img/s | minidl / best peer | minidl GFLOP/s | % FMA peak (minidl / PyTorch / Keras) | CPU ms/img (minidl / PyTorch / Keras) |")
L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
over = []   # runs faster than the measured peak: the peak is wrong
for key in cases:
    m, t, k = get("minidl", key), get("pytorch", key), get("keras", key)
    peers = [r["images_per_s"] for r in (t, k) if r]
    ratio = f'{m["images_per_s"] / max(peers):.2f}x' if m and peers else "-"
    f = flops.get(key[:2])
    def pct(r):
        return f'{100 * f["train_flops_per_image"] * r["images_per_s"] / 1e9 / peak:.0f}%' if r and f else "-"
    gf = f'{f["train_flops_per_image"] * m["images_per_s"] / 1e9:.0f}' if m and f else "-"
    L.append(f"| {key[0]} | {key[1]} | {key[2]} | {ips(m)} | {ips(t)} | {ips(k)} | {ratio} | {gf} | {pct(m)} / {pct(t)} / {pct(k)} | {cpu_ms(m)} / {cpu_ms(t)} / {cpu_ms(k)} |")
    over += [f"{fw} {key[0]} batch {key[2]}" for fw, r in (("minidl", m), ("PyTorch", t), ("Keras", k))
             if r and f and f["train_flops_per_image"] * r["images_per_s"] / 1e9 > peak]
L.append("")
if over:
    L.append(f"**The FMA peak is wrong in this run**: {', '.join(over)} ran above it, so the machine sustains more than")
    L.append("the micro-benchmark measured and the % column is not a share of anything (check the benchmark's loop:")
    L.append("tests/tools/fma_loop_test.sh).")
    L.append("")
L.append("Per-image time of minidl as the batch grows (ms of wall time per image):")
L.append("")
for model in sorted({c[0] for c in cases}):
    ms = [(c[2], get("minidl", c)) for c in cases if c[0] == model and get("minidl", c)]
    if len(ms) > 1:
        L.append(f"- {model}: " + ", ".join(f"batch {b}: {1000 / r['images_per_s']:.2f}" for b, r in ms))
L.append("")
L.append("Raw lines (minidl_bench_cpu_step and bench/cpu_peers.py):")
L.append("")
L.append("\`\`\`")
L.extend(json.dumps(r) for r in rows)
L.append("\`\`\`")
open(sys.argv[2], "w").write("\n".join(L) + "\n")
print(sys.argv[2])
PY
