#!/usr/bin/env bash
# tests/launch/elastic.sh COLLIE_RUN PROBE...: a job of 4 ranks under
# collie-run --elastic in which rank 1 SIGKILLs itself at step 10 of 30
# (tests/elastic_probe.cc, or python3 tests/python/elastic_check.py).
# Passes when collie-run started rank 1 again, the replacement joined as
# rank 3 of 4, rank 0 did step 10 again with 4 ranks, every rank's final
# model is exact, and the job exited 0. Prints the time from the kill to
# that step (the recovery).
set -uo pipefail
run=$1
shift
prog=("$@")  # the probe, and what runs it (python3 for tests/python/elastic_check.py)
out=$("$run" -n 4 --elastic --max-restarts 1 "${prog[@]}" --steps 30 --kill-rank 1 --kill-at 10 2>&1)
rc=$?
echo "$out"
fails=0
expect() {  # expect DESCRIPTION PATTERN (extended regex)
  if grep -Eq -- "$2" <<<"$out"; then echo "ok   $1"; else echo "FAIL $1 (no /$2/)"; fails=$((fails + 1)); fi
}
expect "collie-run starts rank 1 again" "rank 1 was killed by signal SIGKILL; --elastic: starting it again \(1 of 1\)"
expect "the replacement joins as rank 3 of 4" "joined as rank 3 of 4"
expect "rank 0 does step 10 again with 4 ranks" "^\[0\] step 10 again with 4 ranks"
for r in 0 1 2 3; do
  expect "rank $r of the new communicator ends with the exact model" "done: 30 steps, model exact, rank $r of 4"
done
if [ "$rc" -ne 0 ]; then echo "FAIL the job exited $rc"; fails=$((fails + 1)); fi
killed=$(sed -nE 's/.*killed at step 10 epoch=([0-9.]+).*/\1/p' <<<"$out" | head -n 1)
again=$(sed -nE 's/^\[0\] step 10 again with 4 ranks epoch=([0-9.]+).*/\1/p' <<<"$out" | head -n 1)
if [ -n "$killed" ] && [ -n "$again" ]; then
  python3 -c "print(f'recovered {float($again) - float($killed):.2f} s after the kill')"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
