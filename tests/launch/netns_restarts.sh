#!/usr/bin/env bash
# collie-run --max-restarts across two hosts: network namespaces joined by a
# veth pair (tests/launch/hosts.sh), 2 ranks each, the example engine. Rank
# 3, on the second host, is SIGKILLed at step 50 of 200: the second host's
# launcher writes the failure into the store node 0's launcher serves, the
# first host's launcher stops its ranks, both restart every rank from the
# checkpoint, and the final parameters must be byte-identical to an
# uninterrupted run's on the same two hosts.
#   netns_restarts.sh BUILD_ROOT
# Needs root and network namespaces; skips (77) with the reason otherwise.
#
# hosts.sh runs this script again as its HOSTS_FAULT program:
#   netns_restarts.sh --kill WORK NS_A DEV_A NS_B DEV_B OUT_A OUT_B
set -uo pipefail

if [ "${1:-}" = --kill ]; then
  work=$2 out_a=$7
  # Rank 3 of this job: its checkpoint path (under WORK) tells it from any
  # other train_mlp on the machine.
  # shellcheck source=tests/launch/kill_at.sh
  . "$(dirname "$0")/kill_at.sh"
  kill_at "$out_a" 50 "train_mlp.*$work/ck" 3
  exit
fi

build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
mlp=$build/examples/train_mlp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export COLLIE_TIMEOUT=${COLLIE_TIMEOUT:-60}

"$here/hosts.sh" netns "$build" "$mlp" --steps 200 --dump-params "$work/ref" >"$work/ref.txt" 2>&1
rc=$?
[ $rc = 77 ] && { cat "$work/ref.txt"; exit 77; }
[ $rc = 0 ] || { cat "$work/ref.txt"; echo "FAILED: the uninterrupted run"; exit 1; }

printf '#!/bin/sh\nexec %q --kill %q "$@"\n' "$here/netns_restarts.sh" "$work" >"$work/kill"
chmod +x "$work/kill"
HOSTS_FAULT=$work/kill "$here/hosts.sh" netns "$build" --max-restarts 2 "$mlp" --steps 200 \
  --checkpoint "$work/ck" --checkpoint-every 20 --log-every 1 --step-sleep-ms 20 \
  --dump-params "$work/got" >"$work/got.txt" 2>&1
rc=$?
# The per-step lines are many; the rest says what happened.
grep -Ev '^\[[0-9]+\] step ' "$work/got.txt"
fail() { echo "FAILED: $*"; exit 1; }
[ $rc = 0 ] || fail "the restarted job (hosts.sh exit $rc)"
grep -q 'killed rank 3 (pid' "$work/got.txt" || fail "rank 3 was never killed"
[ "$(grep -c "the job's first failure: rank 3 on node 1 (pid .*) was killed by signal SIGKILL.*the ranks of all 2 nodes have ended; restarting (attempt 1 of 2)" "$work/got.txt")" = 2 ] ||
  fail "both hosts' launchers must name rank 3 on node 1 and restart"
grep -Eq '^\[0\] resuming from checkpoint .* at step [1-9][0-9]*' "$work/got.txt" ||
  fail "the restarted ranks did not resume from the checkpoint"
cmp -s "$work/ref" "$work/got" || fail "the final parameters differ from the uninterrupted run's"
echo "two hosts: rank 3 killed at step 50, every rank restarted on both hosts, final parameters" \
  "byte-identical to the uninterrupted run's"
