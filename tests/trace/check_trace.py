#!/usr/bin/env python3
"""COLLIE_TRACE's files, read back with json and checked against what the
job did (tests/trace/trace_job.cc, or test_nccl's NcclTrace test).

  check_trace.py collectives RANKS COLLIE_RUN TRACE_JOB
  check_trace.py reducer     RANKS COLLIE_RUN TRACE_JOB
  check_trace.py die         RANKS COLLIE_RUN TRACE_JOB
  check_trace.py off         RANKS COLLIE_RUN TRACE_JOB
  check_trace.py bad_path    RANKS COLLIE_RUN TRACE_JOB
  check_trace.py nccl        TEST_NCCL
  check_trace.py clock       RANKS COLLIE_RUN TRACE_JOB
  check_trace.py some        RANKS COLLIE_RUN TRACE_JOB

Every file is first checked as a trace viewer reads it (check_format): a JSON
array of events with the fields their phase needs, pid = rank, a name for
every row, async begin/end pairs that match, run spans of a communicator
that do not overlap. Then each mode checks the events the job must have
left: exact counts per operation, issued <= started <= finished, bytes =
count x dtype size, one gradient-ready event per parameter per step, ...
The backend comes from COLLIE_BACKEND (the test sets it).
"""
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile

DTYPE_SIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1}
EPS = 0.0015  # us: timestamps are written to the nanosecond, rounded


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, env_extra, cwd=None, expect_rc=0):
    env = dict(os.environ)
    env.pop("COLLIE_TRACE", None)
    env.update(env_extra)
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if expect_rc is not None and p.returncode != expect_rc:
        fail("%s exited %d (expected %d)\nstdout:\n%s\nstderr:\n%s"
             % (" ".join(cmd), p.returncode, expect_rc, p.stdout, p.stderr))
    return p


def load(path, rank):
    expect(os.path.exists(path), "rank %d wrote no trace at %s" % (rank, path))
    with open(path, encoding="utf-8") as f:
        try:
            events = json.load(f)
        except json.JSONDecodeError as e:
            fail("%s is not JSON: %s" % (path, e))
    check_format(events, rank, path)
    return events


def check_format(events, rank, path):
    expect(isinstance(events, list) and events, "%s: not a non-empty JSON array" % path)
    names = {}
    pairs = collections.defaultdict(list)
    for e in events:
        where = "%s: event %r" % (path, e)
        expect(isinstance(e, dict), where + " is not an object")
        expect(e.get("ph") in ("M", "i", "X", "b", "e"), where + ": unknown phase")
        expect(e.get("pid") == rank, where + ": pid is not the rank %d" % rank)
        expect(isinstance(e.get("tid"), int) and isinstance(e.get("name"), str), where)
        expect(isinstance(e.get("args", {}), dict), where + ": args is not an object")
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                names[e["tid"]] = e["args"]["name"]
            continue
        expect(isinstance(e.get("ts"), (int, float)), where + ": no ts")
        if e["ph"] == "X":
            expect(isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, where + ": dur")
        if e["ph"] in "be":
            expect(isinstance(e.get("cat"), str) and isinstance(e.get("id"), str), where)
            pairs[(e["cat"], e["id"])].append(e)
    procs = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    expect(len(procs) == 1 and procs[0]["args"]["name"] == "rank %d" % rank,
           "%s: the process is not named 'rank %d'" % (path, rank))
    for e in events:
        expect(e["tid"] == 0 or e["tid"] in names, "%s: row %d has no name" % (path, e["tid"]))
    for key, evs in pairs.items():
        expect([x["ph"] for x in evs] == ["b", "e"], "%s: async %r is not one begin, one end: %r"
               % (path, key, evs))
        expect(evs[0]["name"] == evs[1]["name"] and evs[0]["ts"] <= evs[1]["ts"] + EPS,
               "%s: async %r ends before it begins" % (path, key))
    # A communicator's run spans follow one another. A span the writer saw
    # end after a later one on the same stream (a device's completions can be
    # observed out of order) is written as a point at its own end
    # (Track::serial_start), which may fall inside the later one's span: it
    # is not a run of its own, so it is left out of this check (it failed
    # CI once, under ASan, with the writer right).
    for tid, name in names.items():
        if not name.startswith("collectives "):
            continue
        spans = sorted((e for e in events if e["ph"] == "X" and e["tid"] == tid and e["dur"] > 0),
                       key=lambda e: e["ts"])
        for a, b in zip(spans, spans[1:]):
            expect(a["ts"] + a["dur"] <= b["ts"] + EPS,
                   "%s: on '%s', %s #%s overlaps %s #%s" % (path, name, a["name"],
                                                            a["args"]["seq"], b["name"],
                                                            b["args"]["seq"]))


