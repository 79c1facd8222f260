#!/usr/bin/env bash
# Runs a googletest program as N shards at once (GTEST_TOTAL_SHARDS and
# GTEST_SHARD_INDEX), prints each shard's output in turn, and fails if any
# shard fails. For the test programs whose time is spent waiting out
# deliberate deadlines (faults, launcher): their waits overlap instead of
# adding up, while each test still runs its own processes exactly as alone.
# Only for programs whose tests share nothing on the machine (each picks its
# own free port, files named by its pid). Stopped (meson's timeout), it
# prints what each shard had written so far.
#   tests/shards.sh 4 build/tests/test_faults [gtest arguments...]
set -uo pipefail
n=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
stopped() {
  for f in "$dir"/*; do
    echo "=== shard $(($(basename "$f") + 1)) of $n, stopped:"
    cat "$f"
  done
  exit 1
}
trap stopped TERM INT
pids=()
for ((i = 0; i < n; i++)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$@" >"$dir/$i" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < n; i++)); do
  wait "${pids[$i]}"
  code=$?
  echo "=== shard $((i + 1)) of $n: exit $code"
  cat "$dir/$i"
  [ $code -ne 0 ] && rc=1
done
exit $rc
