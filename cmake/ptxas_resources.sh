#!/bin/sh
# The compiler launcher of minidl's CUDA sources (cmake/kernel_resources.cmake): runs the compile
# (through the next launcher, e.g. ccache, when there is one) with nvcc's --resource-usage and
# writes ptxas's report of every kernel (registers, spills, stack, static shared memory) to
# OUT_DIR/<object>.txt for the H100 step-time model; the report's lines stay out of the build log.
# Usage: ptxas_resources.sh OUT_DIR COMPILER_AND_ARGUMENTS...
out_dir=$1
shift
obj=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && obj=$a
  prev=$a
done
tmp=$(mktemp) || exit 1
"$@" --resource-usage 2>"$tmp"
status=$?
pattern='^ptxas info|^ +[0-9]+ bytes stack frame'
if [ "$status" -eq 0 ] && [ -n "$obj" ]; then
  mkdir -p "$out_dir"
  report="$out_dir/$(basename "$obj" .o).txt"
  grep -E "$pattern" "$tmp" >"$report.part"
  mv "$report.part" "$report"
fi
grep -vE "$pattern" "$tmp" >&2
rm -f "$tmp"
exit "$status"
