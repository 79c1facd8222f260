#!/usr/bin/env bash
# collie's hierarchical all-reduce (hier) beside its flat TCP ring (tcp) on
# 2 hosts x 2 ranks: two network namespaces joined by a veth pair shaped
# with tc tbf to RATE (tests/launch/hosts.sh; needs root). Same sweep and
# statistic as compare.sh (bench/schedule.h: the median of -n samples),
# interleaved REPS times; prints per-size medians as a markdown table.
#   bench/hosts_compare.sh [REPS] [RATE|none] [-- sweep args]
# Defaults: 3 repetitions, 10gbit, 1 MiB to 64 MiB with 20 timed ops.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; RATE=${2:-10gbit}; shift 2 || true
[ "${1:-}" = "--" ] && shift
BUILD=${BUILD:-build}
if [ $# -gt 0 ]; then SWEEP=("$@"); else SWEEP=(-b 1M -e 64M -f 4 -n 20); fi
MODE=netns:$RATE
[ "$RATE" = none ] && MODE=netns
tmp=$(mktemp -d)
for r in $(seq 1 "$REPS"); do
  for be in hier tcp; do
    COLLIE_BACKEND=$be bash tests/launch/hosts.sh "$MODE" "$BUILD" "$BUILD/bench/collie-bench" \
      "${SWEEP[@]}" > "$tmp/$be.$r"
  done
done
python3 - "$tmp" "$REPS" "$RATE" <<'PY'
import sys
sys.path.insert(0, "bench")
from runs import allreduce_busbw, load, size_label as size
tmp, reps, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hier, tcp = load(f"{tmp}/hier.*"), load(f"{tmp}/tcp.*")
bw = lambda s, t: allreduce_busbw(s, t, 4)
print(f"2 hosts x 2 ranks (network namespaces, veth, tbf {rate}), f32 sum; per-size median over "
      f"{reps} interleaved runs; time in us, busbw in GB/s")
print()
print("| size | hier us | busbw | flat tcp us | busbw | hier speed-up | wrong |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in sorted(hier):
    h, t = hier[s], tcp.get(s, (float("nan"), 0))
    print(f"| {size(s)} | {h[0]:.0f} | {bw(s, h[0]):.3f} | {t[0]:.0f} | {bw(s, t[0]):.3f} | "
          f"{t[0] / h[0]:.2f}x | {h[1] + t[1]} |")
PY
rm -rf "$tmp"
