#!/usr/bin/env python3
"""Soak: the example engine under `collie-run --max-restarts` for a while,
with a rank SIGKILLed at random every few minutes, jobs back to back,
alternating the tcp and shm backends. Every job must end well (no hang, no
failure) with final parameters byte-identical to an uninterrupted run of the
same length on the same backend; and nothing may grow: file descriptors and
memory (RSS) of the launcher and the ranks, entries in /dev/shm, processes
left behind. Prints what it counted and exits 1 on any wrong result, hang,
failure, leftover process or growth.

  soak.py --collie-run PATH --train-mlp PATH [--duration 1800] [--kill-every 120] [--elastic]
          [--torch PYTHON]

With --torch PYTHON the jobs are PyTorch's instead of the example engine's:
examples/train_ddp.py (collie.torch's DistributedDataParallel, SGD with
momentum) run by PYTHON, with PYTHONPATH and COLLIE_LIBRARY from the
environment; under --elastic its survivors call ddp.reform(), and without
it rank 0 checkpoints the model, the optimizer and the wrapper's state.

With --elastic, jobs run under `collie-run --elastic`: a killed rank is
started again alone and joins the running job, the others keep their state
in memory (train_mlp's shrink, grow and handoff), and no checkpoint is
written. Either way the soak times each recovery: from the kill to rank 0's
first step done after it ("back at step ..." or "first step after
resuming ...", with the wall clock), and reports the median and the most.

The kills come at uniformly random times, 0.5 to 1.5 times --kill-every
apart, each on a uniformly random rank of the job running then (rank 0, the
store's owner, too). Run it under `nice -n 19`: it measures hangs,
correctness and growth, not speed.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_growth import METRICS, fd_growth, rss_margin, steady  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--collie-run", required=True)
ap.add_argument("--train-mlp", required=True)
ap.add_argument("--torch", default="",
                help="a Python with PyTorch: run examples/train_ddp.py instead of train_mlp")
ap.add_argument("--duration", type=float, default=1800, help="seconds of jobs to start (default 1800)")
ap.add_argument("--kill-every", type=float, default=120, help="mean seconds between kills (default 120)")
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--steps", type=int, default=1500, help="steps of every job (default 1500)")
ap.add_argument("--step-sleep-ms", type=int, default=10,
                help="train_mlp's pause per step, so that a job lasts a while (default 10)")
ap.add_argument("--checkpoint-every", type=int, default=20)
ap.add_argument("--backends", default="tcp,shm")
ap.add_argument("--max-restarts", type=int, default=1000)
ap.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples")
ap.add_argument("--job-timeout", type=float, default=0,
                help="a job still running after this many seconds is a hang (default: five "
                "times an uninterrupted run and 120 s)")
ap.add_argument("--seed", type=int, default=None)
ap.add_argument("--log-dir", default="",
                help="keep every job's output here (job<N>.out, job<N>.err), not only a bad job's")
ap.add_argument("--settle", type=float, default=None,
                help="seconds into a round before its samples count (default 2; 10 with --torch, "
                "whose ranks take seconds to import PyTorch and re-form)")
ap.add_argument("--elastic", action="store_true",
                help="collie-run --elastic: a killed rank is replaced in the running job")
ap.add_argument("--spares", type=int, default=0,
                help="with --elastic: collie-run --spares K, K warm processes waiting to take "
                     "a killed rank's place")
ap.add_argument("--rss-report-only", action="store_true",
                help="report RSS but do not judge it (sanitizer builds: their allocators keep "
                "freed memory in quarantine, so RSS wanders by tens of percent)")
args = ap.parse_args()
COLLIE_RUN, TRAIN_MLP = os.path.abspath(args.collie_run), os.path.abspath(args.train_mlp)
seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
rng = random.Random(seed)
work = tempfile.mkdtemp(prefix="collie-soak-")


def say(msg):
    print("soak: " + msg, flush=True)


SPARES = {}  # --spares: {id: pid} of the job's spares, as children() last saw them


def children(pid):
    """{rank: pid} of the launcher's live children, and the round they are
    in (their COLLIE_RESTART_COUNT). Under --spares, spares (COLLIE_SPARE)
    are left out (whether a grow took one, only the job's store knows):
    the kills land on ranks started as ranks; SPARES holds the others."""
    out, rounds = {}, set()
    SPARES.clear()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if int(ppid) != pid or state in "ZX":
                continue
            with open("/proc/%s/environ" % d, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"COLLIE_SPARE" in env:
                SPARES[env[b"COLLIE_SPARE"].decode()] = int(d)
            else:
                out[int(env[b"COLLIE_RANK"])] = int(d)
            rounds.add(int(env[b"COLLIE_RESTART_COUNT"]))
        except (OSError, IndexError, ValueError, KeyError):
            continue
    if args.elastic:  # a replacement's count is the replacements so far; the others' older
        return out, (max(rounds) if rounds else None)
    return out, (rounds.pop() if len(rounds) == 1 else None)


def fds(pid, files_of=None):
    """How many descriptors `pid` holds; with `files_of`, not counting files
    under that folder: the checkpoint the engine writes there every few
    steps is open for a moment, and a sample that catches it open is no
    leak (the soak of 229687e's CI failed on one such sample)."""
    try:
        fd_dir = "/proc/%d/fd" % pid
        names = os.listdir(fd_dir)
        if files_of is None:
            return len(names)
        n = 0
        for name in names:
            try:
                n += not os.readlink(os.path.join(fd_dir, name)).startswith(files_of + "/")
            except OSError:
                pass  # closed between the listing and the look
        return n
    except OSError:
        return None


def fd_kinds(pid, files_of):
    """What `pid`'s descriptors are, as counts by kind ("socket", "pipe",
    "anon_inode:[eventfd]", a file's path), not counting files under
    `files_of`: what a report of growth shows."""
    kinds = {}
    try:
        for name in os.listdir("/proc/%d/fd" % pid):
            try:
                t = os.readlink("/proc/%d/fd/%s" % (pid, name))
            except OSError:
                continue
            if t.startswith(files_of + "/"):
                continue
            t = re.sub(r"^(socket|pipe):\[\d+\]$", r"\1", t)
            kinds[t] = kinds.get(t, 0) + 1
    except OSError:
        pass
    return kinds


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def shm_entries():
    return len(os.listdir("/dev/shm"))


def shm_used(pids):
    """The /dev/shm files these processes map or hold open (collie's own
    segments are memfds, which never appear there; this would see a
    transport that made named ones)."""
    used = set()
    for pid in pids:
        try:
            with open("/proc/%d/maps" % pid) as f:
                used.update(line.split(None, 5)[5].strip() for line in f
                            if " /dev/shm/" in line and len(line.split(None, 5)) == 6)
            for fd in os.listdir("/proc/%d/fd" % pid):
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                if target.startswith("/dev/shm/"):
                    used.add(target)
        except OSError:
            pass
    return used


def leftovers():
    """Processes still running with the soak's folder on their command line."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if work.encode() in f.read():
                        found.append(int(d))
            except OSError:
                pass
    return found


TRAIN_DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                         "train_ddp.py")
PROGRAM = [args.torch, os.path.normpath(TRAIN_DDP)] if args.torch else [TRAIN_MLP]
settle = args.settle if args.settle is not None else (10.0 if args.torch else 2.0)


def mlp_args(extra):
    return PROGRAM + ["--steps", str(args.steps), "--log-every", "100"] + extra


def reference(backend):
    """The final parameters of an uninterrupted run on `backend`, and how
    long it took."""
    began = time.monotonic()
    dump = os.path.join(work, "ref-%s.bin" % backend)
    env = dict(os.environ, COLLIE_BACKEND=backend, COLLIE_TIMEOUT="120")
    r = subprocess.run([COLLIE_RUN, "-n", str(args.ranks)] + mlp_args(["--dump-params", dump]),
                       env=env, capture_output=True, text=True, timeout=args.job_timeout or 900)
    if r.returncode != 0:
        say("the uninterrupted %s run failed (%d):\n%s%s" % (backend, r.returncode, r.stdout, r.stderr))
        sys.exit(1)
    with open(dump, "rb") as f:
        return f.read(), time.monotonic() - began


def per_round(st):
    if not st:
        return "no settled samples"
    return ", ".join("%s %s" % (m.replace("_", " ") + (" KiB" if m.endswith("rss") else ""),
                                "/".join("-" if st[r][m] is None else str(st[r][m])
                                         for r in st)) for m in METRICS)


backends = args.backends.split(",")
shm_before = shm_entries()
own_fds_before = fds(os.getpid())
say("seed %d, %d ranks, %d steps a job, a kill every %.0f s on average, for %.0f s, backends %s"
    % (seed, args.ranks, args.steps, args.kill_every, args.duration, ", ".join(backends)))
refs, secs = {}, 0
for b in backends:
    refs[b], took = reference(b)
    secs = max(secs, took)
# A job that takes five times an uninterrupted one, paused, and two minutes
# more (collie's own deadline, COLLIE_TIMEOUT=120, would have ended a stuck
# collective by then) hangs.
job_timeout = args.job_timeout or 5 * (secs + args.steps * args.step_sleep_ms / 1000) + 120
say("uninterrupted runs took up to %.1f s; a job running %.0f s hangs" % (secs, job_timeout))

start = time.monotonic()
next_kill = start + args.kill_every * rng.uniform(0.5, 1.5)
jobs = []  # one dict per job
problems = []
shm_max = shm_before
shm_ours = set()  # /dev/shm files the launcher or a rank ever used
while time.monotonic() - start < args.duration:
    i = len(jobs)
    backend = backends[i % len(backends)]
    ck, dump = os.path.join(work, "job%d.ck" % i), os.path.join(work, "job%d.bin" % i)
    env = dict(os.environ, COLLIE_BACKEND=backend, COLLIE_TIMEOUT="120")
    how = (["--elastic"] + (["--spares", str(args.spares)] if args.spares else [])
           if args.elastic else [])
    keep = [] if args.elastic else ["--checkpoint", ck, "--checkpoint-every",
                                    str(args.checkpoint_every)]
    p = subprocess.Popen(
        [COLLIE_RUN, "-n", str(args.ranks), "--max-restarts", str(args.max_restarts)] + how +
        mlp_args(keep + ["--step-sleep-ms", str(args.step_sleep_ms), "--dump-params", dump]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, into=into: into.append(s.read()))
               for s, into in ((p.stdout, out), (p.stderr, err))]
    for t in readers:
        t.start()
    job = {"n": i, "backend": backend, "kills": [], "samples": [], "hang": False}
    began = time.monotonic()
    round_began = {}  # round -> when it was first seen
    while p.poll() is None:
        now = time.monotonic()
        if now - began > job_timeout:
            job["hang"] = True
            ranks, _ = children(p.pid)
            say("job %d HANGS after %.0f s; its ranks: %s" % (i, now - began, ranks))
            for pid in list(ranks.values()) + list(SPARES.values()):
                os.kill(pid, signal.SIGKILL)
            p.kill()
            break
        ranks, rnd = children(p.pid)
        if now >= next_kill and ranks:
            rank = rng.choice(sorted(ranks))
            try:
                os.kill(ranks[rank], signal.SIGKILL)
                job["kills"].append(rank)
                job.setdefault("killed_at", []).append(time.time())
                say("job %d (%s): killed rank %d (pid %d) %.1f s in"
                    % (i, backend, rank, ranks[rank], now - began))
            except ProcessLookupError:
                pass  # it ended just now: try again at the next sample
            else:
                next_kill = now + args.kill_every * rng.uniform(0.5, 1.5)
                ranks = {}
        # Whole groups only, settled (--settle seconds into their round): a
        # group being started, stopped or re-formed holds fewer or transient
        # things.
        # (With spares: every rank and every spare, a taken spare being a
        # rank.)
        group = list(ranks.values()) + list(SPARES.values())
        if len(group) == args.ranks + args.spares and rnd is not None:
            round_began.setdefault(rnd, now)
            lf, lr = fds(p.pid), rss_kib(p.pid)
            rf = [fds(q, files_of=work) for q in group]
            rr = [rss_kib(q) for q in group]
            if now - round_began[rnd] >= settle and None not in [lf, lr] + rf + rr:
                most = group[rf.index(max(rf))]
                kinds = [fd_kinds(q, work) for q in group]
                job["samples"].append({"round": rnd, "launcher_fds": lf, "launcher_rss": lr,
                                       "rank_fds": max(rf), "rank_rss": max(rr),
                                       "rank_fd_kinds": kinds[group.index(most)],
                                       "ranks_connected": all("socket" in k for k in kinds)})
        shm_max = max(shm_max, shm_entries())
        shm_ours |= shm_used([p.pid] + list(ranks.values()) + list(SPARES.values()))
        time.sleep(args.sample_every)
    p.wait()
    for t in readers:
        t.join()
    p.stdout.close()
    p.stderr.close()
    job["rc"] = p.returncode
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        for name, text in (("out", out), ("err", err)):
            with open(os.path.join(args.log_dir, "job%d.%s" % (i, name)), "w") as f:
                f.write(text[0] if text else "")
    job["secs"] = round(time.monotonic() - began, 1)
    # A replacement collie-run stopped because no grow would take it (or,
    # with spares, a lost rank no spare replaced) is answered again by the
    # round's restart: one answer to one kill.
    job["restarts"] = (len(re.findall(r"restarting \(attempt \d+ of|--elastic: starting it again|"
                                      r"--elastic: a waiting spare takes its place",
                                      err[0] if err else "")) -
                       len(re.findall(r"replacement was never taken|no spare took (?:rank|spare) [\d.]+'s place",
                                      err[0] if err else "")))
    # Each kill's recovery: to rank 0's first step done after it.
    # (The prefix is collie-run's rank, the process's first; only the
    # communicator's rank 0 prints these.)
    backs = [float(x) for x in re.findall(r"^\[\d+\] (?:back|first step after resuming) at step "
                                          r"\d+ with \d+ ranks epoch=([\d.]+)",
                                          out[0] if out else "", re.M)]
    job["recoveries"] = []
    for t in job.get("killed_at", []):
        later = [b - t for b in backs if b > t]
        if later:
            job["recoveries"].append(min(later))
    try:
        with open(dump, "rb") as f:
            job["same"] = f.read() == refs[backend]
    except OSError:
        job["same"] = False
    job["left"] = leftovers()
    for path in (ck, dump):
        if os.path.exists(path):
            os.unlink(path)
    jobs.append(job)
    bad = []
    if job["hang"]:
        bad.append("hang")
    if job["rc"] != 0:
        bad.append("exit %s" % job["rc"])
    if not job["same"]:
        bad.append("final parameters differ from the uninterrupted run's")
    # A kill that lands on a rank already on its way out (exit 0 decided)
    # restarts nothing; a restart without a kill is a failure of its own.
    if job["restarts"] > len(job["kills"]):
        bad.append("%d restarts for %d kills" % (job["restarts"], len(job["kills"])))
    if job["left"]:
        bad.append("processes left behind: %s" % job["left"])
    if bad:
        problems.append("job %d (%s): %s" % (i, backend, "; ".join(bad)))
        say("job %d: %s\n--- stdout ---\n%s--- stderr ---\n%s" % (i, "; ".join(bad), out[0], err[0]))

    job["steady"] = steady(job["samples"])
    # How each kill was answered, in collie-run's words: a replacement taken
    # into the running job, or the round started again (--elastic does so
    # for a rank lost before the world formed or as the others finished).
    text = err[0] if err else ""
    job["rounds_again"] = len(re.findall(r"restarting \(attempt \d+ of", text))
    say("job %d (%s): %.0f s, exit %s, %d kill(s), %d restart(s) (%d of the round), recoveries "
        "%s s, parameters %s; per round: %s; /dev/shm %d"
        % (i, backend, job["secs"], job["rc"], len(job["kills"]), job["restarts"],
           job["rounds_again"], "/".join("%.2f" % r for r in job["recoveries"]) or "-",
           "identical" if job["same"] else "DIFFER", per_round(job["steady"]), shm_entries()))

shm_after = shm_entries()
own_fds_after = fds(os.getpid())
left = leftovers()
elapsed = time.monotonic() - start


say("---- %.0f s, %d jobs, %d kills, %d %s, seed %d ----"
    % (elapsed, len(jobs), sum(len(j["kills"]) for j in jobs), sum(j["restarts"] for j in jobs),
       "replacements" if args.elastic else "restarts", seed))
recoveries = sorted(r for j in jobs for r in j["recoveries"])
if recoveries:
    say("recovery, from a kill to rank 0's first step after it (%s): median %.2f s, most %.2f s, "
        "%d recoveries" % ("a rank replaced in the running job" if args.elastic
                            else "every rank restarted from the checkpoint",
                            recoveries[len(recoveries) // 2], recoveries[-1], len(recoveries)))
say("hangs %d, failed jobs %d, wrong final parameters %d, processes left behind %d"
    % (sum(j["hang"] for j in jobs), sum(j["rc"] != 0 for j in jobs),
       sum(not j["same"] for j in jobs), len(left) + sum(len(j["left"]) for j in jobs)))
# Growth. The launcher lives through a job's restarts: its descriptors must
# be the same in every round, its RSS within 1 MiB of the first round's.
# Ranks are new processes every round: per backend, every round of every
# job against the first job's first judged round (descriptors the same, RSS
# within 10% or 4 MiB; a round whose ranks are still warming up is not
# judged: soak_growth.py).
for j in jobs:
    st = j["steady"]
    if len(st) > 1:
        r0, rn = min(st), max(st)
        counted = [st[r]["launcher_fds"] for r in st if st[r]["launcher_fds"] is not None]
        if len(set(counted)) > 1:
            problems.append("job %d: the launcher's fds changed across restarts: %s"
                            % (j["n"], counted))
        if st[rn]["launcher_rss"] - st[r0]["launcher_rss"] > 1024 and not args.rss_report_only:
            problems.append("job %d: the launcher's RSS grew across restarts: %d -> %d KiB"
                            % (j["n"], st[r0]["launcher_rss"], st[rn]["launcher_rss"]))
with_restarts = [j for j in jobs if len(j["steady"]) > 1]
say("launcher through restarts: %d jobs sampled in more than one round; fds per round the same in "
    "each: %s" % (len(with_restarts), "yes" if not any("launcher's fds" in p for p in problems)
                  else "NO"))
for b in backends:
    rounds = [(j["n"], r, v) for j in jobs if j["backend"] == b for r, v in j["steady"].items()]
    if len(rounds) < 2:
        say("%s: fewer than two rounds sampled, no growth to measure" % b)
        continue
    for m, what in (("launcher_fds", "launcher fds"), ("launcher_rss", "launcher RSS KiB"),
                    ("rank_fds", "rank fds (the most of any rank)"),
                    ("rank_rss", "rank RSS KiB (the most of any rank)")):
        judged = [(n, r, v) for n, r, v in rounds if v[m] is not None]
        if len(judged) < 2:
            say("%s: %s: fewer than two rounds with enough samples" % (b, what))
            continue
        (n0, r0, v0), (nz, rz, vz) = judged[0], judged[-1]
        every = [v[m] for _, _, v in judged]
        say("%s: %s: job %d round %d %d -> job %d round %d %d (%d rounds: %d..%d)"
            % (b, what, n0, r0, v0[m], nz, rz, vz[m], len(judged), min(every), max(every)))
        grew = fd_growth(rounds) if m == "rank_fds" else None
        if grew:
            problems.append("%s: rank fds grew from %d to %d: %s -> %s"
                            % (b, grew[0][m], grew[1][m], grew[0]["rank_fd_kinds"],
                               grew[1]["rank_fd_kinds"]))
        if m == "rank_rss" and max(every) > v0[m] + rss_margin(v0[m]) and \
                not args.rss_report_only:
            problems.append("%s: rank RSS grew from %d to %d KiB" % (b, v0[m], max(every)))
shm_left = sorted(f for f in shm_ours if os.path.exists(f.replace(" (deleted)", "")))
say("/dev/shm: files the launchers and ranks used %d, of them still there %d; entries on the "
    "machine (other users' too): before %d, most during %d, after %d"
    % (len(shm_ours), len(shm_left), shm_before, shm_max, shm_after))
say("the soak's own fds: before %d, after %d" % (own_fds_before, own_fds_after))
if shm_left:
    problems.append("left in /dev/shm by the jobs: %s" % shm_left)
if left:
    problems.append("processes left behind at the end: %s" % left)
if not jobs:
    problems.append("no job ran")
for p in problems:
    say("PROBLEM: " + p)
say("all right" if not problems else "FAILED")
os.system("rm -rf '%s'" % work)
sys.exit(1 if problems else 0)
