#!/usr/bin/env bash
# Runs a program on 2 hosts x 2 ranks: collie-run once per host, --nnodes 2.
#   hosts.sh MODE BUILD_ROOT PROGRAM [ARGS...]
# MODE
#   names    both hosts on this machine's loopback, told apart only by
#            COLLIE_HOSTNAME (host-a, host-b): what collie's host discovery
#            sees, without root
#   netns    two network namespaces joined by a veth pair (10.78.0.1 and
#            10.78.0.2): the hosts find each other as different hosts by
#            themselves; needs root (skips with 77 and the reason otherwise)
#   netns:RATE  the same, the link shaped with tc tbf at RATE (e.g. 10gbit)
# Both halves must exit 0; their output is printed, host by host. The
# environment (COLLIE_BACKEND, ...) passes through to the ranks.
#
# HOSTS_NPROC=K: K ranks per host (default 2; collie-run launcher only).
# HOSTS_FAULT=PROGRAM (netns modes, collie-run launcher): runs
#   PROGRAM NS_A DEV_A NS_B DEV_B OUT_A OUT_B
# alongside the two halves (started just before them), to shape, cut or
# restore the link while they run (tests/launch/link_faults.sh); OUT_A and
# OUT_B are the files the halves write their output to as they go. Its
# output is printed after theirs (it is stopped if still running when they
# have ended), and its exit status is its own business.
#
# HOSTS_LAUNCHER=mpirun (netns modes only): one Open MPI mpirun in the first
# namespace starts all 4 ranks, its daemon on the second host through a
# launch agent (plm_rsh_agent, in ssh's place) that enters that namespace.
# Each host gets its own UTS namespace and hostname (host-a, host-b): Open
# MPI names its shared-memory files by hostname, and two hosts that both
# bore this machine's name crashed in its shared-memory transport.
set -uo pipefail
mode=$1 build=$(cd "$2" && pwd)
shift 2
run=$build/comm/launch/collie-run
export COLLIE_JOB_SECRET=${COLLIE_JOB_SECRET:-hosts-test-$$-$RANDOM}
work=$(mktemp -d)
ns=() pids=()
cleanup() {
  # Stopped while the halves run (a caller's time limit): what they said so far.
  if [ "${#pids[@]}" -gt 0 ]; then
    for h in a b; do [ -s "$work/$h.txt" ] && { echo "== host $h, still running, so far:"; cat "$work/$h.txt"; }; done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

case $mode in
  names)
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    addr=127.0.0.1
    on_host() { COLLIE_HOSTNAME=host-$1 "$run" "${@:2}"; }
    ;;
  netns | netns:*)
    [ "$(id -u)" = 0 ] || { echo "skipped: network namespaces need root"; exit 77; }
    command -v ip >/dev/null || { echo "skipped: no ip (iproute2)"; exit 77; }
    rate=${mode#netns}; rate=${rate#:}
    ns=(collie_ha_$$ collie_hb_$$)
    va=cha_$$ vb=chb_$$
    for n in "${ns[@]}"; do
      ip netns add "$n" 2>"$work/err" ||
        { echo "skipped: cannot create network namespaces here: $(head -1 "$work/err")"; exit 77; }
    done
    ip link add "$va" type veth peer name "$vb" && ip link set "$va" netns "${ns[0]}" &&
      ip link set "$vb" netns "${ns[1]}" &&
      ip -n "${ns[0]}" addr add 10.78.0.1/24 dev "$va" && ip -n "${ns[1]}" addr add 10.78.0.2/24 dev "$vb" &&
      ip -n "${ns[0]}" link set "$va" up && ip -n "${ns[1]}" link set "$vb" up &&
      ip -n "${ns[0]}" link set lo up && ip -n "${ns[1]}" link set lo up ||
      { echo "FAILED: setting up the veth pair"; exit 1; }
    if [ -n "$rate" ]; then
      # Both directions, a token bucket at RATE: burst of 1 ms at that rate
      # (at least 64 KiB), a queue of 5 ms.
      for pair in "${ns[0]} $va" "${ns[1]} $vb"; do
        read -r n dev <<<"$pair"
        tc -n "$n" qdisc add dev "$dev" root tbf rate "$rate" burst "${TBF_BURST:-4mb}" latency 10ms 2>"$work/err" ||
          { echo "skipped: tc tbf is not available here: $(head -1 "$work/err")"; exit 77; }
      done
    fi
    port=29611 addr=10.78.0.1
    if [ "${HOSTS_LAUNCHER:-}" = mpirun ]; then
      command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
      command -v unshare >/dev/null || { echo "skipped: no unshare (util-linux)"; exit 77; }
      {
        echo '#!/bin/sh'
        echo '# mpirun'"'"'s plm_rsh_agent: "agent HOST COMMAND..." runs COMMAND on HOST.'
        echo 'host=$1; shift'
        echo 'case $host in'
        echo "  10.78.0.1) n=${ns[0]} h=host-a ;;"
        echo "  10.78.0.2) n=${ns[1]} h=host-b ;;"
        echo '  *) echo "hosts.sh agent: no host $host" >&2; exit 1 ;;'
        echo 'esac'
        echo 'exec ip netns exec "$n" unshare --uts /bin/sh -c "hostname $h && $*"'
      } >"$work/agent"
      chmod +x "$work/agent"
      env_args=()
      for k in $(compgen -e | grep '^COLLIE_'); do env_args+=(-x "$k"); done
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        ip netns exec "${ns[0]}" unshare --uts /bin/sh -c 'hostname host-a && exec "$@"' sh \
        mpirun --oversubscribe --mca plm_rsh_agent "$work/agent" --host 10.78.0.1:2,10.78.0.2:2 \
        -n 4 "${env_args[@]}" "$@" >"$work/all.txt" 2>&1
      rc=$?
      echo "== mpirun, 2 hosts x 2 ranks (ranks 0, 1 on host-a; 2, 3 on host-b), exit $rc"
      cat "$work/all.txt"
      [ $rc = 0 ] || { echo FAILED; exit 1; }
      exit 0
    fi
    on_host() {
      local n=${ns[0]}
      [ "$1" = b ] && n=${ns[1]}
      ip netns exec "$n" "$run" "${@:2}"
    }
    ;;
  *)
    echo "usage: hosts.sh names|netns|netns:RATE BUILD_ROOT PROGRAM [ARGS...]"; exit 2 ;;
