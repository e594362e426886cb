#!/usr/bin/env bash
# The FMA peak of bench/compare_cpu.sh is the denominator of every "% of FMA peak" it reports, so
# its inner loop must be what it claims: independent FMA chains in registers, nothing else. GCC 12
# once kept the chains in memory (twelve 512-bit stores an iteration) and the "peak" came out at
# half the machine's, below what the ResNet steps of every framework sustained. This disassembles
# minidl_bench_cpu_step's fma_chains() and fails if its hottest loop writes memory or has fewer
# FMAs than chains.
#   tests/tools/fma_loop_test.sh PATH/TO/minidl_bench_cpu_step
set -uo pipefail
bin="${1:?path to minidl_bench_cpu_step}"
command -v objdump >/dev/null || { echo "FAIL: objdump (binutils) is missing"; exit 1; }
asm="$(objdump -d -C --no-show-raw-insn "$bin" | awk '/^[0-9a-f]+ <.*fma_chains\(/ { on = 1; next } on && /^$/ { exit } on')"
[[ -n $asm ]] || { echo "FAIL: no fma_chains() in $bin (renamed, or inlined again?)"; exit 1; }
# The loop: the backward conditional jump whose body (from its target to the jump) holds the most
# FMAs. Every line is "  ADDR:\tMNEMONIC OPERANDS"; AT&T syntax puts the destination last.
echo "$asm" | awk '
  function hex(s,   v, i) { v = 0; for (i = 1; i <= length(s); ++i) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1; return v }
  { sub(/^ +/, ""); split($0, f, /:\t/); addr = hex(f[1]); text[NR] = f[2]; at[NR] = addr; n = NR }
  END {
    best = 0
    for (i = 1; i <= n; ++i) {
      if (text[i] !~ /^j[a-z]+ +[0-9a-f]+ /) continue
      split(text[i], t, / +/); target = hex(t[2])
      if (target >= at[i]) continue
      fmas = 0; stores = 0; first_store = ""
      for (k = 1; k <= i; ++k) {
        if (at[k] < target) continue
        if (text[k] ~ /^vfmadd/) ++fmas
        ops = text[k]; sub(/^[a-z0-9]+ +/, "", ops)
        if (text[k] !~ /^(j|cmp|test|nop|prefetch)/ && ops ~ /\)$/) { ++stores; if (first_store == "") first_store = text[k] }
      }
      if (fmas > best) { best = fmas; best_stores = stores; store = first_store }
    }
    if (best < 12) { printf "FAIL: the hottest loop of fma_chains() has %d FMAs, expected one per chain (12)\n", best; exit 1 }
    if (best_stores > 0) { printf "FAIL: the FMA loop writes memory %d times an iteration (first: %s): the chains are not in registers\n", best_stores, store; exit 1 }
    printf "ok: fma_chains() loop: %d FMAs an iteration, no stores\n", best
  }'