def rows(events, prefix):
    """tid -> name of the rows whose name starts with prefix."""
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"].startswith(prefix)}


def one_row(events, prefix, path):
    found = rows(events, prefix)
    expect(len(found) == 1, "%s: not one row named '%s...': %r" % (path, prefix, rows(events, "")))
    return next(iter(found))


def ops(events, tid):
    """The operations of a communicator's row, in issue order: run spans (X)
    and the begin of point-to-point runs (b, cat p2p)."""
    out = [e for e in events if e["tid"] == tid and
           (e["ph"] == "X" or (e["ph"] == "b" and e["cat"] == "p2p"))]
    return sorted(out, key=lambda e: e["args"]["issued_us"])


def check_op(e, backend, path):
    a = e["args"]
    what = "%s: %s #%s" % (path, a["op"], a["seq"])
    expect(a["issued_us"] <= a["started_us"] <= a["finished_us"],
           what + ": not issued <= started <= finished: %r" % a)
    expect(e["ts"] >= a["started_us"] - EPS, what + ": its span starts before the op did")
    if e["ph"] == "X":
        expect(abs(e["ts"] + e["dur"] - a["finished_us"]) <= EPS, what + ": span end")
    if a["op"] == "barrier":
        expect(a["count"] == 0 and a["bytes"] == 0, what + ": a barrier moves no bytes")
    else:
        expect(a["bytes"] == a["count"] * DTYPE_SIZE[a["dtype"]], what + ": bytes != count x size")
    expect(a["backend"] == backend, what + ": backend %r, expected %r" % (a["backend"], backend))
    if "error" not in a and a["op"] not in ("send", "recv"):
        expect(a.get("algorithm"), what + ": no algorithm")
    return a


def queue_spans(events, tid):
    return [e for e in events if e["tid"] == tid and e["ph"] == "b" and e["cat"] == "queue"]


