#!/usr/bin/env bash
# The peer programs that bench/compare.sh runs beside collie: each runs a
# short sweep at 2 ranks and reports every size with no wrong element (their
# own check against the known answer). A peer this build lacks is skipped.
#   peers.sh BUILD_ROOT
set -uo pipefail
build=$(cd "$1" && pwd)
run=$build/comm/launch/collie-run
failures=0 ran=0
check() {  # name, output, exit status
  local rows bad
  rows=$(grep -cE '^(\[0\])? +[0-9]+ +[0-9]+ +f32' <<<"$2")
  bad=$(grep -E '^(\[0\])? +[0-9]+ +[0-9]+ +f32' <<<"$2" | awk '$NF != 0' | wc -l)
  if [ "$3" != 0 ] || [ "$rows" != 4 ] || [ "$bad" != 0 ]; then
    echo "FAILED: $1 (exit $3, $rows rows, $bad wrong):"; echo "$2"; failures=$((failures + 1))
  fi
  ran=$((ran + 1))
}
if [ -x "$build/bench/gloo_allreduce" ]; then
  out=$("$run" -n 2 "$build/bench/gloo_allreduce" -b 8 -e 64K -f 32 -n 2 2>&1); check gloo "$out" $?
  out=$("$run" -n 2 "$build/bench/gloo_allreduce" -b 8 -e 64K -f 32 -n 2 -C alltoall 2>&1)
  check gloo_alltoall "$out" $?
fi
if [ -x "$build/bench/mpi_allreduce" ] && command -v mpirun >/dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 \
    "$build/bench/mpi_allreduce" -b 8 -e 64K -f 32 -n 2 2>&1); check mpi "$out" $?
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 \
    "$build/bench/mpi_allreduce" -b 8 -e 64K -f 32 -n 2 -I 1 2>&1); check mpi_nonblocking "$out" $?
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 \
    "$build/bench/mpi_allreduce" -b 8 -e 64K -f 32 -n 2 -C alltoall 2>&1); check mpi_alltoall "$out" $?
fi
[ $ran = 0 ] && { echo "skipped: no peer program in this build"; exit 77; }
[ $failures = 0 ] && echo "$ran peer programs: every size right"
exit $((failures > 0))
