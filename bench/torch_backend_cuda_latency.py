"""dist.all_reduce on CUDA tensors through the backend "collie" (collie's
NCCL backend), through "cpu:collie,cuda:nccl" (PyTorch's ProcessGroupNCCL
under collie's group) and through PyTorch's own "nccl" group, beside
collie's own blocking all-reduce, in one job on a GPU machine:

    collie-run -n 1 python3 bench/torch_backend_cuda_latency.py

Sizes 8 B to 64 MiB (f32); each call is followed by a device
synchronisation (the time a caller waits for the result); per size the
median over 5 rounds of back-to-back calls (100 up to 1 MiB, 10 above),
after 10 warm-ups; rank 0 prints microseconds per call. One rank: NCCL moves
no data between GPUs, so this is each path's own cost over a device copy."""
import os
import statistics
import time

os.environ.setdefault("NCCL_HOSTID", "collie-bench-" + os.environ.get("RANK", "0"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.distributed  # noqa: E402

dist.init_process_group("collie")
rank = dist.get_rank()
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
nccl = dist.new_group(backend="nccl")
mixed = dist.new_group(backend="cpu:collie,cuda:nccl")
comm = collie.distributed.backend_of().comm


def bench(fn, n):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        dist.barrier(group=nccl, device_ids=[0])
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)


if rank == 0:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{dist.get_world_size()} rank(s); us per call, f32 sum")
    print(f"{'bytes':>10} {'collie own':>11} {'collie':>9} {'cpu:collie,cuda:nccl':>21} "
          f"{'nccl':>9}")
size = 8
while size <= 64 << 20:
    t = torch.ones(size // 4, device=dev)
    n = 100 if size <= 1 << 20 else 10
    own = bench(lambda: comm.allreduce(t), n)
    backend = bench(lambda: dist.all_reduce(t), n)
    via_nccl = bench(lambda: dist.all_reduce(t, group=mixed), n)
    plain = bench(lambda: dist.all_reduce(t, group=nccl), n)
    if rank == 0:
        print(f"{size:>10} {own:>11.1f} {backend:>9.1f} {via_nccl:>21.1f} {plain:>9.1f}",
              flush=True)
    size *= 8
dist.destroy_process_group()
