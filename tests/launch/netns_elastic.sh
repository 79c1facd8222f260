#!/usr/bin/env bash
# collie-run --elastic across two hosts: network namespaces joined by a veth
# pair (tests/launch/hosts.sh), 2 ranks each, the example engine, which
# under --elastic shrinks, grows and hands its state over in memory
# (examples/train_mlp.cc). Two ranks are SIGKILLed, one on each host:
#   - rank 1 (host a) at step 50: host a's launcher starts it again; it
#     joins as rank 3, so hier's hosts now hold ranks 0, 3 and 1, 2;
#   - at step 100, the process that began as rank 3 (host b; rank 2 since
#     the first shrink): host b's launcher starts it again.
# --max-restarts 2 is the whole job's: each launcher draws from one count
# in the job's store, so the second replacement is "2 of 2" on host b.
# Both runs reduce with COLLIE_DETERMINISTIC=1, whose sums do not depend
# on where the ranks sit, so the final parameters must be byte-identical
# to an uninterrupted run's.
#   netns_elastic.sh BUILD_ROOT
# Needs root and network namespaces; skips (77) with the reason otherwise.
#
# hosts.sh runs this script again as its HOSTS_FAULT program:
#   netns_elastic.sh --kill WORK NS_A DEV_A NS_B DEV_B OUT_A OUT_B
set -uo pipefail

if [ "${1:-}" = --kill ]; then
  work=$2 out_a=$7
  # The processes of this job: their --dump-params path under WORK tells
  # them from any other train_mlp.
  # shellcheck source=tests/launch/kill_at.sh
  . "$(dirname "$0")/kill_at.sh"
  kill_at "$out_a" 50 "train_mlp.*$work/got" 1 --first || exit 1
  kill_at "$out_a" 100 "train_mlp.*$work/got" 3 --first || exit 1
  exit 0
fi

build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
mlp=$build/examples/train_mlp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export COLLIE_TIMEOUT=${COLLIE_TIMEOUT:-60} COLLIE_DETERMINISTIC=1

"$here/hosts.sh" netns "$build" "$mlp" --steps 200 --dump-params "$work/ref" >"$work/ref.txt" 2>&1
rc=$?
[ $rc = 77 ] && { cat "$work/ref.txt"; exit 77; }
[ $rc = 0 ] || { cat "$work/ref.txt"; echo "FAILED: the uninterrupted run"; exit 1; }

printf '#!/bin/sh\nexec %q --kill %q "$@"\n' "$here/netns_elastic.sh" "$work" >"$work/kill"
chmod +x "$work/kill"
HOSTS_FAULT=$work/kill "$here/hosts.sh" netns "$build" --elastic --max-restarts 2 "$mlp" \
  --steps 200 --log-every 1 --step-sleep-ms 20 --dump-params "$work/got" >"$work/got.txt" 2>&1
rc=$?
# The per-step lines are many; the rest says what happened.
grep -Ev '^\[[0-9]+\] step +[0-9]+  loss' "$work/got.txt"
fail() { echo "FAILED: $*"; exit 1; }
[ $rc = 0 ] || fail "the elastic job (hosts.sh exit $rc)"
grep -q 'killed the first rank 1 (pid' "$work/got.txt" || fail "rank 1 was never killed"
grep -q 'killed the first rank 3 (pid' "$work/got.txt" || fail "the first rank 3 was never killed"
# Each host's launcher replaced its own rank, drawing from the job's count.
# (Each host's part read whole, then searched: `sed | grep -q` under pipefail
# fails where grep quits at its match while sed still writes.)
host_a=$(sed -n '/^== host a/,/^== host b/p' "$work/got.txt")
host_b=$(sed -n '/^== host b/,/^== the fault/p' "$work/got.txt")
grep -Eq 'collie-run: rank 1 was killed by signal SIGKILL; --elastic: starting it again \(1 of 2\)' \
  <<<"$host_a" ||
  fail "host a's launcher did not start rank 1 again as the job's first replacement"
grep -Eq 'collie-run: rank 3 was killed by signal SIGKILL; --elastic: starting it again \(2 of 2\)' \
  <<<"$host_b" ||
  fail "host b's launcher did not start rank 3 again as the job's second replacement"
[ "$(grep -Ec '^\[0\] back at step [0-9]+ with 4 ranks' "$work/got.txt")" = 2 ] ||
  fail "rank 0 did not go on with 4 ranks after each kill"
grep -q 'restarting (attempt' "$work/got.txt" && fail "a launcher restarted the whole job"
cmp -s "$work/ref" "$work/got" || fail "the final parameters differ from the uninterrupted run's"
echo "two hosts, --elastic: a rank killed on each host and replaced there in the running job," \
  "final parameters byte-identical to the uninterrupted run's"
