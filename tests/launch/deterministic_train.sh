#!/usr/bin/env bash
# DDP under COLLIE_DETERMINISTIC=1 trains bit-identically on every backend:
# examples/train_mlp (collie's reducer from C++) and, given a Python with
# torch, tests/python/deterministic_ddp.py (collie.torch), each with 4
# ranks over tcp, shm and hier (two hosts of two, told apart by name), the
# final parameters' checksums compared.
#   deterministic_train.sh BUILD_ROOT [PYTHON]
set -uo pipefail
build=$(cd "$1" && pwd)
python=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
run=$build/comm/launch/collie-run
export COLLIE_DETERMINISTIC=1 COLLIE_TIMEOUT=120
status=0
compare() {  # what, then the command after the launcher
  local what=$1
  shift
  local sums=() line
  for backend in tcp shm hier; do
    if [ $backend = hier ]; then
      line=$(COLLIE_EXPECT_BACKEND=hier bash "$here/hosts.sh" names "$build" "$@" 2>&1 |
        grep -m1 'final parameters')
    else
      line=$(COLLIE_BACKEND=$backend "$run" -n 4 "$@" 2>&1 | grep -m1 'final parameters')
    fi
    echo "$what on $backend: ${line:-no checksum printed}"
    sums+=("${line##* }")
  done
  if [ -z "${sums[0]}" ] || [ "${sums[0]}" != "${sums[1]}" ] || [ "${sums[0]}" != "${sums[2]}" ]; then
    echo "FAIL: $what: the backends' final parameters differ"
    status=1
  fi
}
compare train_mlp "$build/examples/train_mlp" --steps 30
if [ -n "$python" ]; then
  compare collie.torch "$python" "$here/../python/deterministic_ddp.py"
fi
[ $status = 0 ] && echo "every backend trained to the same bits"
exit $status
