#!/usr/bin/env python3
"""collie-run --max-restarts with the example engine, a rank SIGKILLed from
outside at step 50 of 200: the job must finish, and its final parameters
must be byte-identical to an uninterrupted run's (train_mlp resumes from the
checkpoint rank 0 wrote at step 40). Also: without restarts the same kill
fails the job as before; restarts that run out fail it with the summary;
a damaged checkpoint is a clear error on every rank, not a crash.

  restarts.py COLLIE_RUN TRAIN_MLP [powersgd]

With `powersgd` (a build with BLAS) a second job runs under the PowerSGD
hook on the shm backend with rank 0 killed, so that the per-rank error
feedback must come back from the checkpoint too.
"""
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import socket
import threading

COLLIE_RUN, TRAIN_MLP = (os.path.abspath(p) for p in sys.argv[1:3])
POWERSGD = len(sys.argv) > 3 and sys.argv[3] == "powersgd"
STEPS = 200
# 20 ms a step: after the watcher sees step 50 there are 150 steps (3 s and
# more) left for its kill to land; where it lands (step 50 or 55) does not
# change the result, only which checkpoint the job resumes from.
SLOW = ["--log-every", "1", "--step-sleep-ms", "20"]
work = tempfile.mkdtemp(prefix="collie-restarts-")
failures = []


def check(cond, what, run=None):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)
        if run is not None:
            print("--- stdout ---\n" + run["out"] + "--- stderr ---\n" + run["err"])