esac

np=${HOSTS_NPROC:-2}
: >"$work/a.txt"; : >"$work/b.txt"
fault_pid=
if [ -n "${HOSTS_FAULT:-}" ]; then
  [ "${#ns[@]}" = 2 ] || { echo "HOSTS_FAULT needs a netns mode"; exit 2; }
  "$HOSTS_FAULT" "${ns[0]}" "$va" "${ns[1]}" "$vb" "$work/a.txt" "$work/b.txt" >"$work/fault.txt" 2>&1 &
  fault_pid=$!
fi
on_host a -n "$np" --nnodes 2 --node-rank 0 --master-addr "$addr" --master-port "$port" "$@" \
  >"$work/a.txt" 2>&1 & pids+=($!)
on_host b -n "$np" --nnodes 2 --node-rank 1 --master-addr "$addr" --master-port "$port" "$@" \
  >"$work/b.txt" 2>&1 & pids+=($!)
wait "${pids[0]}"; rc_a=$?
wait "${pids[1]}"; rc_b=$?
pids=()
ranks() { seq -s ', ' $(($1 * np)) $(($1 * np + np - 1)); }
echo "== host a (ranks $(ranks 0)), exit $rc_a"; cat "$work/a.txt"
echo "== host b (ranks $(ranks 1)), exit $rc_b"; cat "$work/b.txt"
if [ -n "$fault_pid" ]; then
  # Still waiting for something the job never printed: the job has ended.
  kill "$fault_pid" 2>/dev/null && echo "(the job ended first: stopped)" >>"$work/fault.txt"
  wait "$fault_pid"
  echo "== the fault ($HOSTS_FAULT), exit $?"; cat "$work/fault.txt"
fi
[ $rc_a = 0 ] && [ $rc_b = 0 ] || { echo FAILED; exit 1; }
