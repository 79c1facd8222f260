"""tests/python/elastic_ddp.py: collie.torch's DistributedDataParallel
loses a rank and goes on with its replacement, in memory, under collie-run
--elastic --max-restarts 1 (tests/meson.build runs it with 4 ranks).

A two-layer float64 model, plain SGD; at step i the global batch is the
samples i * 16 .. i * 16 + 15 of a fixed dataset, rank r of the world of
W = 4 taking a quarter by its rank. Rank 1, in its first life, SIGKILLs
itself at step 5's forward; the others' backward fails with peer_lost, so
their step 5 is not taken; they shrink() and grow() by the rank collie-run
starts again (COLLIE_JOIN=1: its collie.connect() joins), hand it the
reducer's state (collie.torch.handoff_state, load_handoff) and the step,
close the old wrapper and build one again on the new communicator (which
broadcasts rank 0's parameters), and do step 5 again. Every rank's final parameters must
equal serial full-batch training on one process to 1e-10, and collie-run
must exit 0. Prints "rank R: parameters equal the serial run's (...)".
"""
import os
import signal
import sys

import torch

import collie
import collie.torch as ct

from elastic_reference import KILL_AT, LR, PER_RANK, STEPS, data, model, serial


def main():
    first_life = os.environ.get("COLLIE_RESTART_COUNT", "0") == "0"
    joining = os.environ.get("COLLIE_JOIN") == "1"
    world = int(os.environ["WORLD_SIZE"])
    x, y = data()
    comm = collie.connect()
    born = comm.rank
    net = model()
    if joining:
        with torch.no_grad():  # not the model: rank 0's comes with the wrapper
            for p in net.parameters():
                p.fill_(123.0)
        state = ct.handoff_state(None, comm)
        step = torch.zeros(1, dtype=torch.int64)
        comm.broadcast(step, root=0)
        step = int(step[0])
        ddp = ct.DistributedDataParallel(net, comm=comm)
        ddp.load_handoff(state)
        print(f"rank {comm.rank} of {comm.size}: joined at step {step}", flush=True)
    else:
        ddp = ct.DistributedDataParallel(net, comm=comm)
        step = 0
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    while step < STEPS:
        if first_life and not joining and born == 1 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        r = comm.rank
        b = slice((step * 4 + r) * PER_RANK, (step * 4 + r + 1) * PER_RANK)
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x[b]), y[b]).backward()
        except collie.Error as e:
            if e.code != "peer_lost":
                raise
            print(f"rank {r}: step {step} failed: {e}", flush=True)
            comm = comm.shrink()
            comm = comm.grow(world - comm.size)
            state = ct.handoff_state(ddp, comm)
            s = torch.tensor([step], dtype=torch.int64)
            comm.broadcast(s, root=0)
            ddp.close()  # its hooks leave the parameters
            ddp = ct.DistributedDataParallel(net, comm=comm)
            ddp.load_handoff(state)
            continue
        opt.step()
        step += 1
    want = serial(x, y)
    worst = max(float((p.detach() - w).abs().max()) for p, w in zip(net.parameters(), want))
    if worst > 1e-10:
        print(f"rank {comm.rank}: parameters off the serial run's by {worst:.3g}")
        return 1
    print(f"rank {comm.rank} of {comm.size}: parameters equal the serial run's "
          f"(largest difference {worst:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
