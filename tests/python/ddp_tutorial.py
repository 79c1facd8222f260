"""PyTorch's DDP tutorial (the project's seeds: "Getting Started with Distributed
Data Parallel"), its demo_basic and demo_checkpoint ported as a user would:
the code below between the "tutorial" markers is the tutorial's, with
PyTorch's DistributedDataParallel swapped for collie's and the devices
removed (no GPU: no .to(rank), no device_ids). Nothing else is changed.

    python3 ddp_tutorial.py [world_size ...]       (default: 2 3)

The harness around it, without touching the tutorial's code:
  * seeds each rank's random numbers (the tutorial draws its data with
    torch.randn on every rank), so that the step can be replayed;
  * records the parameters after each optimizer step (a wrapper around
    torch.optim.SGD.step);
  * checks, on every rank, that collie's communicator is the job's (the
    tutorial's mp.spawn + init_process_group sets no launcher variable:
    collie once made each rank a world of one, silently), that the
    parameters after the step equal a serial float64 replay of the step on
    the average of every rank's gradient from rank 0's initial weights, and
    that every rank holds the same parameters.
Prints a line per demo and world size, then "N passed, N failed".
"""
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torch.multiprocessing as mp
from collie.torch import DistributedDataParallel as DDP

import collie

# ---- tutorial ------------------------------------------------------------------


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)

    # create model and move it to GPU with id rank
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn,
             args=(world_size,),
             nprocs=world_size,
             join=True)


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)

    model = ToyModel()
    ddp_model = DDP(model)

    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly
    map_location = {'cuda:%d' % 0: 'cuda:%d' % rank}
    ddp_model.load_state_dict(
        torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)

    loss_fn(outputs, labels).backward()
    optimizer.step()

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.
    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()
    print(f"Finished running DDP checkpoint example on rank {rank}.")

# ---- end of tutorial -----------------------------------------------------------


SEED = 1234
_stepped = []


def _recording_step(step):
    def wrapped(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        _stepped.append([p.detach().clone() for g in self.param_groups for p in g["params"]])
        return out
    return wrapped


def replay(world_size, lr=0.001):
    """The tutorial's one step, serially in float64: rank 0's initial
    weights (DDP's constructor broadcasts them), each rank's data as its
    seeded generator draws it, the gradient averaged over ranks."""
    draws = []
    for r in range(world_size):
        torch.manual_seed(SEED + r)
        m = ToyModel()
        draws.append((m, torch.randn(20, 10), torch.randn(20, 5)))
    model = draws[0][0].double()
    grads = [torch.zeros_like(p) for p in model.parameters()]
    for _, x, y in draws:
        model.zero_grad()
        nn.MSELoss()(model(x.double()), y.double()).backward()
        for g, p in zip(grads, model.parameters()):
            g += p.grad / world_size
    with torch.no_grad():
        return [p - lr * g for p, g in zip(model.parameters(), grads)]


def checked(demo_fn):
    def run(rank, world_size):
        torch.manual_seed(SEED + rank)
        optim.SGD.step = _recording_step(optim.SGD.step)
        demo_fn(rank, world_size)
        comm = collie.default_communicator()
        problems = []
        if (comm.rank, comm.size) != (rank, world_size):
            problems.append(f"collie's communicator is rank {comm.rank} of {comm.size}, the "
                            f"tutorial's rank {rank} of {world_size}")
        if len(_stepped) != 1:
            problems.append(f"{len(_stepped)} optimizer steps recorded, not 1")
        else:
            got = _stepped[0]
            for i, (p, w) in enumerate(zip(got, replay(world_size))):
                err = ((p.double() - w).norm() / w.norm()).item()
                if not err <= 1e-6:
                    problems.append(f"parameter {i} is {err:.2e} (relative) from the serial "
                                    "float64 replay of the step")
            # Every rank's parameters, side by side (collie's communicator
            # outlives the tutorial's process group).
            flat = torch.cat([p.reshape(-1) for p in got])
            everyone = torch.zeros(world_size * flat.numel())
            comm.allgather(flat, everyone)
            rows = everyone.view(world_size, -1)
            for r in range(world_size):
                if not torch.equal(rows[r], rows[0]):
                    problems.append(f"rank {r}'s parameters differ from rank 0's")
        if problems:
            raise SystemExit(f"rank {rank}: " + "; ".join(problems))
    run.__name__ = run.__qualname__ = "checked_" + demo_fn.__name__
    return run


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [2, 3]
    passed = failed = 0
    for world_size in sizes:
        for demo in (demo_basic, demo_checkpoint):
            os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="collie-tutorial-")
            try:
                run_demo(_CHECKED[demo.__name__], world_size)
                shutil.rmtree(os.environ["TMPDIR"])
                print(f"ok   {demo.__name__}, {world_size} ranks: one step, every rank equal to "
                      "the serial replay", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - one line per failed case
                print(f"FAIL {demo.__name__}, {world_size} ranks: {e}", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


# Module level, so that mp.spawn's children (which import this module) find them.
checked_demo_basic = checked(demo_basic)
checked_demo_checkpoint = checked(demo_checkpoint)
_CHECKED = {"demo_basic": checked_demo_basic, "demo_checkpoint": checked_demo_checkpoint}

if __name__ == "__main__":
    main()
