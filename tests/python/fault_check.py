"""A rank that dies mid-training becomes a collie.Error on every survivor.

    python3 fault_check.py COLLIE_RUN      # the test: starts the job below
    collie-run -n 3 python3 fault_check.py --rank-side DIR

Three ranks train with collie.torch.DistributedDataParallel; at step 3 rank
2 kills itself with SIGKILL between forward and backward. Each survivor must
get a collie.Error from backward() whose code is peer_lost and whose message
names rank 2 (not a hang, not a timeout); it writes what it got to DIR. The
driver then checks both survivors' reports and collie-run's summary.
"""
import os
import signal
import subprocess
import sys
import tempfile

VICTIM = 2


def rank_side(out_dir):
    import torch

    import collie
    import collie.torch as ct

    torch.set_num_threads(1)
    torch.manual_seed(0)
    ddp = ct.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)), bucket_cap_mb=0.05)
    rank = ddp.comm.rank
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(10):
        opt.zero_grad()
        loss = ddp(torch.randn(16, 64)).square().mean()
        if step == 3 and rank == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except collie.Error as e:
            with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
                f.write(f"{e.code}\n{e}\n")
            sys.exit(3)
        opt.step()
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write("finished\nno error\n")


def driver(collie_run):
    failures = []
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, COLLIE_TIMEOUT="30")
        job = subprocess.run([collie_run, "-n", "3", sys.executable, os.path.abspath(__file__),
                              "--rank-side", out], env=env, capture_output=True, text=True,
                             timeout=120)
        said = job.stdout + job.stderr
        if job.returncode == 0:
            failures.append("the job succeeded although rank 2 was killed")
        if "rank 2" not in said or "SIGKILL" not in said:
            failures.append("collie-run's summary does not say rank 2 was killed by SIGKILL")
        for r in (0, 1):
            path = os.path.join(out, f"rank{r}")
            if not os.path.exists(path):
                failures.append(f"rank {r} reported nothing (did it hang, or crash?)")
                continue
            code, message = open(path).read().split("\n", 1)
            if code != "peer_lost":
                failures.append(f"rank {r} got code {code!r}, not peer_lost: {message.strip()}")
            elif f"rank {VICTIM}" not in message:
                failures.append(f"rank {r}'s error does not name rank {VICTIM}: {message.strip()}")
            else:
                print(f"rank {r}: {code}: {message.strip()}")
    if failures:
        print(said)
        for f in failures:
            print("FAILED:", f)
        sys.exit(1)
    print("a rank killed mid-step is a peer_lost collie.Error naming it on every survivor")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-side":
        rank_side(sys.argv[2])
    elif len(sys.argv) == 2:
        driver(sys.argv[1])
    else:
        sys.exit(__doc__)
