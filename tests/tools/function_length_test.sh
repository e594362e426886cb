#!/usr/bin/env bash
# Every function of the product tree (all code but tests/, lab/ and committed results) fits in 120
# lines, the most a reader takes in at once (DESIGN.md, Conventions): a longer one is a set of named
# steps waiting to be written down. Measured by lizard (PyPI; tools/install_deps.sh puts it in
# .tools/lizard), which parses C++, CUDA and Python without a build. Usage: ROOT [LIMIT].
set -euo pipefail
root=$1 limit=${2:-120}
cd "$root"
export PYTHONPATH=$root/.tools/lizard${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import lizard' 2> /dev/null; then
  echo "FAIL: lizard is not installed; run: bash tools/install_deps.sh (it installs lizard into .tools/lizard)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files -- '*.cpp' '*.h' '*.cu' '*.cuh' '*.py' |
                     grep -vE '^(tests|lab|bench/results|experiments/results)/')
(( ${#files[@]} > 100 )) || { echo "FAIL: only ${#files[@]} source files found under $root" >&2; exit 1; }
# -w: warnings only; -L: the length limit; the cyclomatic and argument limits are not ours.
out=$(python3 -m lizard -w -L "$limit" -C 1000000 -a 1000 "${files[@]}" || true)
if [[ -n $out ]]; then
  echo "FAIL: functions longer than $limit lines (split each into named steps):" >&2
  echo "$out" >&2
  exit 1
fi
echo "ok: ${#files[@]} files, no function longer than $limit lines"
