#!/usr/bin/env bash
# Network faults under a running job: two hosts in network namespaces joined
# by a veth pair (tests/launch/hosts.sh), tests/link_fault_probe all-reducing
# on them, every result checked exactly, while this script shapes, cuts or
# restores the link.
#   link_faults.sh BUILD_ROOT CASE [RANKS_PER_HOST]     (default 2 per host)
# CASE
#   shaped  tbf at 200 Mbit/s both ways: every result exact
#   down    the link taken down after a few ops and left down: every rank
#           exits with an error naming the op and a rank of the other host,
#           within the deadline (COLLIE_TIMEOUT=5) plus a few seconds of the
#           fault; the launchers exit and no rank is left behind
#   flap    the link down for 2 s and up again, the deadline 20 s: the op in
#           flight finishes, every result exact, the job exits 0
#   netem   delay, loss and reordering (tc netem) both ways: every result
#           exact; skipped (77) with the reason where netem is missing
# Needs root and network namespaces; skips (77) with the reason otherwise.
# The backend is COLLIE_BACKEND's (tcp when unset). Prints, per rank, how
# long after the fault it reported it, or how long the op across it took.
#
# hosts.sh runs this script again as its HOSTS_FAULT program:
#   link_faults.sh --inject CASE NS_A DEV_A NS_B DEV_B OUT_A OUT_B
set -uo pipefail
now() { date +%s.%N; }
calc() { awk "BEGIN { print $* }"; }
holds() { awk "BEGIN { exit !($*) }"; }

if [ "${1:-}" = --inject ]; then
  what=$2 ns_a=$3 dev_a=$4 ns_b=$5 dev_b=$6 out_a=$7 out_b=$8
  np=${HOSTS_NPROC:-2}
  case $what in
    netem)
      # Before the ops: on both ends, 2 ms +- 1 ms, 1% of packets lost, a
      # quarter sent at once ahead of the delayed ones (reordered).
      for pair in "$ns_a $dev_a" "$ns_b $dev_b"; do
        read -r n dev <<<"$pair"
        tc -n "$n" qdisc add dev "$dev" root netem delay 2ms 1ms loss 1% reorder 25% 50% ||
          { echo "FAILED: tc netem on $dev"; exit 1; }
        tc -n "$n" qdisc show dev "$dev"
      done
      exit 0 ;;
  esac
  # Every rank of both hosts has finished op 2 (collie-run prefixes "[r] ").
  for _ in $(seq 600); do
    [ "$(grep -c '^\[[0-9]*\] op 2 ok' "$out_a")" -ge "$np" ] &&
      [ "$(grep -c '^\[[0-9]*\] op 2 ok' "$out_b")" -ge "$np" ] && break
    sleep 0.1
  done
  [ "$(grep -c '^\[[0-9]*\] op 2 ok' "$out_b")" -ge "$np" ] || { echo "FAILED: op 2 never ended"; exit 1; }
  echo "fault: link down at epoch=$(now)"
  ip -n "$ns_b" link set "$dev_b" down || { echo "FAILED: ip link set down"; exit 1; }
  [ "$what" = flap ] || exit 0
  sleep 2
  echo "fault: link up at epoch=$(now)"
  ip -n "$ns_b" link set "$dev_b" up || { echo "FAILED: ip link set up"; exit 1; }
  exit 0
fi

build=$(cd "$1" && pwd) what=$2 np=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
probe=$build/tests/link_fault_probe
[ -x "$probe" ] || { echo "FAILED: $probe is not built"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "skipped: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "skipped: no ip (iproute2)"; exit 77; }
command -v tc >/dev/null || { echo "skipped: no tc (iproute2)"; exit 77; }
export COLLIE_BACKEND=${COLLIE_BACKEND:-tcp} HOSTS_NPROC=$np
world=$((2 * np))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

mode=netns hosts_fault= probe_args=()
case $what in
  shaped) mode=netns:200mbit; export COLLIE_TIMEOUT=120; probe_args=(--ops 6) ;;
  down) export COLLIE_TIMEOUT=5; hosts_fault=down; probe_args=(--seconds 600) ;;
  flap) export COLLIE_TIMEOUT=20; hosts_fault=flap; probe_args=(--seconds 8) ;;
  netem)
    # Whether this kernel has netem, on a device of a namespace of our own.
    n=collie_netem_$$
    ip netns add "$n" 2>"$work/err" ||
      { echo "skipped: cannot create network namespaces here: $(head -1 "$work/err")"; exit 77; }
    ip -n "$n" link set lo up
    tc -n "$n" qdisc add dev lo root netem delay 1ms 2>"$work/err"; ok=$?
    ip netns del "$n"
    [ $ok = 0 ] || { echo "skipped: tc netem is not available here ($(head -1 "$work/err")): delay, loss and reordering are not tested"; exit 77; }
    export COLLIE_TIMEOUT=120; hosts_fault=netem; probe_args=(--ops 6 --mib 1) ;;
  *) echo "usage: link_faults.sh BUILD_ROOT shaped|down|flap|netem [RANKS_PER_HOST]"; exit 2 ;;
esac
if [ -n "$hosts_fault" ]; then
  printf '#!/bin/sh\nexec bash %q --inject %q "$@"\n' "$here/link_faults.sh" "$hosts_fault" >"$work/fault"
  chmod +x "$work/fault"
  export HOSTS_FAULT=$work/fault
fi