def check_collectives(n, collie_run, job):
    backend = os.environ.get("COLLIE_BACKEND", "tcp")
    with tempfile.TemporaryDirectory() as d:
        run([collie_run, "-n", str(n), job, "collectives"], {"COLLIE_TRACE": d + "/job.json"})
        expect(sorted(os.listdir(d)) == sorted("job.rank%d.json" % r for r in range(n)),
               "files: %r" % os.listdir(d))
        for r in range(n):
            path = "%s/job.rank%d.json" % (d, r)
            ev = load(path, r)
            world = rows(ev, "collectives collie/world ")
            expect(len(world) == 1, path + ": rows %r" % world)
            wtid = next(iter(world))
            expect(world[wtid] == "collectives collie/world (%s, rank %d of %d)" % (backend, r, n),
                   path + ": " + world[wtid])
            got = [check_op(e, backend, path) for e in ops(ev, wtid)]
            # What trace_job.cc issued, in order; split's own allgather of
            # colors and keys is the allgather before the mismatch.
            want = [("allreduce", 1, "f32", "sum"), ("allreduce", 100000, "f32", "avg"),
                    ("allreduce", 7, "i64", "max"), ("broadcast", 10, "f64", None),
                    ("allgather", 5, "i32", None), ("reduce_scatter", 4, "f32", "sum"),
                    ("barrier", 0, None, None), ("send", 3, "f32", None),
                    ("recv", 3, "f32", None)] + [("allreduce", 1000, "f32", "sum")] * 3 + \
                   [("allgather", 2, "i64", None), ("allreduce", 5 if r == 1 else 4, "f32", "sum"),
                    ("allreduce", 4, "f32", "sum")]
            expect([(a["op"], a["count"], a.get("dtype"), a.get("redop")) for a in got] == want,
                   path + ": operations\n  %r\nexpected\n  %r" % (
                       [(a["op"], a["count"], a.get("dtype"), a.get("redop")) for a in got], want))
            counts = collections.Counter(a["op"] for a in got)
            expect(counts == collections.Counter({"allreduce": 8, "allgather": 2, "broadcast": 1,
                                                  "reduce_scatter": 1, "barrier": 1, "send": 1,
                                                  "recv": 1}), path + ": %r" % counts)
            colls = [a for a in got if a["op"] not in ("send", "recv")]
            # Numbered in issue order; the refused last one never was.
            expect([a["seq"] for a in colls] == list(range(1, 13)) + [0],
                   path + ": seq %r" % [a["seq"] for a in colls])
            expect(got[1]["redop"] == "avg" and got[3]["root"] == n - 1, path + ": redop, root")
            send, recv = got[7], got[8]
            expect(send["peer"] == (r + 1) % n and recv["peer"] == (r + n - 1) % n and
                   send["tag"] == 7, path + ": peers %r %r" % (send, recv))
            burst = got[9:12]
            expect(burst[0]["issued_us"] <= burst[1]["issued_us"] <= burst[2]["issued_us"] and
                   burst[1]["started_us"] >= burst[0]["finished_us"] - EPS and
                   burst[2]["started_us"] >= burst[1]["finished_us"] - EPS,
                   path + ": the burst did not queue one behind the other: %r" % burst)
            expect(all("error" not in a for a in got[:-2]), path + ": an error before the mismatch")
            # Each moved bytes between processes: no run is instant (the
            # timestamps are in nanoseconds).
            expect(all(a["finished_us"] > a["started_us"] for a in got[:-2]),
                   path + ": an operation that ran in no time: %r" % got[:-2])
            expect("error" in got[-2] and "error" in got[-1] and
                   "failed earlier" in got[-1]["error"],
                   path + ": the mismatch and the refused call: %r %r" % (got[-2], got[-1]))
            # One queue span per operation, named after it.
            qs = queue_spans(ev, wtid)
            expect(len(qs) == len(got), path + ": %d queue spans for %d ops" % (len(qs), len(got)))
            # The split: a row of its own, its one allreduce numbered 1.
            sub = rows(ev, "collectives collie/world/s1c%d " % (r % 2))
            expect(len(sub) == 1, path + ": split rows %r" % rows(ev, "collectives"))
            sub_ops = [check_op(e, backend, path) for e in ops(ev, next(iter(sub)))]
            expect([(a["op"], a["count"], a["seq"]) for a in sub_ops] == [("allreduce", 2, 1)],
                   path + ": the split's operations %r" % sub_ops)
            print("rank %d: %d operations on the world, 1 on the split, as issued" % (r, len(got)))


