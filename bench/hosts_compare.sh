#!/usr/bin/env bash
# 2 hosts x 2 ranks: two network namespaces joined by a veth pair shaped with
# tc tbf to RATE in each direction (tests/launch/hosts.sh; needs root).
# Beside collie's hierarchical all-reduce (hier) and its flat TCP ring
# (tcp), where Open MPI is built in: collie's mpi backend, Open MPI's own
# MPI_Allreduce with its default choice (tuned) and with its hierarchical
# component (han, coll_han_priority 100), all four under one mpirun across
# the two namespaces; and Gloo's ring (build/bench/gloo_allreduce), when
# built. Same sweep, schedule and statistic as compare.sh (bench/schedule.h:
# the median of -n samples of the slowest rank), interleaved REPS times;
# prints per-size medians as a markdown table.
#   bench/hosts_compare.sh [REPS] [RATE|none] [-- sweep args]
# Defaults: 3 repetitions, 10gbit, 8 B to 32 KiB (-n 200) and 128 KiB to
# 256 MiB (-n 10); give one sweep (e.g. -- -b 1M -e 256M -f 4 -n 10) to
# replace both. No delay is added: this kernel's tc has no netem.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; RATE=${2:-10gbit}; shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
BUILD=${BUILD:-build}
if [ $# -gt 0 ]; then SWEEPS=("$*"); else SWEEPS=("-b 8 -e 32K -f 4 -n 200" "-b 128K -e 256M -f 4 -n 10"); fi
MODE=netns:$RATE
[ "$RATE" = none ] && MODE=netns
BENCH=$BUILD/bench/collie-bench MPI_BENCH=$BUILD/bench/mpi_allreduce GLOO_BENCH=$BUILD/bench/gloo_allreduce
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The two hosts share this machine's cores (2 ranks a host, 4 on 2 cores
# here), which neither host's launcher can see: every library is told its
# node is crowded, so that a rank waiting hands its CPU over. Open MPI
# (mpi_yield_when_idle) and collie (which takes Open MPI's verdict,
# mpi_oversubscribe, as its own: base/tuning.cc) alike.
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_mpi_oversubscribe=1
hosts() { bash tests/launch/hosts.sh "$MODE" "$BUILD" "$@"; }
for r in $(seq 1 "$REPS"); do
  for i in "${!SWEEPS[@]}"; do
    read -r -a sweep <<< "${SWEEPS[$i]}"
    for be in hier tcp; do
      COLLIE_BACKEND=$be hosts "$BENCH" "${sweep[@]}" > "$tmp/$be.$r.$i"
    done
    if [ -x "$MPI_BENCH" ] && command -v mpirun >/dev/null; then
      export HOSTS_LAUNCHER=mpirun
      COLLIE_BACKEND=mpi hosts "$BENCH" "${sweep[@]}" > "$tmp/mpi.$r.$i"
      hosts "$MPI_BENCH" "${sweep[@]}" > "$tmp/ompi_tuned.$r.$i"
      OMPI_MCA_coll_han_priority=100 hosts "$MPI_BENCH" "${sweep[@]}" > "$tmp/ompi_han.$r.$i"
      unset HOSTS_LAUNCHER
    fi
    if [ -x "$GLOO_BENCH" ]; then
      GLOO_PEER_DIR=$tmp/gloo-store.$r.$i hosts "$GLOO_BENCH" "${sweep[@]}" > "$tmp/gloo.$r.$i"
    fi
  done
done
python3 - "$tmp" "$REPS" "$RATE" <<'PY'
import math, re, sys
sys.path.insert(0, "bench")
from runs import allreduce_busbw, load, size_label as size
tmp, reps, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = {"hier": "hier", "tcp": "flat tcp", "mpi": "collie mpi", "ompi_tuned": "Open MPI tuned",
         "ompi_han": "Open MPI han", "gloo": "Gloo"}
got = {k: load(f"{tmp}/{k}.*") for k in names}
got = {k: v for k, v in got.items() if v}
nan = (math.nan, 0)
m = re.fullmatch(r"(\d+)gbit", rate)
limit = int(m.group(1)) / 8 if m else None  # GB/s each way
print(f"2 hosts x 2 ranks (network namespaces, veth, tbf {rate} each way, no added delay), f32 "
      f"sum; per-size median over {reps} interleaved runs; time in us; algbw = size / time, "
      "GB/s" + (f" (the link's limit for a 2-host all-reduce: {limit:.3f})" if limit else ""))
print()
cols = list(got)
peers = [k for k in ("ompi_tuned", "ompi_han") if k in got]
print("| size | " + " | ".join(f"{names[k]} us" for k in cols) + " | hier algbw |" +
      ("hier / best Open MPI |" if peers else "") + " wrong |")
print("|---:" * (len(cols) + 3 + bool(peers)) + "|")
for s in sorted(got["hier"]):
    t = {k: got[k].get(s, nan) for k in cols}
    row = f"| {size(s)} | " + " | ".join(f"{t[k][0]:.1f}" for k in cols)
    row += f" | {s / t['hier'][0] / 1e3:.3f} |"
    if peers:
        best = min(t[k][0] for k in peers)
        row += f" {best / t['hier'][0]:.2f}x |"
    print(row + f" {sum(v[1] for v in t.values())} |")
PY
