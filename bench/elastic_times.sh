#!/usr/bin/env bash
# bench/elastic_times.sh BUILD [RUNS]: how long a 4-rank job takes to get
# going again after a rank is killed, replaced alone (collie-run --elastic:
# the survivors keep their state, shrink and grow by the replacement)
# against the whole job restarted (collie-run --max-restarts 1, every rank
# started again, as torchrun's agent does; the probe has no checkpoint to
# read, so this is the restart's floor). tests/elastic_probe kills rank 1 at
# step 10 of 30 and prints the wall clock then, and rank 0 prints it at the
# first step done with the replacement (or after the restart). RUNS runs of
# each (default 5), on tcp and shm; prints each run's seconds and the
# median. Four ranks on two cores oversubscribe.
set -uo pipefail
build=$(cd "${1:?usage: bench/elastic_times.sh BUILD [RUNS]}" && pwd)
runs=${2:-5}
run=$build/comm/launch/collie-run
probe=$build/tests/elastic_probe
export COLLIE_TIMEOUT=60
for be in tcp shm; do
  for how in elastic restart; do
    flags=(--max-restarts 1)
    [ "$how" = elastic ] && flags+=(--elastic)
    times=()
    for _ in $(seq "$runs"); do
      out=$(COLLIE_BACKEND=$be timeout 120 "$run" -n 4 "${flags[@]}" "$probe" --steps 30 \
        --kill-rank 1 --kill-at 10 2>&1)
      killed=$(sed -nE 's/.*killed at step 10 epoch=([0-9.]+).*/\1/p' <<<"$out" | head -n 1)
      back=$(sed -nE 's/^\[0\] (step 10 again with 4 ranks|first step after a restart) epoch=([0-9.]+).*/\2/p' \
        <<<"$out" | head -n 1)
      if [ -n "$killed" ] && [ -n "$back" ]; then
        times+=("$(python3 -c "print(f'{float($back) - float($killed):.3f}')")")
      else
        times+=("failed")
      fi
    done
    python3 - "$be" "$how" "${times[@]}" <<'PY'
import statistics, sys
be, how, *t = sys.argv[1:]
ok = sorted(float(x) for x in t if x != "failed")
med = f"{statistics.median(ok):.3f} s" if ok else "-"
print(f"{be:4} {how:8} median {med}  runs: {' '.join(t)}")
PY
  done
done
