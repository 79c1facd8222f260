"""collie.torch under every way users start ranks, against a serial reference.

    collie-run -n 2 python3 launch_check.py
    torchrun --nproc_per_node 2 launch_check.py
    mpirun -n 2 python3 launch_check.py
    python3 launch_check.py spawn|fork       # collie.spawn from inside Python
    LAUNCH_CHECK_INIT_TORCH=1 ...            # torch.distributed initialised first

Every rank trains a small MLP with collie.torch.DistributedDataParallel for a
few steps on its own data, and compares the result with a serial float64
training on the average of every rank's gradient, computed on each rank from
all ranks' data. It also checks that collie's rank is the launcher's rank.
Exits non-zero (spawn: raises) when anything differs.
"""
import os
import sys

import torch

import collie
import collie.torch as ct

STEPS = 6
LR = 0.1


def model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 8, generator=g), torch.randn(5, 3, generator=g)


def reference(world):
    """Serial float64 SGD on the mean of every rank's gradient."""
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
                p -= LR * g
    return [p.detach() for p in m.parameters()]


def launcher_rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"):
        if var in os.environ:
            return var, int(os.environ[var])
    return None, None


def train(expect_rank=None, view=True):
    torch.set_num_threads(1)
    # LAUNCH_CHECK_INIT_TORCH=1: torch.distributed first, as code written for
    # PyTorch's DDP does; collie's communicator is then torch's job,
    # rendezvoused through PyTorch's store.
    if os.environ.get("LAUNCH_CHECK_INIT_TORCH") == "1":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    ddp = ct.DistributedDataParallel(model(), gradient_as_bucket_view=view)
    comm = ddp.comm
    var, value = launcher_rank()
    if expect_rank is None:
        expect_rank = value
    if comm.rank != expect_rank:
        raise SystemExit(f"collie says rank {comm.rank}, the launcher ({var}) says {expect_rank}")
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data(step, comm.rank)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    want = reference(comm.size)
    for i, (p, w) in enumerate(zip(ddp.parameters(), want)):
        err = (p.detach().double() - w).abs().max().item()
        if err > 1e-5 * (w.abs().max().item() + 1e-12):
            raise SystemExit(f"rank {comm.rank}: parameter {i} is {err:.3g} from the serial "
                             "float64 reference")
    ddp.close()
    print(f"rank {comm.rank} of {comm.size}: {STEPS} steps match the serial float64 reference",
          flush=True)


def spawned(rank):
    train(expect_rank=rank)


def main():
    how = sys.argv[1] if len(sys.argv) > 1 else None
    if how is None:
        train()
        return
    if how not in ("spawn", "fork"):
        raise SystemExit(f"unknown start method '{how}': spawn or fork")
    # The target of a fork start need not be picklable, as in a notebook.
    target = spawned if how == "spawn" else (lambda rank: train(expect_rank=rank, view=False))
    collie.spawn(target, nprocs=2, start_method=how)
    # A rank that fails is raised here, naming it, with its traceback.
    try:
        collie.spawn(_fails_on_rank_1, nprocs=2, start_method=how)
    except collie.ProcessFailed as e:
        if e.rank != 1 or "out of data on rank 1" not in str(e):
            raise SystemExit(f"collie.spawn reported the wrong failure: {e}")
    else:
        raise SystemExit("collie.spawn did not report rank 1's failure")
    print(f"collie.spawn ({how}): 2 ranks match the reference; a failing rank is reported")


def _fails_on_rank_1(rank):
    if rank == 1:
        raise RuntimeError("out of data on rank 1")


if __name__ == "__main__":
    main()
