"""examples/train_ddp.py: a PyTorch model trained with collie.torch's
DistributedDataParallel, the Python twin of examples/train_mlp.cc: a
16-128-128-4 MLP learns a fixed teacher, 64 samples per rank a step, SGD
with momentum, so that a lost rank's recovery has an optimizer's state to
carry as well as the model's.

    collie-run -n 4 python3 examples/train_ddp.py --steps 300

Two ways to survive a rank that dies, as train_mlp has:
  * `collie-run --max-restarts N` with `--checkpoint PATH`: rank 0 writes
    the step, the model, the optimizer and the wrapper's state every
    `--checkpoint-every` steps (atomically), and a job started again
    resumes from it (PyTorch's DDP tutorial's pattern).
  * `collie-run --elastic --max-restarts N` (COLLIE_ELASTIC=1): the lost
    rank is started again alone and joins; the survivors catch peer_lost
    and call ddp.reform({"step", "opt"}), which hands the newcomer the
    reducer's state, rank 0's parameters and that object from memory; the
    failed step is done again with it.
Either way the batches follow the ranks (rank r of the step's world takes
the r-th slice), so the run ends with the parameters of one that never
stopped, to the byte. Rank 0 prints "back at step S with W ranks
epoch=..." after the first step done with a replacement and "first step
after resuming at step S ..." after a restart (tests/launch/soak.py times
the recoveries from them), and --dump-params FILE writes the final
parameters (f32, in the module's order) on rank 0.
"""
import argparse
import os
import sys
import time

import torch

import collie
import collie.torch as ct

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--log-every", type=int, default=50)
ap.add_argument("--step-sleep-ms", type=int, default=0,
                help="a pause after every step, so that a job lasts a while (soaks)")
ap.add_argument("--checkpoint", default="", help="where rank 0 writes checkpoints and a job "
                "started again resumes from")
ap.add_argument("--checkpoint-every", type=int, default=20)
ap.add_argument("--dump-params", default="", help="rank 0 writes the final parameters here")
ap.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
args = ap.parse_args()

BATCH, LR, MOMENTUM = 64, 0.05, 0.9
torch.set_num_threads(1)  # the same arithmetic in every job, however many CPUs


def build():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.Tanh(),
                               torch.nn.Linear(128, 128), torch.nn.Tanh(),
                               torch.nn.Linear(128, 4))


TEACHER = torch.randn(16, 4, generator=torch.Generator().manual_seed(2024))


def batch(step, rank):
    """Rank `rank`'s slice of step `step`'s samples: the same whichever
    process holds that rank."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, 16, generator=g)
    return x, torch.tanh(x @ TEACHER)


def save(path, step, net, opt, ddp):
    state = {"step": step, "model": net.state_dict(), "opt": opt.state_dict(),
             "ddp": ddp.state_dict()}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a rank killed while writing leaves the last one whole


def main():
    net = build()
    ddp = ct.DistributedDataParallel(net, gradient_as_bucket_view=args.bucket_view)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    step, back = 0, None
    if ddp.joined:  # this process replaced a lost rank (--elastic)
        step = ddp.handed_over["step"]
        opt.load_state_dict(ddp.handed_over["opt"])
    elif args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        ddp.load_state_dict(state["ddp"])  # the reducer's state: collective
        step, back = state["step"], "first step after resuming"
        if ddp.comm.rank == 0:
            print(f"resuming from checkpoint {args.checkpoint} at step {step}", flush=True)
    elif os.environ.get("COLLIE_RESTART_COUNT", "0") != "0":
        back = "first step after resuming"  # the whole job again, from the start
    if ddp.comm.rank == 0 and not back and not ddp.joined:
        print(f"training a 16-128-128-4 MLP on {ddp.comm.size} ranks x {BATCH} samples, "
              f"collie.torch, {'bucket views' if args.bucket_view else 'copies'}", flush=True)
    elastic = os.environ.get("COLLIE_ELASTIC") == "1"
    while step < args.steps:
        x, y = batch(step, ddp.comm.rank)
        opt.zero_grad()
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
        except collie.Error as e:
            if not elastic or e.code != "peer_lost":
                raise
            if ddp.comm.rank == 0:
                print(f"step {step}: {e}", flush=True)
            got = ddp.reform({"step": step, "opt": opt.state_dict()})
            step = got["step"]
            opt.load_state_dict(got["opt"])
            back = "back"
            continue
        opt.step()
        if ddp.comm.rank == 0:
            if back:
                print(f"{back} at step {step} with {ddp.comm.size} ranks epoch={time.time():.3f}",
                      flush=True)
            if step % args.log_every == 0:
                print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
        back = None
        step += 1
        if args.checkpoint and step % args.checkpoint_every == 0 and ddp.comm.rank == 0:
            save(args.checkpoint, step, net, opt, ddp)
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1000)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    ref = flat.clone()
    ddp.comm.broadcast(ref, root=0)
    differs = torch.tensor([int(not torch.equal(ref, flat))], dtype=torch.int64)
    ddp.comm.allreduce(differs)
    if ddp.comm.rank == 0:
        print(f"replicas identical on all {ddp.comm.size} ranks: "
              f"{'NO' if int(differs[0]) else 'yes'}", flush=True)
        if args.dump_params:
            with open(args.dump_params, "wb") as f:
                f.write(flat.numpy().tobytes())
    ddp.close()
    return 1 if int(differs[0]) else 0


if __name__ == "__main__":
    sys.exit(main())
