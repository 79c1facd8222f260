"""tests/python/elastic_reform.py: collie.torch's DistributedDataParallel
re-forms itself after a rank is lost (ddp.reform()), under collie-run
--elastic --max-restarts 1 (tests/meson.build runs it with 4 ranks), the
training loop written as a user would, with no communicator in sight:

    ddp = DistributedDataParallel(net, gradient_as_bucket_view=...)
    ...
    except collie.Error as e:                 # a rank died under the step
        if e.code != "peer_lost": raise
        got = ddp.reform({"step": step, "opt": opt.state_dict()})

and the replacement (COLLIE_JOIN=1) building its wrapper as at the start,
then reading rank 0's step and optimizer state from ddp.handed_over.

A two-layer float64 model, SGD with momentum (so the optimizer's state
must reach the newcomer too); at step i the global batch is the samples
i * 16 .. i * 16 + 15 of a fixed dataset, rank r of the world of W = 4
taking a quarter by its rank. Rank 1, in its first life, SIGKILLs itself
at step 5's forward. Every rank's final parameters must equal serial
full-batch training on one process to 1e-10, the wrapper's communicator
must be the new one of 4 ranks, and collie-run must exit 0. Prints "rank
R: parameters equal the serial run's (...)".
    elastic_reform.py [--bucket-view] [--powersgd]
--powersgd registers collie's PowerSGD hook after construction (PyTorch's
order), so that the newcomer must load the survivors' error feedback into
it; its parameters are then compared across the ranks, not with a serial run.
"""
import os
import signal
import sys

import torch

import collie
import collie.torch as ct

from elastic_reference import KILL_AT, LR, PER_RANK, STEPS, data, model, serial

MOMENTUM = 0.9


def main():
    first_life = os.environ.get("COLLIE_RESTART_COUNT", "0") == "0"
    joining = os.environ.get("COLLIE_JOIN") == "1"
    x, y = data()
    # A newcomer's own initial values are not the model: rank 0's come
    # with its wrapper.
    net = model(seed=99 if joining else 11)
    ddp = ct.DistributedDataParallel(net, gradient_as_bucket_view="--bucket-view" in sys.argv)
    powersgd = "--powersgd" in sys.argv
    if powersgd:
        # After construction, as PyTorch's order has it: a newcomer must
        # have it in place before the survivors' error feedback is loaded.
        ddp.register_comm_hook(None, "powersgd:rank=1,start_iter=2")
    born = ddp.comm.rank
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    step = 0
    if ddp.joined:
        step = ddp.handed_over["step"]
        opt.load_state_dict(ddp.handed_over["opt"])
        print(f"rank {ddp.comm.rank} of {ddp.comm.size}: joined at step {step}", flush=True)
    elif joining:
        print("FAIL: a joiner's wrapper was handed nothing", flush=True)
        return 1
    reforms = 0
    while step < STEPS:
        if first_life and not joining and born == 1 and step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        r = ddp.comm.rank
        b = slice((step * 4 + r) * PER_RANK, (step * 4 + r + 1) * PER_RANK)
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x[b]), y[b]).backward()
        except collie.Error as e:
            if e.code != "peer_lost":
                raise
            print(f"rank {r}: step {step} failed: {e}", flush=True)
            got = ddp.reform({"step": step, "opt": opt.state_dict()})
            step = got["step"]
            opt.load_state_dict(got["opt"])
            reforms += 1
            print(f"rank {ddp.comm.rank} of {ddp.comm.size}: re-formed, step {step} again",
                  flush=True)
            continue
        opt.step()
        step += 1
    if ddp.comm.size != 4:
        print(f"FAIL rank {ddp.comm.rank}: the wrapper's communicator has {ddp.comm.size} ranks")
        return 1
    if not joining and reforms != 1:
        print(f"FAIL rank {ddp.comm.rank}: {reforms} reforms, not 1")
        return 1
    if powersgd:
        # Compressed: no serial reference, but every replica the same.
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        ref = flat.clone()
        ddp.comm.broadcast(ref, root=0)
        if not torch.equal(ref, flat) or not bool(torch.isfinite(flat).all()):
            print(f"FAIL rank {ddp.comm.rank}: parameters differ from rank 0's after PowerSGD")
            return 1
        print(f"rank {ddp.comm.rank} of {ddp.comm.size}: PowerSGD through the reform, replicas "
              "identical")
        ddp.close()
        return 0
    want = serial(x, y, momentum=MOMENTUM)
    worst = max(float((p.detach() - w).abs().max()) for p, w in zip(net.parameters(), want))
    if worst > 1e-10:
        print(f"FAIL rank {ddp.comm.rank}: parameters off the serial run's by {worst:.3g}")
        return 1
    print(f"rank {ddp.comm.rank} of {ddp.comm.size}: parameters equal the serial run's "
          f"(largest difference {worst:.2g})")
    ddp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
