"""Skewed processing speeds, as PyTorch's DDP tutorial describes them: a rank
slower than the others within the timeout only delays training; past it,
every rank gets an error that names the slow rank.

    python3 skew_check.py COLLIE_RUN      # the test: runs the two jobs below
    collie-run -n 3 python3 skew_check.py --rank-side DIR DELAY_S

Three ranks train with collie.torch.DistributedDataParallel and
COLLIE_TIMEOUT=4; rank 1 computes for DELAY_S more seconds before its
backward at step 3 (a straggler: the delay is what is tested, it orders
nothing). With 1.5 s every rank finishes, with parameters equal on every
rank and to a serial float64 replay of the same training. With 12 s the
others must fail in backward with a collie.Error naming rank 1, well before
rank 1 would have arrived, and never hang. Each rank writes what happened
to DIR; the driver checks the reports.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

SLOW = 1
STEPS = 6
TIMEOUT_S = 4


def model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def data(step, rank):
    import torch
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)


def replay(world):
    import torch
    m = model().double()
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in m.parameters()]
        for r in range(world):
            m.zero_grad()
            x, y = data(step, r)
            torch.nn.functional.mse_loss(m(x.double()), y.double()).backward()
            for g, p in zip(grads, m.parameters()):
                g += p.grad / world
        with torch.no_grad():
            for g, p in zip(grads, m.parameters()):
                p -= 0.1 * g
    return [p.detach() for p in m.parameters()]


def rank_side(out_dir, delay):
    import torch

    import collie
    import collie.torch as ct

    torch.set_num_threads(1)
    ddp = ct.DistributedDataParallel(model())
    rank, world = ddp.comm.rank, ddp.comm.size
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    report = os.path.join(out_dir, f"rank{rank}")
    started = time.monotonic()
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step == 3 and rank == SLOW:
            time.sleep(delay)  # the straggler's extra work
        try:
            loss.backward()
        except collie.Error as e:
            with open(report, "w") as f:
                f.write(f"error\n{time.monotonic() - started:.2f}\n{e.code}: {e}\n")
            sys.exit(3)
        opt.step()
    want = replay(world)
    worst = max(((p.detach().double() - w).norm() / w.norm()).item()
                for p, w in zip(ddp.parameters(), want))
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    everyone = torch.zeros(world * flat.numel())
    ddp.comm.allgather(flat, everyone)
    same = all(torch.equal(everyone[r * flat.numel():(r + 1) * flat.numel()], flat)
               for r in range(world))
    with open(report, "w") as f:
        f.write(f"finished\n{time.monotonic() - started:.2f}\n{worst:.3g} {same}\n")


def run(collie_run, delay):
    out = tempfile.mkdtemp(prefix="collie-skew-")
    env = dict(os.environ, COLLIE_TIMEOUT=str(TIMEOUT_S))
    job = subprocess.run([collie_run, "-n", "3", sys.executable, os.path.abspath(__file__),
                          "--rank-side", out, str(delay)], env=env, capture_output=True,
                         text=True, timeout=120)
    reports = {}
    for r in range(3):
        path = os.path.join(out, f"rank{r}")
        reports[r] = open(path).read().split("\n", 2) if os.path.exists(path) else None
    shutil.rmtree(out)
    return job, reports


def driver(collie_run):
    failures = []
    job, reports = run(collie_run, 1.5)
    if job.returncode != 0:
        failures.append(f"a 1.5 s straggler under a {TIMEOUT_S} s timeout failed the job")
    for r, rep in reports.items():
        if rep is None or rep[0] != "finished":
            failures.append(f"1.5 s straggler: rank {r} did not finish: {rep}")
            continue
        worst, same = rep[2].split()
        if float(worst) > 1e-5 or same != "True":
            failures.append(f"1.5 s straggler: rank {r} is {worst} from the serial replay, "
                            f"ranks equal: {same}")
    if not failures:
        print(f"a 1.5 s straggler (timeout {TIMEOUT_S} s): every rank finished, equal to the "
              "serial replay")
    said = job.stdout + job.stderr

    job, reports = run(collie_run, 12)
    said += job.stdout + job.stderr
    if job.returncode == 0:
        failures.append("a 12 s straggler past the timeout: the job succeeded")
    for r in (0, 2):
        rep = reports[r]
        if rep is None or rep[0] != "error":
            failures.append(f"12 s straggler: rank {r} reported no error: {rep}")
            continue
        when, message = float(rep[1]), rep[2].strip()
        if f"rank {SLOW}" not in message:
            failures.append(f"12 s straggler: rank {r}'s error does not name rank {SLOW}: "
                            f"{message}")
        elif when > 10:
            failures.append(f"12 s straggler: rank {r} gave up only after {when:.1f} s")
        else:
            print(f"rank {r} after {when:.1f} s: {message[:160]}")
    if failures:
        print(said)
        for f in failures:
            print("FAILED:", f)
        sys.exit(1)
    print("a straggler within the timeout delays training; past it, every other rank names it")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rank-side":
        rank_side(sys.argv[2], float(sys.argv[3]))
    elif len(sys.argv) == 2:
        driver(sys.argv[1])
    else:
        sys.exit(__doc__)