def check_reducer(n, collie_run, job):
    sizes = [300, 50, 1000, 7, 2000, 100]
    steps = 4
    with tempfile.TemporaryDirectory() as d:
        # Rank 0's reducer logs at INFO every 2 iterations, and so every
        # rank compares its arrivals then (base/arrivals.h).
        run([collie_run, "-n", str(n), job, "reducer", str(steps)] + [str(s) for s in sizes],
            {"COLLIE_TRACE": d + "/r%r.trace.json", "COLLIE_DEBUG": "INFO",
             "COLLIE_REDUCER_LOG_EVERY": "2"})
        expect(sorted(os.listdir(d)) == sorted("r%d.trace.json" % r for r in range(n)),
               "files: %r" % os.listdir(d))
        for r in range(n):
            path = "%s/r%d.trace.json" % (d, r)
            ev = load(path, r)
            red = rows(ev, "reducer ")
            expect(len(red) == 1, path + ": reducer rows %r" % red)
            rtid = next(iter(red))
            world = one_row(ev, "collectives collie/world ", path)
            allreduces = [e["args"] for e in ops(ev, world) if e["args"]["op"] == "allreduce"]
            mine = [e for e in ev if e["tid"] == rtid and e["ph"] != "M"]
            starts = [e for e in mine if e["name"] == "backward start"]
            expect([e["args"]["iteration"] for e in starts] == list(range(steps)),
                   path + ": backward starts %r" % starts)
            for it in range(steps):
                at = lambda e: e["args"].get("iteration") == it  # noqa: E731
                start = starts[it]["ts"]
                ready = [e for e in mine if e["name"] == "grad ready" and at(e)]
                expect(sorted(e["args"]["param"] for e in ready) == list(range(len(sizes))),
                       path + ": step %d: gradients ready %r" % (it, ready))
                expect(all(e["ts"] >= start for e in ready), path + ": ready before the start")
                # Marked last to first.
                expect([e["args"]["param"] for e in sorted(ready, key=lambda e: e["ts"])] ==
                       list(reversed(range(len(sizes)))), path + ": order of readiness")
                bucket_of = {e["args"]["param"]: e["args"]["bucket"] for e in ready}
                begins = [e for e in mine if e["ph"] == "b" and at(e)]
                ends = {e["id"]: e for e in mine if e["ph"] == "e"}
                indices = sorted(e["args"]["index"] for e in begins)
                expect(indices == sorted(set(bucket_of.values())) and len(indices) >= 3,
                       path + ": step %d: buckets %r for %r" % (it, indices, bucket_of))
                expect(sum(e["args"]["bytes"] for e in begins) == 4 * sum(sizes),
                       path + ": bucket bytes")
                wait = [e for e in mine if e["name"] == "finalize wait" and at(e)]
                back = [e for e in mine if e["name"] == "backward" and at(e)]
                expect(len(wait) == 1 and len(back) == 1, path + ": step %d: spans" % it)
                wait_end = wait[0]["ts"] + wait[0]["dur"]
                expect(wait[0]["ts"] >= max(e["ts"] for e in ready) - EPS,
                       path + ": finalize waited before the last gradient was ready")
                for b in begins:
                    idx = b["args"]["index"]
                    e = ends[b["id"]]
                    last_ready = max(x["ts"] for x in ready if x["args"]["bucket"] == idx)
                    expect(b["ts"] >= last_ready - EPS, path + ": bucket %d before its grads" % idx)
                    expect(b["ts"] <= e["ts"] <= wait_end + EPS and "error" not in e["args"],
                           path + ": bucket %d: launched %s, finished %s, finalize until %s"
                           % (idx, b["ts"], e["ts"], wait_end))
                    expect(b["args"]["hook"] == "allreduce", path + ": hook")
                    # Its all-reduce, on the communicator's row, inside it.
                    inside = [a for a in allreduces if a["bytes"] == b["args"]["bytes"] and
                              b["ts"] - EPS <= a["issued_us"] and a["finished_us"] <= e["ts"] + EPS]
                    expect(len(inside) >= 1, path + ": bucket %d's allreduce (%d B) is not "
                           "inside it" % (idx, b["args"]["bytes"]))
            # The arrivals compared after iterations 1 and 3, on the
            # reducer's row and (with the sentence) on the communicator's.
            told = [e for e in mine if e["name"] == "arrivals"]
            expect([e["args"]["iteration"] for e in told] == [1, 3] and
                   all(e["args"]["collectives"] >= 1 for e in told),
                   path + ": the reducer's arrivals %r" % told)
            said = [e for e in ev if e["tid"] == world and e["name"] == "arrivals"]
            expect(len(said) == 2 and all(" arrived last in " in e["args"]["summary"] and
                                          e["args"]["summary"] == t["args"]["summary"]
                                          for e, t in zip(said, told)),
                   path + ": the communicator's arrivals %r" % said)
            print("rank %d: %d steps of %d gradients, buckets and waits in order"
                  % (r, steps, len(sizes)))


def check_die(n, collie_run, job):
    with tempfile.TemporaryDirectory() as d:
        run([collie_run, "-n", str(n), job, "die"], {"COLLIE_TRACE": d + "/died"})
        for r in range(n):
            path = "%s/died.rank%d.json" % (d, r)
            ev = load(path, r)
            world = one_row(ev, "collectives collie/world ", path)
            got = [e["args"] for e in ops(ev, world) if e["args"]["op"] == "allreduce"]
            expect(len(got) == 4 and all("error" not in a for a in got),
                   "rank %d: %d all-reduces in the file of a process that exited without "
                   "cleaning up" % (r, len(got)))
            print("rank %d: the file of a process that died is JSON, with its 4 all-reduces" % r)


def check_off(n, collie_run, job):
    for value in (None, ""):
        with tempfile.TemporaryDirectory() as d:
            env = {} if value is None else {"COLLIE_TRACE": value}
            run([collie_run, "-n", str(n), job, "collectives"], env, cwd=d)
            expect(os.listdir(d) == [], "COLLIE_TRACE=%r left %r" % (value, os.listdir(d)))
    print("no file without COLLIE_TRACE, nor with it empty")


