# shellcheck shell=bash
# Sourced by the tools/gpu_*.sh scripts (not run on its own): what they need on and for a
# GPU machine, written once: is there a usable GPU, where are cuDNN/cuBLAS/cudart (a GPU machine
# often has them only inside its PyTorch wheels), and how to run a step under a wall-clock deadline.
#
#   gpu_env_detect_gpu            sets GPU_NAME, GPU_DRIVER, GPU_MEM, GPU_LINE; with REHEARSE=1 (the
#                                 scripts' --rehearse) a placeholder instead. Without a GPU it prints
#                                 one line to stderr and returns 2.
#   gpu_env_lib_path DIR...       exports LD_LIBRARY_PATH: DIR... first (the staged libraries), then
#                                 python3's site-packages nvidia/*/lib, nvidia/*/*/lib and torch/lib,
#                                 /usr/local/nvidia/lib64, /usr/local/cuda*/lib64 and lib,
#                                 /usr/lib/x86_64-linux-gnu, then what LD_LIBRARY_PATH held before.
#   gpu_env_missing_libs EXE...   prints the libraries the executables cannot find (empty: none).
#   gpu_env_cuda_libs EXE         prints "libcudnn.so.9 -> PATH, ..." as resolved for EXE.
#   gpu_env_machine_md            Markdown lines: GPU, driver, host, cores, memory, CUDA toolkit.
#   gpu_env_run_until SIG SECS GRACE LOG CMD...
#                                 runs CMD with stdout+stderr to LOG; at SECS sends SIG (INT for the
#                                 experiment programs, which then stop at a step boundary and write
#                                 what they have; TERM for the rest: a SIGINT ignored by the caller
#                                 stays ignored in Python and GoogleTest), GRACE seconds later
#                                 SIGKILL. Returns CMD's status, 124 when stopped by SIG, 137 when
#                                 killed. SECS <= 0: not run, returns 124.
#   gpu_env_stop_child GRACE      from a SIGTERM trap: stops the step gpu_env_run_until is running
#                                 (its SIG, then SIGKILL after GRACE seconds).
#   say MSG / die CODE MSG        "<GPU_ENV_PROG>: MSG" on stdout / on stderr, then exit CODE.
#   gpu_env_min N...              the smallest of the whole numbers.
#   gpu_env_unpack TARBALL DIR    unpacks a .tar.xz stage into DIR (xz, or Python's lzma where a
#                                 minimal image has no xz-utils); returns non-zero on failure.
#   gpu_env_torch_python          sets TORCH_PY (the first of python3, /opt/*/.venv/bin/python3 that
#                                 imports torch; python3 when none does) and TORCH_LINE (its torch,
#                                 CUDA and cuDNN versions, or "not importable").
# Needs bash and coreutils' timeout; uses python3 only to list site-packages.

say() { printf '%s: %s\n' "${GPU_ENV_PROG:-gpu_env}" "$*"; }
die() { local code=$1; shift; printf '%s: %s\n' "${GPU_ENV_PROG:-gpu_env}" "$*" >&2; exit "$code"; }
gpu_env_min() { local m=$1 v; for v in "$@"; do ((v < m)) && m=$v; done; echo "$m"; }

gpu_env_detect_gpu() {
  if [[ "${REHEARSE:-0}" == 1 ]]; then
    GPU_NAME="none (CPU rehearsal)"; GPU_DRIVER="none"; GPU_MEM="none"
    GPU_LINE="CPU rehearsal: no GPU used"
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    printf '%s: no NVIDIA GPU here (nvidia-smi is not installed); run this on a GPU machine, or with --rehearse to check the plumbing on the CPU\n' \
      "${GPU_ENV_PROG:-gpu_env}" >&2
    return 2
  fi
  local info
  info="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  if [[ -z "$info" ]] || ! nvidia-smi -L >/dev/null 2>&1; then
    printf '%s: no usable NVIDIA GPU: nvidia-smi failed (%s); check the driver, or use --rehearse on a CPU machine\n' \
      "${GPU_ENV_PROG:-gpu_env}" "${info:-no output}" >&2
    return 2
  fi
  GPU_NAME="$(echo "$info" | cut -d, -f1 | xargs)"
  GPU_DRIVER="$(echo "$info" | cut -d, -f2 | xargs)"
  GPU_MEM="$(echo "$info" | cut -d, -f3 | xargs)"
  GPU_LINE="$GPU_NAME, driver $GPU_DRIVER, $GPU_MEM"
  return 0
}

