#!/usr/bin/env bash
# Rehearses a device-tool call on this machine, so a command meant for the GPU machine is checked
# before it costs device time: the call's view of the repository (tracked and untracked-not-ignored
# files plus the carried paths, nothing else, no .git) is copied to a fresh folder, the command runs
# there with a clean environment (env -i: PATH, HOME, LANG and OUT only), and what it left in $OUT is
# checked against what the tool returns (at most 8 files, 16 MiB each, $OUT/a/b/file deep, names of
# letters, digits, '.', '_', '-').
#
#   tools/gpu_rehearse.sh [--carry PATH]... [--dir DIR] [--limit SECONDS] -- COMMAND
#   --carry PATH    a git-ignored path the call carries (repeat, as the tool's `carry` list)
#   --dir DIR       where the copy goes (default: a new /tmp/gpu_rehearse.XXXXXX); DIR/tree is the
#                   repository, DIR/out is $OUT
#   --limit SECONDS the call's timeout_s (default 600): the command is killed then, as the tool does
#   COMMAND         one string, run by bash -c in the copy (as the tool's `command`); use the
#                   scripts' --rehearse flags, there is no GPU here
# Prints the carried size against the 64 MiB limit, the command's output, its exit status and the
# returned files. Exit status: the command's, or 3 when the copy is over 64 MiB or $OUT breaks a rule.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3
GPU_ENV_PROG=gpu_rehearse
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"   # say, die

CARRY=(); DIR=""; LIMIT=600
while [[ $# -gt 0 ]]; do
  case "$1" in
    --carry) CARRY+=("${2:?--carry needs a path}"); shift 2 ;;
    --dir) DIR="${2:?--dir needs a folder}"; shift 2 ;;
    --limit) LIMIT="${2:?--limit needs seconds}"; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die 3 "unknown argument '$1'; the command goes after -- (see --help)" ;;
  esac
done
[[ $# -gt 0 ]] || die 3 "no command after -- (see --help)"
COMMAND="$*"
[[ ${#COMMAND} -le 2000 ]] || die 3 "the command is ${#COMMAND} characters; the tool takes at most 2000"
[[ ${#CARRY[@]} -le 8 ]] || die 3 "${#CARRY[@]} carried paths; the tool takes at most 8"
for c in "${CARRY[@]}"; do
  [[ -e "$c" ]] || say "carried path $c does not exist here (the tool removes it there)"
  [[ ! -e "$c" ]] || git check-ignore -q "$c" || say "WARNING: $c is not git-ignored: it travels anyway, carried or not"
done

[[ -n "$DIR" ]] || DIR="$(mktemp -d /tmp/gpu_rehearse.XXXXXX)"
rm -rf "$DIR/tree" "$DIR/out" && mkdir -p "$DIR/tree" "$DIR/out" "$DIR/home" || die 3 "cannot create $DIR"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -C "$DIR/tree" -xf - || die 3 "copying the working tree failed"
for c in "${CARRY[@]}"; do
  [[ -e "$c" ]] && { mkdir -p "$DIR/tree/$(dirname "$c")"; cp -R "$c" "$DIR/tree/$c" || die 3 "copying $c failed"; }
done
bytes="$(du -sb "$DIR/tree" | cut -f1)"
say "copy in $DIR/tree: $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB of the 64 MiB a call may carry (carry: ${CARRY[*]:-none})"
(( bytes <= 64 * 1048576 )) || die 3 "over the 64 MiB limit: the tool would refuse this call"

say "running (limit ${LIMIT} s): $COMMAND"
(cd "$DIR/tree" && timeout -k 5 "$LIMIT" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME="$DIR/home" LANG=C.UTF-8 OUT="$DIR/out" bash -c "$COMMAND")
rc=$?
say "exit status $rc"

# What the tool would return from $OUT.
bad=0; n=0
while IFS= read -r -d '' f; do
  rel="${f#"$DIR/out/"}"
  n=$((n + 1))
  size="$(stat -c %s "$f")"
  why=""
  [[ "$rel" =~ ^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$ ]] || why="name or depth not returned"
  (( size <= 16 * 1048576 )) || why="over 16 MiB"
  [[ -n "$why" ]] && bad=1
  printf '  $OUT/%s  %s bytes%s\n' "$rel" "$size" "${why:+  <- $why}"
done < <(find "$DIR/out" -type f -print0 | sort -z)
(( n <= 8 )) || { bad=1; say "$n files in \$OUT: the tool returns at most 8"; }
[[ $bad == 0 ]] || { say "\$OUT breaks a rule of the tool (above)"; exit 3; }
exit "$rc"