def check_bad_path(n, collie_run, job):
    with tempfile.TemporaryDirectory() as d:
        spec = d + "/no/such/dir/t"
        p = run([collie_run, "-n", str(n), job, "collectives"], {"COLLIE_TRACE": spec})
        for r in range(n):
            want = "COLLIE_TRACE=%s: rank %d cannot write its trace to '%s.rank%d.json'" % (
                spec, r, spec, r)
            expect(want in p.stderr, "no warning %r in\n%s" % (want, p.stderr))
        expect(not os.path.exists(d + "/no"), "something was created")
    print("a directory that does not exist: each rank warns, the job runs")


def check_nccl(test_nccl):
    with tempfile.TemporaryDirectory() as d:
        p = run([test_nccl, "--gtest_filter=NcclTrace.*"], {"COLLIE_TRACE": d + "/nccl.%r.json"})
        expect("[  PASSED  ] 1 test" in p.stdout, p.stdout)
        for r in (0, 1):
            path = "%s/nccl.%d.json" % (d, r)
            ev = load(path, r)
            nc = [t for t, name in rows(ev, "collectives ").items() if "(nccl," in name]
            expect(len(nc) == 1, path + ": rows %r" % rows(ev, ""))
            got = [check_op(e, "nccl", path) for e in ops(ev, nc[0])]
            expect([(a["op"], a["count"], a["algorithm"]) for a in got] ==
                   [("allreduce", 1000, "nccl")] * 3 + [("broadcast", 1000, "nccl"),
                                                        ("send", 10, "nccl"), ("recv", 10, "nccl")],
                   path + ": %r" % got)
            # Issued together, run one after the other on the stream.
            for a, b in zip(got[:3], got[1:3]):
                expect(a["issued_us"] <= b["issued_us"], path + ": issue order")
            staged = sorted(t for t, name in rows(ev, "collectives ").items()
                            if "(tcp, rank 0 of 1)" in name)
            expect(len(staged) == (2 if r == 0 else 0), path + ": staged rows %r" % rows(ev, ""))
            if staged:
                s = [check_op(e, "tcp", path) for e in ops(ev, staged[0])]
                expect([(a["op"], a["count"], a["algorithm"]) for a in s] ==
                       [("allreduce", 10000, "staged")],
                       path + ": a staged all-reduce is one operation, not its pieces: %r" % s)
                s = [check_op(e, "tcp", path) for e in ops(ev, staged[1])]
                expect(len(s) == 1 and "this build has no NCCL" in s[0].get("error", ""),
                       path + ": the op refused for want of NCCL: %r" % s)
        print("nccl: every operation on the fake device's timeline, run spans in stream order")


