"""The collie backend of torch.distributed on CUDA tensors (PyTorch 2.x, a
GPU): ranks on one GPU, NCCL told they are on different hosts through
NCCL_HOSTID (NCCL refuses two ranks on one device otherwise).

    collie-run -n 2 python3 backend_cuda_check.py collie
    collie-run -n 2 python3 backend_cuda_check.py cpu:collie,cuda:nccl

init_process_group(<the backend string>), then, on CUDA tensors:
  * every collective the backend serves, for every dtype collie has, on
    values every dtype holds exactly, against a serial reference;
  * the same group's CPU tensors, still through collie's host backend;
  * an op issued on a side stream sees the work queued on it before (a
    fill held back by torch.cuda._sleep);
  * async: wait, is_completed, get_future's value;
  * PyTorch's own DistributedDataParallel on CUDA over the group, 5 steps,
    each step's gradients against their average over every rank's data in
    float64 on the CPU (one process, no collective); with PyTorch's
    fp16_compress_hook;
  * which library served the CUDA tensors: collie's NCCL backend for
    "collie", PyTorch's ProcessGroupNCCL for "cuda:nccl".
Prints one ok/FAIL line per case and rank, then "N passed, N failed".
Exits 77 (skipped) without a GPU or on PyTorch 1.x.
"""
import os
import sys

os.environ.setdefault("NCCL_HOSTID", "collie-backend-cuda-" + os.environ.get("RANK", os.environ.get("COLLIE_RANK", "0")))

import torch  # noqa: E402

if not torch.cuda.is_available() or torch.__version__.startswith("1."):
    print("no GPU or PyTorch 1.x: skipped")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402

import check_cases  # noqa: E402
from check_cases import Failed, check  # noqa: E402
import collie.distributed  # noqa: E402,F401 - registers "collie"
from mlp_reference import batch, model, reference_grads  # noqa: E402

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "collie"
dist.init_process_group(BACKEND)
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEV = torch.device("cuda", 0)
torch.cuda.set_device(DEV)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.bool]


def values(rank, n=7, dtype=torch.float32, device=DEV):
    """Small whole numbers (1 to 3), which every dtype and their sums and
    products over a few ranks hold exactly; bools True and False by rank."""
    if dtype == torch.bool:
        return ((torch.arange(n) + rank) % 3 == 0).to(device)
    return ((torch.arange(n) + rank) % 3 + 1).to(dtype).to(device)


def exact(got, want, what):
    got = got.cpu()
    want = want.cpu()
    if got.dtype == want.dtype == torch.bool:  # byte for byte: a bool holding 2 equals True
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    check(got.dtype == want.dtype and torch.equal(got, want),
          f"{what}: got {got.tolist()}, want {want.tolist()}")


