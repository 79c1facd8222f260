#!/usr/bin/env python3
"""check_trace.py's own format rules on made-up traces, so that the checker
and the writer agree (trace_nccl_fake_device once failed CI on a trace the
writer had made right: a span seen ending after a later one on the same
stream is written as a point at its own end, inside the later span).

  check_trace_selftest.py
"""
import json
import os
import subprocess
import sys


def trace(spans):
    """A rank-0 trace with one communicator row holding `spans`
    (seq, ts, dur)."""
    ev = [{"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "rank 0"}},
          {"ph": "M", "pid": 0, "tid": 1, "name": "thread_name",
           "args": {"name": "collectives world (nccl, rank 0 of 2)"}}]
    for seq, ts, dur in spans:
        ev.append({"ph": "X", "pid": 0, "tid": 1, "name": "allreduce", "ts": ts, "dur": dur,
                   "args": {"seq": seq}})
    return ev


def accepted(spans):
    # check_format exits on a failure: run it in a child to see which.
    code = ("import sys, json; sys.path.insert(0, %r); import check_trace; "
            "check_trace.check_format(json.loads(sys.stdin.read()), 0, 'made-up')"
            % os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps(trace(spans)),
                       capture_output=True, text=True)
    return p.returncode == 0, p.stderr.strip()


cases = [
    ("spans one after another", [(1, 10.0, 5.0), (2, 20.0, 5.0)], True),
    ("a late point inside the later span", [(3, 10.0, 20.0), (1, 20.0, 0.0)], True),
    ("two runs that overlap", [(1, 10.0, 20.0), (2, 20.0, 20.0)], False),
]
failed = 0
for name, spans, want in cases:
    ok, why = accepted(spans)
    print("%s: %s (%s)" % ("ok" if ok == want else "FAIL", name,
                           "accepted" if ok else "refused: " + why))
    failed += ok != want
sys.exit(1 if failed else 0)
