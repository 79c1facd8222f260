"""PyTorch's FSDP (fully_shard) and torch.distributed.checkpoint over the
collie backend, against the same over Gloo in one job:

    collie-run -n 2 python3 fsdp_check.py

The default group is collie's, a Gloo group of the same ranks beside it.
Two copies of one model, each sharded with fully_shard on a DeviceMesh of
one of the groups, train 5 steps on each rank's own data: every full
parameter within 1e-5 of Gloo's run (equal in practice: the same
all-gathers and reduce-scatters in the same order). Then the collie run is
saved with torch.distributed.checkpoint (its coordination runs on the
default group: collie's), loaded into a fresh, differently initialised
sharded model, and both train 2 more steps: the loaded one ends equal to
the original. PyTorch 2.x with fully_shard (2.6 and later); FSDP on 2.1
needs CUDA even over Gloo, so earlier PyTorches skip (77).
Prints "N passed, N failed".
"""
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

try:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
except ImportError:
    print(f"skipped: torch {torch.__version__} has no fully_shard (FSDP on CPU)")
    sys.exit(77)
import torch.distributed.checkpoint as dcp

import check_cases
import collie.distributed  # noqa: F401 - registers the backend "collie"

torch.set_num_threads(1)
dist.init_process_group("collie")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")


def make(seed, group):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5),
                                torch.nn.Tanh(), torch.nn.Linear(5, 3))
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, opt, steps, first=0):
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def full(model):
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def differs(a, b, tol):
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    return None if worst <= tol else f"max difference {worst:g} > {tol:g}"


def main():
    failed = 0
    lines = []
    ours, our_opt = make(0, dist.group.WORLD)
    theirs, their_opt = make(0, GLOO)
    train(ours, our_opt, 5)
    train(theirs, their_opt, 5)
    why = differs(full(ours), full(theirs), 1e-5)
    failed += why is not None
    lines.append(("FAIL" if why else "ok  ") + " fully_shard over collie against Gloo, 5 steps"
                 + (f": {why}" if why else ": within 1e-5"))

    where = tempfile.mkdtemp(prefix="collie-dcp-") if RANK == 0 else ""
    box = [where]
    dist.broadcast_object_list(box, src=0)
    dcp.save({"model": ours.state_dict()}, checkpoint_id=box[0])
    loaded, loaded_opt = make(1, dist.group.WORLD)
    state = {"model": loaded.state_dict()}
    dcp.load(state, checkpoint_id=box[0])
    loaded.load_state_dict(state["model"])
    dist.barrier()  # every rank has read it: rank 0 removes the folder
    if RANK == 0:
        shutil.rmtree(box[0])
    why = differs(full(loaded), full(ours), 0)
    if why is None:
        train(ours, our_opt, 2, first=5)
        train(loaded, loaded_opt, 2, first=5)
        why = differs(full(loaded), full(ours), 1e-6)
    failed += why is not None
    lines.append(("FAIL" if why else "ok  ") + " torch.distributed.checkpoint save, load into a "
                 "fresh model, 2 more steps" + (f": {why}" if why else ": equal to the original"))
    for line in lines:
        print(f"[rank {RANK} of {WORLD}] {line}", flush=True)
    check_cases.finish(failed, len(lines), RANK, group=GLOO)


if __name__ == "__main__":
    os.environ.setdefault("COLLIE_TIMEOUT", "60")
    main()
