#!/usr/bin/env bash
# collie-run across two hosts: two network namespaces joined by a veth pair
# (10.77.0.1 and 10.77.0.2), and in each the README's command line for that
# host, exactly as written, running the README's my_job.c. Both halves must
# end well and every rank must print the sum over all four ranks. Needs root
# and network namespaces; skips (77) with the reason otherwise.
#   two_hosts.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
src=$(cd "$1" && pwd); build=$(cd "$2" && pwd)
[ "$(id -u)" = 0 ] || { echo "skipped: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "skipped: no ip (iproute2)"; exit 77; }
h1=collie_h1_$$ h2=collie_h2_$$ va=cv1_$$ vb=cv2_$$
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

# The README's my_job.c, built against this build tree.
awk '/^```c my_job.c$/ {on=1; next} on && /^```$/ {exit} on {print}' "$src/README.md" > "$work/my_job.c"
cc -std=c11 -I"$src/include" "$work/my_job.c" -L"$build" -l:libcollie.so.0 -Wl,-rpath,"$build" -o "$work/my_job" ||
  { echo "FAILED: building the README's my_job.c"; exit 1; }
# The README's two lines, one per host.
line1=$(grep -A1 '^# on the first host' "$src/README.md" | tail -1)
line2=$(grep -A1 '^# on the second host' "$src/README.md" | tail -1)
[ -n "$line1" ] && [ -n "$line2" ] || { echo "FAILED: the README's two-host lines are gone"; exit 1; }
run_on() {  # namespace, command line, output file
  ip netns exec "$1" env -u LD_LIBRARY_PATH PATH="$build/comm/launch:$PATH" COLLIE_TIMEOUT=60 \
    bash -c "cd '$work' && $2" >"$3" 2>&1
}
run_on "$h1" "$line1" "$work/h1.txt" & p1=$!
run_on "$h2" "$line2" "$work/h2.txt" & p2=$!
wait $p1; rc1=$?; wait $p2; rc2=$?
fail=0
[ $rc1 = 0 ] && [ $rc2 = 0 ] || fail=1
for r in 0 1; do grep -q "^\[$r\] rank $r of 4: sum of ranks 6$" "$work/h1.txt" || fail=1; done
for r in 2 3; do grep -q "^\[$r\] rank $r of 4: sum of ranks 6$" "$work/h2.txt" || fail=1; done
if [ $fail = 1 ]; then
  echo "first host ($line1), exit $rc1:"; cat "$work/h1.txt"
  echo "second host ($line2), exit $rc2:"; cat "$work/h2.txt"
  echo "FAILED"; exit 1
fi
# The example engine with the same lines: it trains and checks that every
# rank's replica is identical.
mlp="$build/examples/train_mlp --steps 20"
run_on "$h1" "${line1/.\/my_job/$mlp}" "$work/h1.txt" & p1=$!
run_on "$h2" "${line2/.\/my_job/$mlp}" "$work/h2.txt" & p2=$!
wait $p1; rc1=$?; wait $p2; rc2=$?
if [ $rc1 != 0 ] || [ $rc2 != 0 ] || ! grep -q "replicas identical on all 4 ranks: yes" "$work/h1.txt"; then
  echo "train_mlp on two hosts: exit $rc1 and $rc2"; cat "$work/h1.txt" "$work/h2.txt"; echo FAILED; exit 1
fi
echo "two hosts, 2 ranks each, the README's lines: every rank has the sum over 4 ranks; train_mlp's replicas identical"
