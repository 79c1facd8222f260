"""Failures under the collie backend become PyTorch exceptions naming the op
and the rank on every survivor, never a hang or a wrong sum:

    python3 backend_faults.py COLLIE_RUN kill|skip|skip_async    # the test: starts the job below
    collie-run -n 3 python3 backend_faults.py --rank-side DIR kill|skip|skip_async

kill: three ranks train PyTorch's own DistributedDataParallel over
init_process_group("collie"); at step 3 rank 2 kills itself with SIGKILL
between forward and backward. Each survivor's backward() (or the step
after) must raise, within the timeout, a RuntimeError whose message names
rank 2 (it was a SIGSEGV on PyTorch 2.15: see _Work.get_future).
skip: rank 1 skips an all_reduce that the others make and goes on to a
barrier: every rank's call raises a DistError (collie's mismatch; on
1.13 a RuntimeError), naming both ops and the ranks. skip_async: the same
with async_op=True, the error raised by the Work's wait() (on 1.13 and
2.1 a Work PyTorch's C++ makes from a future did not raise it).
Each rank writes what it got to DIR; the driver checks every report.
"""
import os
import signal
import subprocess
import sys
import tempfile

VICTIM = 2


def report(out_dir, rank, what, err=None):
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(what + "\n" + (f"{type(err).__module__}.{type(err).__name__}\n{err}\n" if err
                               else "no error\n"))


def rank_side(out_dir, mode):
    import torch
    import torch.distributed as dist

    import collie.distributed  # noqa: F401 - registers the backend "collie"

    torch.set_num_threads(1)
    dist.init_process_group("collie")
    rank = dist.get_rank()
    if mode in ("skip", "skip_async"):
        t = torch.ones(1000)
        a = mode == "skip_async"
        try:
            if rank == 1:
                w = dist.barrier(async_op=a)
            else:
                w = dist.all_reduce(t, async_op=a)
            if a:
                try:
                    w.wait()
                except Exception as e:  # noqa: BLE001 - where the driver wants it
                    report(out_dir, rank, "raised", e)
                    os._exit(3)
            w = dist.barrier(async_op=a)
            if a:
                w.wait()
        except Exception as e:  # noqa: BLE001 - reported, checked by the driver
            # skip_async: the error belongs in the first wait(), not in a call.
            report(out_dir, rank, "raised in a call" if a else "raised", e)
            os._exit(3)  # the group has failed: nothing left to tear down
        report(out_dir, rank, "finished")
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    try:
        for step in range(10):
            opt.zero_grad()
            loss = ddp(torch.randn(16, 64)).square().mean()
            if step == 3 and rank == VICTIM:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            opt.step()
    except Exception as e:  # noqa: BLE001 - reported, checked by the driver
        report(out_dir, rank, "raised", e)
        os._exit(3)
    report(out_dir, rank, "finished")


def driver(collie_run, mode):
    failures = []
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, COLLIE_TIMEOUT="30")
        job = subprocess.run([collie_run, "-n", "3", sys.executable, os.path.abspath(__file__),
                              "--rank-side", out, mode], env=env, capture_output=True, text=True,
                             timeout=150)
        said = job.stdout + job.stderr
        if job.returncode == 0:
            failures.append("the job succeeded")
        ranks = [0, 1] if mode == "kill" else [0, 1, 2]
        for r in ranks:
            path = os.path.join(out, f"rank{r}")
            if not os.path.exists(path):
                failures.append(f"rank {r} wrote no report")
                continue
            what, kind, msg = (open(path).read().split("\n", 2) + ["", ""])[:3]
            print(f"rank {r}: {what}: {kind}: {msg.strip()[:300]}")
            if what != "raised":
                failures.append(f"rank {r} {what} without an error")
                continue
            import torch.distributed as dist
            # A direct call raises collie's DistError (a mismatch); through
            # PyTorch's DDP the error crosses its C++ future, which keeps
            # the message and makes it a RuntimeError.
            kinds = (("DistError", "DistBackendError") if hasattr(dist, "DistError")
                     else ("Error", "RuntimeError"))
            if mode == "kill":
                kinds += ("RuntimeError",)
            if not kind.endswith(kinds):
                failures.append(f"rank {r} raised {kind}, not one of {', '.join(kinds)}")
            if mode == "kill" and "rank 2" not in msg:
                failures.append(f"rank {r}'s error does not name rank 2")
            if mode != "kill" and not ("barrier" in msg and "allreduce" in msg and "rank" in msg):
                failures.append(f"rank {r}'s error does not name both ops and the ranks")
        if failures:
            print(said[-3000:])
    for f in failures:
        print("FAIL", f)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed ({mode})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    if sys.argv[1] == "--rank-side":
        rank_side(sys.argv[2], sys.argv[3])
    else:
        driver(sys.argv[1], sys.argv[2])
