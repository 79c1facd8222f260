#!/usr/bin/env bash
# bench/stall_times.sh BUILD [TIMEOUT_S]: how long after a rank stalls
# (SIGSTOP) the others name it, and the job ends, on each host backend.
#
# tests/link_fault_probe all-reduces 1 MiB in a loop; the last rank stops
# itself before op 5 and prints when (the wall clock). Each other rank's
# error line carries the wall clock at which it got its error; the job's
# end is when its launcher returned. Under collie-run (tcp and shm at 2, 3
# and 4 ranks; hier on 2 hosts x 2 ranks told apart by COLLIE_HOSTNAME,
# tests/launch/hosts.sh) and under mpirun (mpi at 2, 3 and 4 ranks).
# COLLIE_TIMEOUT is TIMEOUT_S (default 5). Prints one line per job:
#   tcp 3 ranks: named after 5.75 to 5.76 s, job over after 6.76 s (deadline 5 s)
# and whether each survivor's error names the stopped rank. Four ranks on
# two cores oversubscribe.
set -uo pipefail
build=$(cd "${1:?usage: bench/stall_times.sh BUILD [TIMEOUT_S]}" && pwd)
timeout_s=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
probe=$build/tests/link_fault_probe
run=$build/comm/launch/collie-run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 COLLIE_TIMEOUT=$timeout_s
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# report NAME RANKS STOPPED_RANK START END: the line for the job whose
# output is in $out.
report() {
  python3 - "$1" "$2" "$3" "$5" "$timeout_s" "$out" <<'PY'
import re, sys
name, ranks, stopped, end, deadline, path = sys.argv[1:]
text = open(path, errors="replace").read()
m = re.search(r"rank \d+ stopped before op \d+ epoch=([\d.]+)", text)
if not m:
    print(f"{name} {ranks} ranks: the stopped rank's line is missing"); sys.exit()
stop = float(m.group(1))
errs = {}
for line in text.splitlines():
    f = re.search(r"^(?:\[(\d+)\] )?op \d+ FAILED .*?epoch=([\d.]+).*", line)
    if f:
        errs.setdefault(f.group(1) or line, (float(f.group(2)), line))
after = sorted(t - stop for t, _ in errs.values())
named = sum(1 for _, l in errs.values() if f"rank {stopped} " in l.split("FAILED", 1)[1])
if not after:
    print(f"{name} {ranks} ranks: no rank reported an error"); sys.exit()
print(f"{name} {ranks} ranks: named after {after[0]:.2f} to {after[-1]:.2f} s, "
      f"job over after {float(end) - stop:.2f} s (deadline {deadline} s); "
      f"{named} of {len(errs)} errors name rank {stopped}")
PY
}

args=(--ops 1000 --mib 1)
for be in tcp shm; do
  for np in 2 3 4; do
    s=$(date +%s.%N)
    COLLIE_BACKEND=$be timeout 120 "$run" -n "$np" "$probe" "${args[@]}" \
      --stop-rank $((np - 1)) --stop-at 5 >"$out" 2>&1
    report "$be" "$np" $((np - 1)) "$s" "$(date +%s.%N)"
  done
done
s=$(date +%s.%N)
COLLIE_BACKEND=hier COLLIE_EXPECT_BACKEND=hier timeout 120 bash "$here/tests/launch/hosts.sh" \
  names "$build" "$probe" "${args[@]}" --stop-rank 3 --stop-at 5 >"$out" 2>&1
report hier "2x2" 3 "$s" "$(date +%s.%N)"
if command -v mpirun >/dev/null; then
  for np in 2 3 4; do
    s=$(date +%s.%N)
    COLLIE_BACKEND=mpi timeout 120 mpirun --oversubscribe -n "$np" "$probe" "${args[@]}" \
      --stop-rank $((np - 1)) --stop-at 5 >"$out" 2>&1
    report mpi "$np" $((np - 1)) "$s" "$(date +%s.%N)"
  done
fi
