#!/usr/bin/env bash
# Compares two builds of collie-bench: REPS runs of each, interleaved (A, B,
# A, B, ...) so that both see the same machine noise, and prints per size the
# median time over the runs for each build and their ratio (B / A time: below
# 1 means B is faster).
#   bench/ab_runs.sh BUILD_A BUILD_B [REPS] [NP] -- collie-bench args...
# ENV_A, ENV_B: variables for A's or B's runs only, e.g. one build against
# itself with ENV_B=COLLIE_DETERMINISTIC=1.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1; B=$2; shift 2
REPS=${1:-5}; NP=${2:-2}; shift 2 || true
[ "${1:-}" = "--" ] && shift
tmp=$(mktemp -d)
for r in $(seq 1 "$REPS"); do
  for side in A B; do
    build=$A vars=${ENV_A:-}
    [ "$side" = B ] && build=$B vars=${ENV_B:-}
    # shellcheck disable=SC2086 # vars is a list of NAME=value words
    env $vars "$build/comm/launch/collie-run" -n "$NP" "$build/bench/collie-bench" "$@" \
      > "$tmp/$side$r.txt"
  done
done
python3 - "$A" "$B" "$tmp" "$REPS" <<'PY'
import statistics, sys, glob
a, b, tmp, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def read(side):
    rows = {}
    for path in sorted(glob.glob(f"{tmp}/{side}*.txt")):
        for line in open(path):
            f = line.split()
            if len(f) >= 9 and f[0] == "[0]" and f[1].isdigit():
                if f[-1].isdigit() and int(f[-1]) != 0:
                    sys.exit(f"{path}: {f[-1]} wrong results at {f[1]} B")
                rows.setdefault(int(f[1]), []).append(float(f[5]))
    return rows
ra, rb = read("A"), read("B")
print(f"A = {a}, B = {b}; median time over {reps} interleaved runs each")
print("| size (B) | A time (us) | B time (us) | B / A |")
print("|---:|---:|---:|---:|")
for size in sorted(ra):
    ta, tb = statistics.median(ra[size]), statistics.median(rb[size])
    us = lambda t: f"{t:.3f}" if t < 10 else f"{t:.1f}"  # sub-us times need the digits
    print(f"| {size} | {us(ta)} | {us(tb)} | {tb / ta:.2f} |")
PY
rm -rf "$tmp"
