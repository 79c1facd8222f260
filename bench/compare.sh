#!/usr/bin/env bash
# Runs collie (shm and tcp), Open MPI (shared memory and TCP) and Gloo (its
# ring over TCP, when build/bench/gloo_allreduce is built) with the
# same sweep, schedule and statistic (bench/schedule.h: per size, 5 warm-up
# ops, then -n samples of a barrier and a batch of back-to-back ops, 10 up
# to 64 KiB; time = the median sample of the slowest rank), interleaved REPS
# times, and prints per-size medians over the repetitions as a markdown
# table.
#   bench/compare.sh [REPS] [NP] [-- sweep args (-b, -e, -f, -n)]
# With PLOT=file.png (and gnuplot), it also draws busbw and time against
# size, one line per library, into that file. COLL=alltoall: the
# all-to-all instead (-C alltoall to collie-bench and to both peers; no
# in-place column: it runs out of place). NO_GLOO=1: without Gloo (at 3 and 4
# ranks its large sizes take most of a run).
# Without sweep args: 8 B to 32 KiB with 500 samples per size, then 128 KiB
# to 256 MiB with 20. Needs a build with Open MPI
# (build/bench/mpi_allreduce).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}; NP=${2:-2}; shift 2 || true
[ "${1:-}" = "--" ] && shift
BUILD=${BUILD:-build}
COLL=${COLL:-allreduce}
MPI_BENCH="$BUILD/bench/mpi_allreduce"
[ -x "$MPI_BENCH" ] || { echo "compare.sh: $MPI_BENCH is missing (configure with Open MPI installed)" >&2; exit 1; }
GLOO_BENCH="$BUILD/bench/gloo_allreduce"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP" --mca pml ob1)
if [ $# -gt 0 ]; then SWEEPS=("$*"); else SWEEPS=("-b 8 -e 32K -f 4 -n 500" "-b 128K -e 256M -f 4 -n 20"); fi
tmp=$(mktemp -d)
for r in $(seq 1 "$REPS"); do
  for i in "${!SWEEPS[@]}"; do
    read -r -a sweep <<< "${SWEEPS[$i]}"
    sweep+=(-C "$COLL")
    "$BUILD/comm/launch/collie-run" -n "$NP" "$BUILD/bench/collie-bench" -B shm "${sweep[@]}" > "$tmp/collie_shm.$r.$i"
    if [ "$COLL" = allreduce ]; then
      "$BUILD/comm/launch/collie-run" -n "$NP" "$BUILD/bench/collie-bench" -B shm -i 1 -M 1 "${sweep[@]}" > "$tmp/collie_mem.$r.$i"
    fi
    "${MPIRUN[@]}" --mca btl self,vader "$MPI_BENCH" "${sweep[@]}" > "$tmp/mpi_sm.$r.$i"
    "$BUILD/comm/launch/collie-run" -n "$NP" "$BUILD/bench/collie-bench" -B tcp "${sweep[@]}" > "$tmp/collie_tcp.$r.$i"
    "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$MPI_BENCH" "${sweep[@]}" > "$tmp/mpi_tcp.$r.$i"
    if [ -x "$GLOO_BENCH" ] && [ -z "${NO_GLOO:-}" ]; then
      "$BUILD/comm/launch/collie-run" -n "$NP" "$GLOO_BENCH" "${sweep[@]}" > "$tmp/gloo.$r.$i"
    fi
  done
done
python3 - "$NP" "$tmp" "$REPS" "${PLOT:-}" "$COLL" <<'PY'
import subprocess, sys
sys.path.insert(0, "bench")
from runs import allreduce_busbw, load, size_label as size
n, tmp, reps, plot, coll = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
cfgs = {c: load(f"{tmp}/{c}.*.*") for c in ["collie_shm", "mpi_sm", "collie_tcp", "mpi_tcp", "gloo", "collie_mem"]}
# nccl-tests' busbw: 2(n-1)/n of algbw for an all-reduce, (n-1)/n for an all-to-all.
bw = lambda s, t: allreduce_busbw(s, t, n) / (2 if coll == "alltoall" else 1)
us = lambda t: f"{t:.2f}" if t < 10 else f"{t:.1f}"  # sub-us times need the second digit
print(f"{coll}, {n} ranks, f32" + (" sum" if coll == "allreduce" else "") + ", out of place (shm mem: in place in communicator memory, -i 1 -M 1); "
      f"per-size median over {reps} interleaved runs; time in us, busbw in GB/s")
print()
print("| size | collie shm us | busbw | Open MPI sm us | busbw | shm / MPI sm | shm mem us | busbw | mem / MPI sm | collie tcp us | busbw | Open MPI tcp us | busbw | tcp / MPI tcp | Gloo us | tcp / Gloo | wrong |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in sorted(cfgs["collie_shm"]):
    c = [cfgs[k].get(s, (float("nan"), 0)) for k in cfgs]
    wrong = sum(x[1] for x in c)
    print(f"| {size(s)} | {us(c[0][0])} | {bw(s, c[0][0]):.3f} | {us(c[1][0])} | {bw(s, c[1][0]):.3f} | "
          f"{c[1][0] / c[0][0]:.2f}x | {us(c[5][0])} | {bw(s, c[5][0]):.3f} | {c[1][0] / c[5][0]:.2f}x | {us(c[2][0])} | {bw(s, c[2][0]):.3f} | {us(c[3][0])} | {bw(s, c[3][0]):.3f} | "
          f"{c[3][0] / c[2][0]:.2f}x | {us(c[4][0])} | {c[4][0] / c[2][0]:.2f}x | {wrong} |")
if plot:
    names = {"collie_shm": "collie shm", "mpi_sm": "Open MPI sm", "collie_tcp": "collie tcp",
             "mpi_tcp": "Open MPI tcp", "gloo": "Gloo", "collie_mem": "collie shm, comm memory"}
    series = [(names[k], v) for k, v in cfgs.items() if v]
    script = ["set terminal pngcairo size 1000,900 font ',10'", f"set output '{plot}'",
              f"set multiplot layout 2,1 title '{n} ranks, f32 sum: per-size medians of {reps} runs'",
              "set logscale x 2", "set format x '%.0b%BB'", "set grid", "set key top left",
              "set xlabel 'size'"]
    for panel, ylabel, col in (("bw", "busbw (GB/s)", 0), ("t", "time (us)", 1)):
        if panel == "t":
            script.append("set logscale y 10")
        script.append(f"set ylabel '{ylabel}'")
        script.append("plot " + ", ".join(f"'-' using 1:2 with linespoints lw 2 title '{name}'"
                                          for name, _ in series))
        for _, v in series:
            for s in sorted(v):
                script.append(f"{s} {bw(s, v[s][0]) if col == 0 else v[s][0]}")
            script.append("e")
    script.append("unset multiplot")
    r = subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True)
    if r.returncode != 0:
        sys.exit("compare.sh: gnuplot failed drawing " + plot)
PY
rm -rf "$tmp"
