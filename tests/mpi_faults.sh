#!/usr/bin/env bash
# tests/mpi_faults.sh MPIRUN COLLIE_RUN PROGRAM: the mpi backend under
# failure (see tests/mpi_faults.cc). Every case must end well within its
# deadline, with every rank's report (or mpirun's own abort) naming the
# problem. Exit 0 when all cases do.
set -uo pipefail
MPIRUN=$1
COLLIE_RUN=$2
PROG=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 COLLIE_BACKEND=mpi
fails=0
failed=()  # each failed check's line, repeated at the end (CI shows the tail)
out=""
done_dirs=$(mktemp -d)
trap 'rm -rf "$done_dirs"' EXIT

# run NP TIMEOUT_S CASE [own-init]: runs the case, sets $out, $rc and $took
# (seconds).
run() {
  local np=$1 t=$2 case=$3 start
  start=$(date +%s)
  # The ranks wait for each other's reports through files here (see
  # mpi_faults.cc), a fresh folder for each run.
  export MPI_FAULTS_DONE
  MPI_FAULTS_DONE=$(mktemp -d -p "$done_dirs")
  out=$(COLLIE_DEBUG=INFO COLLIE_TIMEOUT=$t timeout 120 "$MPIRUN" --oversubscribe -n "$np" "$PROG" "$case" ${4:-} 2>&1)
  rc=$?
  took=$(($(date +%s) - start))
}
expect() {  # expect CASE DESCRIPTION PATTERN (extended regex, in $out)
  # Not `echo | grep -q` under pipefail: grep quits at the first match, and
  # echo, still writing a long $out, then fails with SIGPIPE (a match near
  # the top of a long output was reported missing).
  if grep -Eq -- "$3" <<<"$out"; then
    echo "ok   $1: $2"
  else
    echo "FAIL $1: $2 (no /$3/ in:)"
    echo "$out" | sed 's/^/    | /'
    fails=$((fails + 1))
    failed+=("FAIL $1: $2")
  fi
}
within() {  # within CASE LIMIT_S
  if [ "$took" -lt "$2" ] && [ "$rc" -ne 124 ]; then
    echo "ok   $1: the job ended after ${took} s (limit $2 s)"
  else
    echo "FAIL $1: the job took ${took} s, rc $rc (limit $2 s)"
    fails=$((fails + 1))
    failed+=("FAIL $1: the job took ${took} s, rc $rc (limit $2 s)")
  fi
}

run 3 60 mismatch
expect mismatch "rank 0 names rank 1 and what it called" \
  "rank 0: ERR mismatch: allreduce #[0-9]+ \(f32 x 4, sum\) on rank 0 does not match rank 1, which called allreduce #[0-9]+ \(f32 x 5, sum\)"
expect mismatch "rank 1 names a rank that differs" "rank 1: ERR mismatch: .* does not match rank [02]"
expect mismatch "rank 2 names rank 1" "rank 2: ERR mismatch: .* does not match rank 1"
within mismatch 30
expect mismatch "all on one host: the check runs through shared memory" \
  "rank 0: the mpi backend checks each collective through shared memory"

# The check by MPI messages, the one taken across hosts.
COLLIE_MPI_CHECK=2 run 3 60 mismatch
expect messages "rank 0 names rank 1 and what it called" \
  "rank 0: ERR mismatch: allreduce #[0-9]+ \(f32 x 4, sum\) on rank 0 does not match rank 1, which called allreduce #[0-9]+ \(f32 x 5, sum\)"
expect messages "rank 2 names rank 1" "rank 2: ERR mismatch: .* does not match rank 1"
expect messages "the check runs by MPI messages" "rank 0: the mpi backend checks each collective by MPI messages"
within messages 30

run 2 60 p2p
expect p2p "the receiver names the sender and the sizes" \
  "rank 1: ERR mismatch: .* rank 0 sent more than the 16 bytes this receive holds"
within p2p 30

run 2 60 abort
expect abort "the survivor gets rank 1's reason" \
  "rank 0: ERR aborted: allreduce #[0-9]+ \(f32 x 1048576, sum\) on rank 0: rank 1 aborted the communicator: .*rank 1 gives up on purpose"
within abort 30

run 2 3 stall
expect stall "the waiting rank times out naming the op" \
  "rank 0: ERR timeout: allreduce #[0-9]+ \(f32 x 1048576, sum\) on rank 0 timed out after 3 s in MPI"
expect stall "the report says where each rank is" \
  "rank 0: ERR timeout: .*Where the ranks are \(read from the shared check area\): rank 0 waits in #([0-9]+); rank 1 last completed #[0-9]+ and has not called #\1 \(its process is alive\)"
within stall 30

# A stopped rank: named as stopped at the deadline, from the check area.
run 3 3 stop
expect stop "the waiting ranks name the stopped rank" \
  "rank [02]: ERR timeout: .*ranks 0, 2 wait in #([0-9]+); rank 1 last completed #[0-9]+ and has not called #\1 \(its process is stopped\)"
within stop 30

# The program initialised MPI itself: the same errors, and MPI is left to it
# (not finalised by collie, MPI_COMM_WORLD's handler untouched). Each
# op's check runs before the op here (a wrong op's error would be fatal
# through the world's handler).
run 3 60 mismatch own-init
expect own-init "rank 0 names rank 1 and what it called" \
  "rank 0: ERR mismatch: allreduce #[0-9]+ \(f32 x 4, sum\) on rank 0 does not match rank 1, which called allreduce #[0-9]+ \(f32 x 5, sum\)"
for r in 0 1 2; do
  expect own-init "rank $r: the program finalises MPI itself" "rank $r: the program finalised MPI"
done
within own-init 30

run 3 60 kill
expect kill "mpirun ends the job and names the killed rank" "rank 1 .*(signal 9|Killed)|signal 9 \(Killed\)"
within kill 30
if [ "$rc" -eq 0 ]; then
  echo "FAIL kill: mpirun returned 0 after a rank was killed"
  fails=$((fails + 1))
  failed+=("FAIL kill: mpirun returned 0 after a rank was killed")
fi

# Asked for under another launcher: a clear error, not MPI's singleton.
start=$(date +%s)
out=$(COLLIE_TIMEOUT=20 timeout 60 "$COLLIE_RUN" -n 2 "$PROG" mismatch 2>&1)
rc=$?
took=$(($(date +%s) - start))
expect launch "collie-run's ranks are told to use mpirun" \
  "backend 'mpi' cannot serve these ranks: it needs an MPI launch \(mpirun or srun\)"
within launch 30

[ "$fails" -gt 0 ] && printf '%s\n' "${failed[@]}"
echo "$fails failed"
[ "$fails" -eq 0 ]
