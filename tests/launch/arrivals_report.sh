#!/usr/bin/env bash
# Which rank arrived last, over tcp and shm (3 ranks) and hier (two hosts
# of two, told apart by name): tests/arrivals_check holds the last rank
# back by a known delay before each all-reduce, every rank checks that it
# is named; then it starts each of 10 backward passes late, and rank 0's
# reducer log must name it for iterations 0 to 4 and 5 to 9 (under
# COLLIE_DEBUG=INFO); and at the job's end collie-run must name it too,
# from the accounts the ranks left in its store
# (comm/launch/job_arrivals.cc).
# Given a Python with torch, the same through the torch.distributed
# backend (tests/python/backend_arrivals.py).
#   arrivals_report.sh BUILD_ROOT [PYTHON]
set -uo pipefail
build=$(cd "$1" && pwd)
python=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
run=$build/comm/launch/collie-run
check=$build/tests/arrivals_check
export COLLIE_TIMEOUT=120 COLLIE_DEBUG=INFO COLLIE_REDUCER_LOG_EVERY=5
status=0
expect() {  # what, the last rank, the job's output
  local what=$1 last=$2 out=$3
  local line
  line=$(grep -m1 '^collie-run: arrivals at' <<<"$out")
  echo "$what: ${line:-collie-run said nothing of arrivals}"
  if ! grep -q "passed\|PASSED" <<<"$out" || grep -q "FAILED" <<<"$out"; then
    echo "FAIL: $what: a rank's own check failed"
    echo "$out" | tail -30
    status=1
  elif [[ "$line" != *": rank $last arrived last in "* ]]; then
    echo "FAIL: $what: collie-run did not name rank $last first"
    status=1
  fi
  [ "${COLLIE_DEBUG:-}" = INFO ] || return 0
  for span in "0 to 4" "5 to 9"; do
    line=$(grep -m1 "reducer, iterations $span: " <<<"$out")
    echo "$what: ${line:-the reducer logged nothing for iterations $span}"
    if [[ "$line" != *"iterations $span: rank $last arrived last in "* ]]; then
      echo "FAIL: $what: the reducer's log did not name rank $last first"
      status=1
    fi
  done
}
for backend in tcp shm; do
  out=$(COLLIE_BACKEND=$backend COLLIE_EXPECT_BACKEND=$backend "$run" -n 3 "$check" 2>&1)
  expect "$backend, 3 ranks" 2 "$out"
done
out=$(COLLIE_EXPECT_BACKEND=hier bash "$here/hosts.sh" names "$build" "$check" 2>&1)
expect "hier, 2 hosts x 2" 3 "$out"
# Without COLLIE_DEBUG=INFO collie-run speaks only when a rank stands out,
# as this one does.
out=$(COLLIE_DEBUG= COLLIE_BACKEND=tcp "$run" -n 3 "$check" 2>&1)
COLLIE_DEBUG= expect "tcp, 3 ranks, no INFO" 2 "$out"
# ...and says nothing after a job where none does (collie-bench's ranks
# all run alike; under INFO it must speak). Builds without the benchmarks
# (-Dbenchmarks=false: the sanitizer builds) skip this.
for debug in "" INFO; do
  [ -x "$build/bench/collie-bench" ] || break
  out=$(COLLIE_DEBUG=$debug COLLIE_BACKEND=tcp "$run" -n 3 "$build/bench/collie-bench" \
    -b 8 -e 64K -n 20 -w 2 2>&1)
  if grep -q '^collie-run: arrivals at' <<<"$out"; then said=INFO; else said=; fi
  if [ "$said" != "$debug" ]; then
    echo "FAIL: after collie-bench with COLLIE_DEBUG=$debug collie-run said" \
      "${said:+something}${said:-nothing} of arrivals"
    status=1
  fi
done
if [ -n "$python" ]; then
  out=$(COLLIE_DEBUG= "$run" -n 3 "$python" "$here/../python/backend_arrivals.py" 2>&1)
  COLLIE_DEBUG= expect "the torch backend, 3 ranks" 2 "$out"
fi
[ $status = 0 ] && echo "the rank held back was named by every rank and by collie-run"
exit $status