gpu_env_lib_path() {
  local dirs=() d
  for d in "$@"; do [[ -d "$d" ]] && dirs+=("$(cd "$d" && pwd)"); done
  # PyTorch's pip wheels keep cuDNN/cuBLAS/cudart under site-packages/nvidia/<name>/lib (or
  # nvidia/cu13/lib) and torch/lib: python3's site-packages, and the usual places of a Python
  # environment in case the python3 on PATH is not the one that holds PyTorch.
  local roots=() r pat
  if command -v python3 >/dev/null 2>&1; then
    while IFS= read -r d; do [[ -n "$d" ]] && roots+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import site
print("\n".join(list(site.getsitepackages()) + [site.getusersitepackages()]))
PY
)
  fi
  for r in /opt/*/.venv/lib/python3*/site-packages /opt/conda/lib/python3*/site-packages \
           /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages /usr/lib/python3/dist-packages; do
    [[ -d "$r" ]] && roots+=("$r")
  done
  for r in "${roots[@]}"; do
    for pat in "$r"/nvidia/*/lib "$r"/nvidia/*/*/lib "$r"/torch/lib; do
      [[ -d "$pat" ]] && compgen -G "$pat/lib*.so*" >/dev/null && [[ ":$(IFS=:; echo "${dirs[*]}"):" != *":$pat:"* ]] && dirs+=("$pat")
    done
  done
  for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  LD_LIBRARY_PATH="$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
}

gpu_env_missing_libs() {
  local e
  for e in "$@"; do ldd "$e" 2>/dev/null | grep 'not found'; done | sort -u
}

gpu_env_cuda_libs() {
  ldd "$1" 2>/dev/null | awk '$1 ~ /^lib(cudnn|cublas|cudart)\.so/ {printf "%s%s -> %s", sep, $1, $3; sep = ", "} END {print ""}'
}

gpu_env_machine_md() {
  echo "- GPU: ${GPU_LINE:-unknown}"
  echo "- host: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null) memory, kernel $(uname -r)"
  local nvcc
  nvcc="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)"
  [[ -n "$nvcc" ]] && echo "- CUDA toolkit: $("$nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1)"
  return 0
}

gpu_env_run_until() {
  local sig=$1 secs=$2 grace=$3 log=$4
  shift 4
  if (( secs <= 0 )); then
    echo "not run: no time left before the deadline" >"$log"
    return 124
  fi
  # Line-buffered (stdbuf), so the lines of a program stopped at the deadline are in LOG.
  local buf=() rc
  command -v stdbuf >/dev/null 2>&1 && buf=(stdbuf -oL -eL)
  # In the background and waited for, so that a trapped SIGTERM reaches the script at once (bash
  # runs traps only between commands; `wait` is interrupted by them); timeout makes its own process
  # group, which gpu_env_stop_child signals.
  timeout -s "$sig" -k "$grace" "$secs" "${buf[@]}" "$@" >"$log" 2>&1 </dev/null &
  GPU_ENV_CHILD=$! GPU_ENV_CHILD_SIG=$sig
  wait "$GPU_ENV_CHILD"
  rc=$?
  GPU_ENV_CHILD=""
  return "$rc"
}

# From a trap: asks the step running under gpu_env_run_until to stop (its own signal, to its
# process group), waits up to GRACE seconds, then kills it. Nothing when no step is running.
gpu_env_stop_child() {
  local grace=$1 pid=${GPU_ENV_CHILD:-} sig=${GPU_ENV_CHILD_SIG:-TERM} i
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -s "$sig" -- "-$pid" 2>/dev/null || kill -s "$sig" "$pid" 2>/dev/null
  for ((i = 0; i < grace * 10; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -s KILL -- "-$pid" 2>/dev/null || kill -s KILL "$pid" 2>/dev/null
  return 0
}

gpu_env_unpack() {
  local tarball=$1 dir=$2
  if command -v xz >/dev/null 2>&1; then
    tar -C "$dir" -xJf "$tarball"
  else
    python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1], "r:xz")
try: t.extractall(sys.argv[2], filter="tar")  # Python >= 3.12 warns without a filter
except TypeError: t.extractall(sys.argv[2])' "$tarball" "$dir"
  fi
}

gpu_env_torch_python() {
  local p t
  TORCH_PY=python3; TORCH_LINE="not importable"
  for p in python3 /opt/*/.venv/bin/python3; do
    command -v "$p" >/dev/null 2>&1 || continue
    if t="$(timeout 60 "$p" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null)"; then
      TORCH_PY="$p"; TORCH_LINE="$t ($p)"; return 0
    fi
  done
  return 0
}