# A bound on the whole job, so that a hang is a failure with the output so
# far, not the test harness's timeout.
limit=$((COLLIE_TIMEOUT * 2 + 60))
start=$(now)
timeout -s TERM -k 10 "$limit" bash "$here/hosts.sh" "$mode" "$build" "$probe" "${probe_args[@]}" \
  >"$work/out.txt" 2>&1
rc=$?
end=$(now)
cat "$work/out.txt"
[ $rc = 124 ] || [ $rc = 137 ] && fail "the job was still running after $limit s (a hang)"
[ $rc = 77 ] && exit 77
grep -q '^FAILED: setting up' "$work/out.txt" && fail "the namespaces could not be set up"
# Every rank's process is gone with its launcher (read from /proc: no procps).
left=
for c in /proc/[0-9]*/cmdline; do
  cmd=$(tr '\0' ' ' <"$c" 2>/dev/null) && [ "${cmd#"$probe "}" != "$cmd" ] && left="$left ${c//[^0-9]/}"
done
[ -z "$left" ] || fail "ranks are left running after the launchers exited: pid(s)$left"

grep -q '^\[[0-9]*\] op [0-9]* WRONG' "$work/out.txt" && fail "a result was wrong"
echo "== checks ($what, $np rank(s) per host, COLLIE_BACKEND=$COLLIE_BACKEND, COLLIE_TIMEOUT=$COLLIE_TIMEOUT)"
printf 'the job took %.1f s\n' "$(calc "$end - $start")"
line_of() { grep "^\[$1\] $2" "$work/out.txt" | head -1; }

case $what in
  shaped | netem | flap)
    [ $rc = 0 ] || fail "the job exited $rc"
    for ((r = 0; r < world; r++)); do
      [ -n "$(line_of $r 'done: .* ops, every result exact$')" ] || fail "rank $r did not finish"
    done
    took=$(grep -o '^\[[0-9]*\] op [0-9]* ok t=[0-9.]* took=[0-9.]*' "$work/out.txt" |
      sed 's/.*took=//' | sort -g | sed -n '1p;$p' | paste -sd' ')
    echo "every rank's every result exact; an op took from ${took% *} to ${took#* } s"
    if [ "$what" = flap ]; then
      down=$(sed -n 's/^fault: link down at epoch=//p' "$work/out.txt")
      up=$(sed -n 's/^fault: link up at epoch=//p' "$work/out.txt")
      [ -n "$down" ] && [ -n "$up" ] || fail "the link was not taken down and up"
      printf 'the link was down for %.2f s\n' "$(calc "$up - $down")"
      # The op in flight when the link went down waited for it: unless an op
      # took most of that time, the fault did not hit the job.
      longest=${took#* }
      holds "$longest >= 1" || fail "no op waited for the link (longest $longest s)"
      echo "the op across the fault took $longest s (deadline $COLLIE_TIMEOUT s)"
    fi
    ;;
  down)
    [ $rc != 0 ] || fail "the job exited 0 with the link down"
    down=$(sed -n 's/^fault: link down at epoch=//p' "$work/out.txt")
    [ -n "$down" ] || fail "the link was not taken down"
    bound=$((COLLIE_TIMEOUT + 5)) last= says_cut=
    for ((r = 0; r < world; r++)); do
      l=$(line_of $r 'op [0-9]* FAILED')
      [ -n "$l" ] || fail "rank $r reported no error"
      op=$(sed 's/.* op \([0-9]*\) FAILED.*/\1/' <<<"$l")
      at=$(sed 's/.* epoch=\([0-9.]*\) .*/\1/' <<<"$l")
      code=$(sed 's/.* code=\([a-z_]*\): .*/\1/' <<<"$l")
      after=$(calc "$at - $down")
      # The ranks of the other host, any of which the message must name.
      if ((r < np)); then other=($(seq "$np" $((world - 1)))); else other=($(seq 0 $((np - 1)))); fi
      named=
      for q in "${other[@]}"; do
        grep -Eq "rank $q([^0-9]|$)|ranks ([0-9]+, )*$q([^0-9]|$)" <<<"$l" && named="$named $q"
      done
      for q in "${other[@]}"; do
        grep -q "nothing sent to rank $q has been acknowledged .*: the network to it (or its host) is down" <<<"$l" &&
          says_cut="$says_cut $r->$q"
      done
      printf 'rank %d: %s %.2f s after the fault, in op %d; names the op: %s; names rank(s) of the other host:%s\n' \
        "$r" "$code" "$after" "$op" "$(grep -q "allreduce #$((op + 1)) " <<<"$l" && echo yes || echo NO)" \
        "${named:- NONE}"
      grep -q "allreduce #$((op + 1)) " <<<"$l" || fail "rank $r's error does not name allreduce #$((op + 1))"
      [ -n "$named" ] || fail "rank $r's error names no rank of the other host (${other[*]})"
      holds "$after <= $bound" ||
        fail "rank $r reported the fault $after s after it, more than the deadline + 5 s ($bound s)"
      holds "$at > ${last:-0}" && last=$at
    done
    # The ranks that were sending across the link when it went down say so.
    echo "the link named as down (rank->rank):${says_cut:- NOWHERE}"
    [ -n "$says_cut" ] || fail "no rank's error says that the network to a rank of the other host is down"
    # Nothing holds a rank once it has reported (a store out of reach held
    # ranks for the store's deadline at exit).
    lag=$(calc "$end - $last")
    printf 'the launchers exited %.2f s after the last error\n' "$lag"
    holds "$lag <= 4" || fail "the launchers exited $lag s after the last error (more than 4 s)"
    ;;
esac
echo "PASSED: $what"