def rank_pid(launcher, rank):
    """The pid of the launcher's child that is rank `rank` (from /proc)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ("COLLIE_RANK=%d" % rank).encode() in env:
            return int(d)
    return None


def launch(args, env=None, kills=0, kill_rank=1, timeout=300):
    """Runs collie-run ARGS; each of the first `kills` times rank 0 prints
    step 50, SIGKILLs rank `kill_rank`. Returns its exit code and output."""
    return launch_nodes([args], env, kills, kill_rank, timeout)[0]


def launch_nodes(nodes, env=None, kills=0, kill_rank=1, timeout=300):
    """Runs one collie-run per entry of NODES (its arguments, or its arguments
    and its own environment), together, as the nodes of one job; kills as
    launch() does, rank `kill_rank` under whichever launcher started it.
    Returns each node's exit code and output."""
    e = dict(os.environ, COLLIE_TIMEOUT="60")
    e.update(env or {})
    nodes = [n if isinstance(n, tuple) else (n, {}) for n in nodes]
    ps = [subprocess.Popen([COLLIE_RUN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=dict(e, **own), text=True, cwd=work) for args, own in nodes]
    runs = [{"out": [], "err": []} for _ in ps]
    readers = [threading.Thread(target=lambda p=p, r=r: r["err"].append(p.stderr.read()))
               for p, r in zip(ps, runs)]
    readers += [threading.Thread(target=lambda p=p, r=r: r["out"].append(p.stdout.read()))
                for p, r in zip(ps[1:], runs[1:])]
    for t in readers:
        t.start()
    timers = [threading.Timer(timeout, p.kill) for p in ps]  # a hang ends as a failure
    for t in timers:
        t.start()
    killed = 0
    for line in ps[0].stdout:
        runs[0]["out"].append(line)
        if killed < kills and re.match(r"\[0\] step +50 ", line):
            pid = next((q for q in (rank_pid(p.pid, kill_rank) for p in ps) if q), None)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed += 1
    for p, t in zip(ps, timers):
        p.wait()
        t.cancel()
    for t in readers:
        t.join()
    return [{"rc": p.returncode, "out": "".join(r["out"]), "err": "".join(r["err"]),
             "killed": killed} for p, r in zip(ps, runs)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def restart_job(name, env, kill_rank):
    """An uninterrupted run, then one with rank `kill_rank` killed at step 50."""
    ref, got, ck = (os.path.join(work, name + s) for s in (".ref", ".got", ".ck"))
    base = ["-n", "2", TRAIN_MLP, "--steps", str(STEPS)]
    r = launch(base + ["--dump-params", ref], env)
    check(r["rc"] == 0, name + ": the uninterrupted run exited %d" % r["rc"], r)
    r = launch(["--max-restarts", "2"] + base +
               ["--checkpoint", ck, "--checkpoint-every", "20", "--dump-params", got] + SLOW,
               env, kills=1, kill_rank=kill_rank)
    check(r["killed"] == 1, name + ": rank %d was never killed" % kill_rank, r)
    check(r["rc"] == 0, name + ": the restarted job exited %d" % r["rc"], r)
    check("collie-run: rank %d was killed by signal SIGKILL" % kill_rank in r["err"],
          name + ": the launcher did not report the kill", r)
    check("restarting (attempt 1 of 2) with a fresh rendezvous" in r["err"],
          name + ": the launcher did not report the restart", r)
    m = re.search(r"\[0\] resuming from checkpoint .* at step (\d+)", r["out"])
    check(m is not None and 40 <= int(m.group(1)) < STEPS and int(m.group(1)) % 20 == 0,
          name + ": the restarted ranks did not resume from a checkpoint", r)
    check(os.path.exists(ref) and os.path.exists(got) and read(ref) == read(got),
          name + ": the final parameters differ from the uninterrupted run's", r)
    if not failures:
        print("%s: rank %d killed at step 50, resumed at step %s, final parameters "
              "byte-identical to the uninterrupted run's" % (name, kill_rank, m.group(1)))
    return ck


def two_nodes_job():
    """Two nodes' collie-runs (this host, told apart by COLLIE_HOSTNAME) of
    2 ranks each: rank 3, on node 1, killed at step 50; every node's ranks
    restart and the final parameters are the uninterrupted run's."""
    ref, got, ck = (os.path.join(work, "nodes" + s) for s in (".ref", ".got", ".ck"))
    env = {"COLLIE_JOB_SECRET": "restarts-two-nodes"}

    def nodes(extra):
        port = free_port()
        return [(["--nnodes", "2", "--node-rank", str(k), "--master-addr", "127.0.0.1",
                  "--master-port", str(port), "-n", "2"] + extra,
                 {"COLLIE_HOSTNAME": "host-" + "ab"[k]}) for k in (0, 1)]

    base = [TRAIN_MLP, "--steps", str(STEPS)]
    a, b = launch_nodes(nodes(base + ["--dump-params", ref]), env)
    check(a["rc"] == 0 and b["rc"] == 0, "two nodes: the uninterrupted run failed", a)
    a, b = launch_nodes(nodes(["--max-restarts", "2"] + base +
                              ["--checkpoint", ck, "--checkpoint-every", "20",
                               "--dump-params", got] + SLOW), env, kills=1, kill_rank=3)
    check(a["killed"] == 1, "two nodes: rank 3 was never killed", a)
    check(a["rc"] == 0 and b["rc"] == 0,
          "two nodes: the restarted job exited %d and %d" % (a["rc"], b["rc"]), a)
    check("collie-run: rank 3 was killed by signal SIGKILL" in b["err"],
          "two nodes: node 1 did not report the kill", b)
    for n, r in enumerate((a, b)):
        check("the job's first failure: rank 3 on node 1" in r["err"] and
              "the ranks of all 2 nodes have ended; restarting (attempt 1 of 2)" in r["err"],
              "two nodes: node %d did not report the restart" % n, r)
    m = re.search(r"\[0\] resuming from checkpoint .* at step (\d+)", a["out"])
    check(m is not None and 40 <= int(m.group(1)) < STEPS,
          "two nodes: the restarted ranks did not resume from a checkpoint", a)
    check(os.path.exists(ref) and os.path.exists(got) and read(ref) == read(got),
          "two nodes: the final parameters differ from the uninterrupted run's", a)
    if not failures:
        print("two nodes: rank 3 (node 1) killed at step 50, every node restarted, resumed at "
              "step %s, final parameters byte-identical to the uninterrupted run's" % m.group(1))


try:
    ck = restart_job("tcp", {"COLLIE_BACKEND": "tcp"}, kill_rank=1)
    two_nodes_job()
    if POWERSGD:
        restart_job("shm_powersgd", {"COLLIE_BACKEND": "shm", "OPENBLAS_NUM_THREADS": "1",
                                     "COLLIE_COMM_HOOK": "powersgd:rank=2,start_iter=10"},
                    kill_rank=0)

    # Without --max-restarts the same kill ends the job, as it always did.
    def job(ck):
        return ["-n", "2", TRAIN_MLP, "--steps", str(STEPS), "--checkpoint",
                os.path.join(work, ck)] + SLOW
    r = launch(job("none.ck"), kills=1)
    check(r["rc"] == 128 + signal.SIGKILL and "root cause: rank 1" in r["err"] and
          "restarting" not in r["err"], "no restarts: the kill did not end the job", r)

    # Restarts that run out: killed in the first round and again after the
    # restart (which resumes before step 50 and passes it again).
    r = launch(["--max-restarts", "1"] + job("two.ck"), kills=2)
    check(r["rc"] == 128 + signal.SIGKILL and r["killed"] == 2,
          "restarts run out: the job exited %d after %d kills" % (r["rc"], r["killed"]), r)
    check("restarting (attempt 1 of 1)" in r["err"] and "---- the job failed ----" in r["err"] and
          "no restarts left: 1 of 1 used" in r["err"], "restarts run out: no summary", r)

    # Damaged checkpoints: each a clear error on every rank, exit 1, no crash.
    good = read(ck)

    def fnv(b):
        h = 0xcbf29ce484222325
        for c in b:
            h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        return h

    # Cut inside the parameters, with a checksum that matches the cut: the
    # lengths must be checked, not only the checksum.
    cut = good[:5000]
    # A parameter count far beyond the file (2^62), checksum matching: an
    # error, not an attempt to allocate it. (Its offset: magic, step, ranks,
    # shape length, 5 widths.)
    at = 8 + 8 + 8 + 8 + 5 * 8
    huge = good[:at] + struct.pack("<Q", 1 << 62) + good[at + 8:-8]
    cases = [
        ("truncated", good[:len(good) // 2], "is damaged or truncated: its checksum does not match"),
        ("a byte flipped", good[:3000] + bytes([good[3000] ^ 1]) + good[3001:],
         "is damaged or truncated: its checksum does not match"),
        ("cut with a matching checksum", cut + struct.pack("<Q", fnv(cut)),
         "is truncated or damaged: it ends inside the parameters"),
        ("claiming 2^62 parameters", huge + struct.pack("<Q", fnv(huge)),
         "is truncated or damaged: it ends inside the parameters"),
        ("not a checkpoint", b"hello world, this is not a checkpoint at all",
         "is not a train_mlp checkpoint"),
        ("empty", b"", "is not a train_mlp checkpoint"),
    ]
    bad = os.path.join(work, "bad.ck")
    for what, data, says in cases:
        with open(bad, "wb") as f:
            f.write(data)
        r = launch(["-n", "2", TRAIN_MLP, "--steps", "10", "--checkpoint", bad])
        check(r["rc"] == 1 and ("[0] train_mlp: rank 0: checkpoint %s %s" % (bad, says)) in r["err"]
              and "[1] train_mlp: rank 1: checkpoint %s could not be loaded on rank 0" % bad
              in r["err"], "a checkpoint %s: no clear error" % what, r)
    shutil.copy(ck, bad)
    r = launch(["-n", "3", TRAIN_MLP, "--steps", "10", "--checkpoint", bad])
    check(r["rc"] == 1 and "was saved by a job of 2 ranks and this one has 3" in r["err"],
          "a checkpoint of another world size: no clear error", r)
    r = launch(["-n", "2", TRAIN_MLP, "--steps", "10", "--hidden", "64", "--checkpoint", bad])
    check(r["rc"] == 1 and "holds a 16-128-128-128-4 model and this one is 16-64-64-64-4" in r["err"],
          "a checkpoint of another model: no clear error", r)
    # The flags themselves: a bad value is named, before anything starts.
    for argv, says in ((["--steps", "abc"], "--steps takes a whole number in 0..1000000000, not 'abc'"),
                       (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint PATH"),
                       (["--checkpoint"], "--checkpoint needs a value"),
                       (["--frobnicate"], "unknown option '--frobnicate'")):
        r = subprocess.run([TRAIN_MLP] + argv, capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and says in r.stderr and "usage: train_mlp" in r.stderr,
              "train_mlp %s: no clear usage error" % " ".join(argv),
              {"out": r.stdout, "err": r.stderr})
    if not failures:
        print("no restarts: the kill fails the job; restarts run out: the summary; damaged "
              "checkpoints (truncated, flipped, cut, oversized count, foreign, empty, other world, "
              "other model): clear errors")
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
