#!/usr/bin/env bash
# Runs a collie-bench sweep REPS times (default 3) and prints, per size, the
# median time over the runs with its busbw and the spread of busbw: one run on
# a shared 2-core VM strays by 2x at mid sizes, a median of runs does not.
#   bench/median_runs.sh [REPS] [NP] -- collie-bench args...
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; NP=${2:-2}; shift 2 || true
[ "${1:-}" = "--" ] && shift
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
for r in $(seq 1 "$REPS"); do
  "$BUILD/comm/launch/collie-run" -n "$NP" "$BUILD/bench/collie-bench" "$@" > "$tmp/run$r.txt"
done
python3 - "$NP" "$tmp"/run*.txt <<'PY'
import statistics, sys
n = int(sys.argv[1])
rows = {}
for path in sys.argv[2:]:
    for line in open(path):
        f = line.split()
        if len(f) >= 9 and f[0] == "[0]" and f[1].isdigit():
            rows.setdefault(int(f[1]), []).append((float(f[5]), int(f[-1]) if f[-1].isdigit() else 0))
print(f"| size (B) | median time (us) | busbw GB/s (median) | busbw range over {len(sys.argv)-2} runs | wrong |")
print("|---:|---:|---:|---:|---:|")
for size in sorted(rows):
    times = [t for t, _ in rows[size]]
    bw = lambda t: size / t / 1e3 * 2 * (n - 1) / n
    med = statistics.median(times)
    print(f"| {size} | {med:.1f} | {bw(med):.3f} | {bw(max(times)):.3f} .. {bw(min(times)):.3f} | {sum(w for _, w in rows[size])} |")
PY
rm -rf "$tmp"