def case_all_reduce():
    ops = {"SUM": (dist.ReduceOp.SUM, lambda xs: sum(xs[1:], xs[0])),
           "MAX": (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values),
           "MIN": (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).min(0).values),
           "PRODUCT": (dist.ReduceOp.PRODUCT, lambda xs: torch.stack(xs).prod(0).to(xs[0].dtype))}
    n = 0
    for dtype in DTYPES:
        everyone = [values(r, dtype=dtype, device="cpu") for r in range(WORLD)]
        for name, (op, ref) in ops.items():
            t = values(RANK, dtype=dtype)
            dist.all_reduce(t, op=op)
            exact(t, ref(everyone), f"all_reduce {name} {dtype}")
            n += 1
        if dtype.is_floating_point:
            t = values(RANK, dtype=dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            want = (sum(e.double() for e in everyone) / WORLD).to(dtype)
            check(torch.allclose(t.cpu().double(), want.double(), rtol=1e-2),
                  f"all_reduce AVG {dtype}: {t.tolist()} against {want.tolist()}")
            n += 1
    return f"{n} all-reduces on {DEV}, every dtype, exact"


def case_collectives():
    n, rows = WORLD, 3
    everyone = [values(r, rows * n) for r in range(n)]
    t = values(RANK)
    dist.broadcast(t, src=n - 1)
    exact(t, values(n - 1, device="cpu"), "broadcast")
    out = torch.empty(rows * n * n, device=DEV)
    dist.all_gather_into_tensor(out, everyone[RANK])
    exact(out, torch.cat(everyone).cpu(), "all_gather_into_tensor")
    outs = [torch.empty(rows * n, device=DEV) for _ in range(n)]
    dist.all_gather(outs, everyone[RANK])
    for r in range(n):
        exact(outs[r], everyone[r], f"all_gather's block of rank {r}")
    red = torch.empty(rows, device=DEV)
    dist.reduce_scatter_tensor(red, everyone[RANK])
    exact(red, sum(e.cpu() for e in everyone)[RANK * rows:(RANK + 1) * rows], "reduce_scatter_tensor")
    a2a = torch.empty(rows * n, device=DEV)
    dist.all_to_all_single(a2a, everyone[RANK])
    exact(a2a, torch.cat([e[RANK * rows:(RANK + 1) * rows] for e in everyone]), "all_to_all_single")
    if n > 1:
        if RANK == 0:
            dist.send(values(41), dst=1)
        elif RANK == 1:
            got = torch.empty(7, device=DEV)
            dist.recv(got, src=0)
            exact(got, values(41, device="cpu"), "recv")
    dist.barrier()
    return f"broadcast, all_gather(_into_tensor), reduce_scatter_tensor, all_to_all_single, send/recv on {DEV}"


def case_cpu_tensors_beside():
    t = values(RANK, device="cpu")
    dist.all_reduce(t)
    exact(t, sum(values(r, device="cpu") for r in range(WORLD)), "all_reduce on the CPU")
    return "the same group's CPU tensors"


def case_side_stream():
    side = torch.cuda.Stream()
    n = 1 << 20
    with torch.cuda.stream(side):
        t = torch.zeros(n, device=DEV)
        torch.cuda._sleep(50_000_000)  # about 30 ms of GPU time before the fill
        t.fill_(RANK + 1)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        got = t.cpu()  # on the side stream, after the wait
    want = WORLD * (WORLD + 1) / 2
    check(bool((got == want).all()), f"all_reduce issued on a side stream: {got[:4].tolist()} "
          f"... ({int((got != want).sum())} of {n} wrong), want {want}")
    return "an op on a side stream waits for the work queued on it"


def case_async():
    t = values(RANK)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    got = fut.wait()
    w.wait()  # PyTorch's NCCL: the current stream waits (the host does not)
    torch.cuda.current_stream().synchronize()
    check(w.is_completed(), "is_completed() once the stream that waited has run")
    want = sum(values(r, device="cpu") for r in range(WORLD))
    exact(t, want, "async all_reduce")
    exact(got[0], want, "the future's value")
    return "wait, is_completed, get_future"


def pytorch_ddp(tol, hook=None, **kw):
    from torch.nn.parallel import DistributedDataParallel as DDP
    net = model().to(DEV)
    ddp = DDP(net, device_ids=[DEV.index], **kw)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    worst = 0.0
    for step in range(5):
        before = [p.detach().cpu().clone() for p in net.parameters()]
        x, y = batch(RANK, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x.to(DEV)), y.to(DEV)).backward()
        for p, r in zip(net.parameters(), reference_grads(before, step, WORLD)):
            worst = max(worst, ((p.grad.double().cpu() - r).norm() / r.norm()).item())
        opt.step()
    check(worst <= tol, f"worst relative error of a gradient {worst:.2e} (tolerance {tol:.0e})")
    return f"5 steps, worst relative error {worst:.2e}"


def case_pytorch_ddp():
    return pytorch_ddp(1e-5)


def case_pytorch_ddp_bucket_view():
    return pytorch_ddp(1e-5, gradient_as_bucket_view=True, bucket_cap_mb=0.001)


def case_pytorch_ddp_fp16_hook():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return pytorch_ddp(1e-3, hook=default_hooks.fp16_compress_hook)


def case_served_by():
    group = collie.distributed.backend_of()
    check(group is not None, f"the default group is not collie's but {type(dist.group.WORLD)}")
    served = group._cuda_group()
    if "cuda:nccl" in BACKEND:
        check(served is not None and "NCCL" in type(served).__name__,
              f"{BACKEND}: CUDA tensors went to {served!r}, not PyTorch's ProcessGroupNCCL")
        return f"CUDA tensors: PyTorch's {type(served).__name__}"
    check(served is None, f"{BACKEND}: CUDA tensors went to {served!r}, not collie")
    return "CUDA tensors: collie's NCCL backend"


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    names = sys.argv[2:] or list(CASES)
    check_cases.run(CASES, names, Failed, RANK, WORLD)
