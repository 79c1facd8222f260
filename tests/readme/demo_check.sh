#!/usr/bin/env bash
# The first README command's main job, scripts/demo.sh, from a fresh build
# directory: it must say how the build is going before anything else (it used
# to build for minutes in silence), then train on 2 ranks with the loss
# falling and the replicas identical, under both comm hooks, and print the
# benchmark table with every result checked.
# It runs in a fresh copy of the tracked files, building in the default
# build/ as a user would (where ccache is installed, Meson uses it: the same
# relative paths as CI's release build make its objects hits).
set -uo pipefail
root=$1
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git -C "$root" ls-files -z | tar -C "$root" --null -T - -cf - | tar -C "$copy" -xf - ||
  { echo "cannot copy the tracked files of $root"; exit 1; }
out=$(cd "$copy" && BUILD=build BENCH_ARGS="-e 1M -n 3" scripts/demo.sh 2>&1); rc=$?
fail() { echo "$out"; echo "FAILED: $*"; exit 1; }
[ $rc = 0 ] || fail "demo.sh exited $rc"
progress=$(grep -c '^  build: ' <<<"$out")
[ "$progress" -ge 5 ] || fail "only $progress build progress lines"
first_training=$(grep -n 'training a' <<<"$out" | head -1 | cut -d: -f1)
last_progress=$(grep -n '^  build: 100%' <<<"$out" | cut -d: -f1)
[ -n "$last_progress" ] && [ "$last_progress" -lt "$first_training" ] || fail "no finished build before training"
[ "$(grep -c 'replicas identical on all 2 ranks: yes' <<<"$out")" = 2 ] || fail "replicas not identical twice"
first=$(grep -m1 'step    0  loss' <<<"$out" | sed -E 's/.*loss ([0-9.]+).*/\1/')
last=$(grep 'step  200  loss' <<<"$out" | sed -E 's/.*loss ([0-9.]+).*/\1/')
python3 -c "import sys; sys.exit(0 if float('$last') < float('$first') / 4 else 1)" ||
  fail "the loss did not fall ($first -> $last)"
grep -q 'Avg bus bandwidth' <<<"$out" || fail "no benchmark summary"
wrong=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { s += $NF } END { print s + 0 }' <<<"$out")
[ "$wrong" = 0 ] || fail "$wrong wrong benchmark results"
echo "demo: $progress progress lines, loss $first -> $last, benchmark checked"
