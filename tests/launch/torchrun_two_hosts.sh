#!/usr/bin/env bash
# torchrun --nnodes 2 across two hosts: two network namespaces joined by a
# veth pair (10.77.0.1 and 10.77.0.2), torchrun in each with 2 ranks per
# host, running tests/python/launch_check.py (collie.torch's DDP against a
# serial float64 reference, each rank checking it is the launcher's rank).
# Both halves must end well. Needs root and network namespaces; skips (77)
# with the reason otherwise.
#   torchrun_two_hosts.sh TORCHRUN PYTHON_ENV_PATH SOURCE_ROOT
# (PYTHON_ENV_PATH: what PYTHONPATH must hold; COLLIE_LIBRARY comes from
# the environment.)
set -uo pipefail
torchrun=$1 pypath=$2 src=$(cd "$3" && pwd)
[ "$(id -u)" = 0 ] || { echo "skipped: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "skipped: no ip (iproute2)"; exit 77; }
h1=collie_t1_$$ h2=collie_t2_$$ va=ct1_$$ vb=ct2_$$
work=$(mktemp -d)
cleanup() { ip netns del "$h1" 2>/dev/null; ip netns del "$h2" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
if ! ip netns add "$h1" 2>"$work/err" || ! ip netns add "$h2" 2>>"$work/err"; then
  echo "skipped: cannot create network namespaces here: $(head -1 "$work/err")"; exit 77
fi
ip link add "$va" type veth peer name "$vb" && ip link set "$va" netns "$h1" && ip link set "$vb" netns "$h2" &&
  ip -n "$h1" addr add 10.77.0.1/24 dev "$va" && ip -n "$h2" addr add 10.77.0.2/24 dev "$vb" &&
  ip -n "$h1" link set "$va" up && ip -n "$h2" link set "$vb" up &&
  ip -n "$h1" link set lo up && ip -n "$h2" link set lo up || { echo "FAILED: setting up the veth pair"; exit 1; }
run_on() {  # namespace, node rank, output file, interface (Gloo's: the host name is
            # the same in both namespaces and resolves to loopback)
  ip netns exec "$1" env PYTHONPATH="$pypath" COLLIE_TIMEOUT=60 LAUNCH_CHECK_INIT_TORCH="$init" \
    GLOO_SOCKET_IFNAME="$4" \
    "$torchrun" --nnodes 2 --nproc_per_node 2 --node_rank "$2" --master_addr 10.77.0.1 \
    --master_port 29500 --redirects 1 --tee 1 "$src/tests/python/launch_check.py" >"$3" 2>&1
}
# Twice: collie's communicator from torchrun's variables, then (init=1)
# from torch.distributed's job, rendezvoused through PyTorch's store across
# the two hosts.
for init in 0 1; do
  run_on "$h1" 0 "$work/h1.txt" "$va" & p1=$!
  run_on "$h2" 1 "$work/h2.txt" "$vb" & p2=$!
  wait $p1; rc1=$?; wait $p2; rc2=$?
  if [ $rc1 != 0 ] || [ $rc2 != 0 ] || [ "$(cat "$work/h1.txt" "$work/h2.txt" | grep -c "match the serial")" != 4 ]; then
    echo "LAUNCH_CHECK_INIT_TORCH=$init, first host, exit $rc1:"; cat "$work/h1.txt"
    echo "second host, exit $rc2:"; cat "$work/h2.txt"
    echo "FAILED"; exit 1
  fi
done
echo "torchrun --nnodes 2 on two hosts, 2 ranks each, with and without torch.distributed first:" \
  "collie.torch matches the serial reference on every rank"