def check_clock(n, collie_run, job):
    """Two nodes of n ranks, the second in a time namespace whose monotonic
    clock runs 1000 s ahead (unshare --time: another host's clock, on this
    machine). Each rank's file must be on rank 0's clock: no all-reduce or
    all-gather ends on any rank before every rank has issued it (it cannot
    end before the last contribution is on its way), which a 1000 s skew
    breaks by a million-fold; and the offsets the files record are the
    skew."""
    skew_s = 1000
    probe = subprocess.run(["unshare", "--time", "--monotonic", str(skew_s), "--fork", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: no time namespace here (unshare --time, needs root and Linux 5.6): "
              + probe.stderr.strip())
        sys.exit(77)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, COLLIE_TRACE=d + "/clock.json", COLLIE_JOB_SECRET="clock-test")
        env.pop("COLLIE_BACKEND", None)
        procs = []
        for node in (0, 1):
            cmd = [collie_run, "-n", str(n), "--nnodes", "2", "--node-rank", str(node),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), job, "reducer", "3",
                   "1000", "3000", "20"]
            if node == 1:
                cmd = ["unshare", "--time", "--monotonic", str(skew_s), "--fork"] + cmd
            procs.append(subprocess.Popen(cmd, env=dict(env, COLLIE_HOSTNAME="host-%d" % node),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=300)[0] for p in procs]
        for node, p in enumerate(procs):
            expect(p.returncode == 0, "node %d exited %d:\n%s" % (node, p.returncode, outs[node]))
        by_seq = collections.defaultdict(dict)
        for r in range(2 * n):
            path = "%s/clock.rank%d.json" % (d, r)
            ev = load(path, r)
            start = [e for e in ev if e["name"] == "trace start"]
            expect(len(start) == 1, path + ": %d trace start events" % len(start))
            off_s = start[0]["args"]["clock_offset_us"] / 1e6
            want = -skew_s if r >= n else 0
            expect(abs(off_s - want) < 0.05, "rank %d: clock offset %.6f s, expected %d s (%r)"
                   % (r, off_s, want, start[0]["args"]))
            world = one_row(ev, "collectives collie/world ", path)
            for e in ops(ev, world):
                a = e["args"]
                # A broadcast may end on its root before the others call
                # it (its data waits in their buffers); an all-reduce and an
                # all-gather cannot end before every rank has given its part.
                if a["op"] in ("allreduce", "allgather", "reduce_scatter") and "error" not in a:
                    by_seq[a["seq"]][r] = a
        seqs = [k for k, v in by_seq.items() if len(v) == 2 * n]
        expect(len(seqs) >= 3, "collectives on every rank: %r" % sorted(by_seq))
        margin = float("inf")
        for k in seqs:
            last_issue = max(a["issued_us"] for a in by_seq[k].values())
            first_end = min(a["finished_us"] for a in by_seq[k].values())
            margin = min(margin, first_end - last_issue)
            # The offset's error is at most half the fastest round trip.
            expect(last_issue <= first_end + 5000,
                   "collective #%d ended on a rank %.0f us before the last rank issued it: the "
                   "files are not on one clock" % (k, last_issue - first_end))
        print("%d ranks on two clocks %d s apart: offsets measured, %d all-reduces and "
              "all-gathers in causal order on rank 0's clock (the last issue %.1f us or more "
              "before the first end)" % (2 * n, skew_s, len(seqs), margin))


def check_some(n, collie_run, job):
    """COLLIE_TRACE set on some ranks only (here all but rank 1, then all but
    rank 0): the job runs as without a trace (no rank waits to measure a
    clock with a rank that does not trace), the ranks that trace write
    their files, and each file says whether its clock was measured."""
    for untraced in (1, 0):
        with tempfile.TemporaryDirectory() as d:
            wrap = ("if [ $RANK = %d ]; then unset COLLIE_TRACE; fi; exec \"$0\" \"$@\""
                    % untraced)
            run([collie_run, "-n", str(n), "sh", "-c", wrap, job, "collectives"],
                {"COLLIE_TRACE": d + "/some.json", "COLLIE_TIMEOUT": "30"})
            expect(sorted(os.listdir(d)) == sorted("some.rank%d.json" % r for r in range(n)
                                                   if r != untraced),
                   "files: %r" % os.listdir(d))
            for r in range(n):
                if r == untraced:
                    continue
                ev = load("%s/some.rank%d.json" % (d, r), r)
                start = [e for e in ev if e["name"] == "trace start"]
                expect(len(start) == 1, "rank %d: %d trace start events" % (r, len(start)))
                how = start[0]["args"]["clock_alignment"]
                if r == 0:
                    expect(how.startswith("rank 0"), "rank 0: %r" % how)
                elif untraced == 0:
                    expect("rank 0 writes no trace" in how, "rank %d: %r" % (r, how))
                else:
                    expect(how.startswith("against rank 0"), "rank %d: %r" % (r, how))
                world = one_row(ev, "collectives collie/world ", "rank %d" % r)
                # What trace_job issues (check_collectives lists them), no more:
                # the measurement's messages are not in the file.
                expect(len(ops(ev, world)) == 15,
                       "rank %d: %d operations" % (r, len(ops(ev, world))))
    print("COLLIE_TRACE on some ranks only: the job runs, the others measure among themselves")


def main():
    mode = sys.argv[1]
    if mode == "nccl":
        return check_nccl(os.path.abspath(sys.argv[2]))
    # Absolute: some modes run the job in a directory of their own.
    n, collie_run, job = int(sys.argv[2]), os.path.abspath(sys.argv[3]), os.path.abspath(sys.argv[4])
    {"collectives": check_collectives, "reducer": check_reducer, "die": check_die,
     "off": check_off, "bad_path": check_bad_path, "clock": check_clock,
     "some": check_some}[mode](n, collie_run, job)


if __name__ == "__main__":
    main()
