#!/usr/bin/env bash
# collie's mpi backend beside raw MPI_Allreduce (bench/peers/mpi_allreduce,
# the anchors' program) on the same Open MPI paths: shared memory (vader)
# and TCP over loopback. Same sweep, schedule and statistic (bench/schedule.h),
# interleaved REPS times; per-size medians as a markdown table, with the
# mpi backend with its cross-rank check of each collective as it comes
# (the default: through shared memory, all ranks being on this host), by
# MPI messages as across hosts (COLLIE_MPI_CHECK=2), and without
# (COLLIE_MPI_CHECK=0).
#   bench/mpi_compare.sh [REPS] [NP] [-- sweep args (-b, -e, -f, -n)]
# Without sweep args: 8 B to 32 KiB with 500 samples per size, then
# 128 KiB to 256 MiB with 20.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; NP=${2:-2}; shift 2 || true
[ "${1:-}" = "--" ] && shift
BUILD=${BUILD:-build}
MPI_BENCH="$BUILD/bench/mpi_allreduce"
[ -x "$MPI_BENCH" ] || { echo "mpi_compare.sh: $MPI_BENCH is missing (configure with Open MPI installed)" >&2; exit 1; }
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP" --mca pml ob1)
if [ $# -gt 0 ]; then SWEEPS=("$*"); else SWEEPS=("-b 8 -e 32K -f 4 -n 500" "-b 128K -e 256M -f 4 -n 20"); fi
PATHS=("sm:--mca btl self,vader" "tcp:--mca btl self,tcp --mca btl_tcp_if_include lo")
tmp=$(mktemp -d)
for r in $(seq 1 "$REPS"); do
  for i in "${!SWEEPS[@]}"; do
    read -r -a sweep <<< "${SWEEPS[$i]}"
    for p in "${PATHS[@]}"; do
      name=${p%%:*}
      read -r -a mca <<< "${p#*:}"
      "${MPIRUN[@]}" "${mca[@]}" "$MPI_BENCH" "${sweep[@]}" > "$tmp/raw_$name.$r.$i"
      "${MPIRUN[@]}" "${mca[@]}" -x COLLIE_BACKEND=mpi "$BUILD/bench/collie-bench" "${sweep[@]}" \
        > "$tmp/collie_$name.$r.$i"
      "${MPIRUN[@]}" "${mca[@]}" -x COLLIE_BACKEND=mpi -x COLLIE_MPI_CHECK=2 \
        "$BUILD/bench/collie-bench" "${sweep[@]}" > "$tmp/msgcheck_$name.$r.$i"
      "${MPIRUN[@]}" "${mca[@]}" -x COLLIE_BACKEND=mpi -x COLLIE_MPI_CHECK=0 \
        "$BUILD/bench/collie-bench" "${sweep[@]}" > "$tmp/nocheck_$name.$r.$i"
    done
  done
done
python3 - "$NP" "$tmp" "$REPS" <<'PY'
import sys
sys.path.insert(0, "bench")
from runs import load, size_label as size
n, tmp, reps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
print(f"{n} ranks, f32 sum, out of place; per-size median over {reps} interleaved runs; time in us; "
      "ratio = raw MPI time / collie time (above 1: collie faster)")
for path in ("sm", "tcp"):
    raw, col, msg, nochk = (load(f"{tmp}/{k}_{path}.*.*")
                            for k in ("raw", "collie", "msgcheck", "nocheck"))
    print()
    print(f"Open MPI {path}:")
    print()
    print("| size | raw MPI_Allreduce us | collie mpi us | ratio | COLLIE_MPI_CHECK=2 us | ratio "
          "| COLLIE_MPI_CHECK=0 us | ratio | wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nan = (float("nan"), 0)
    for s in sorted(raw):
        r, c, m, k = raw[s], col.get(s, nan), msg.get(s, nan), nochk.get(s, nan)
        print(f"| {size(s)} | {r[0]:.1f} | {c[0]:.1f} | {r[0] / c[0]:.2f}x | {m[0]:.1f} | "
              f"{r[0] / m[0]:.2f}x | {k[0]:.1f} | {r[0] / k[0]:.2f}x | {r[1] + c[1] + m[1] + k[1]} |")
PY
rm -rf "$tmp"
