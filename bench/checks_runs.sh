#!/usr/bin/env bash
# Runs bench/checks_bench RUNS times on BACKEND (2 ranks) and prints, per
# gradient mode, the medians over the runs and what the non-finite check
# adds as a share of the all-reduce alone: each run's extra, then their
# median (one run's extra wanders by 10-30 % over TCP on this VM).
#   bench/checks_runs.sh BUILD RUNS BACKEND
set -euo pipefail
build=$1 runs=$2 backend=$3
for _ in $(seq "$runs"); do
  COLLIE_BACKEND=$backend "$build/comm/launch/collie-run" -n 2 "$build/bench/checks_bench" \
    --iters 20 --rounds 3
done | python3 -c '
import re, statistics as st, sys
rows = {}
for line in sys.stdin:
    m = re.match(r"\[0\] \| ([a-z +]+) \| ([0-9.]+) \|", line)
    if m:
        rows.setdefault(m.group(1).strip(), []).append(float(m.group(2)))
alone = rows["allreduce alone"]
for mode in ("copy", "view"):
    extra = [(c - p) / a * 100 for c, p, a in zip(rows[mode + " + nonfinite"], rows[mode], alone)]
    print("%s %s: all-reduce alone %.2f ms, %s %.2f, + nonfinite %.2f; extra per run %s; median %+.1f %%"
          % (sys.argv[1], mode, st.median(alone), mode, st.median(rows[mode]),
             st.median(rows[mode + " + nonfinite"]), " ".join("%+.1f" % e for e in extra),
             st.median(extra)))
' "$backend"
