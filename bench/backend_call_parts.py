"""Where a small dist.all_reduce's time goes through the backend "collie":
each layer of the call timed alone, 8 B f32, on the device given (cpu or
cuda), in one job:

    collie-run -n 1 python3 bench/backend_call_parts.py [cpu|cuda]

Layers: collie's blocking call; collie's async call and its wait; the
group's allreduce and its Work's wait (no PyTorch front); dist.all_reduce.
Per layer the median over 5 rounds of 2000 calls (a device synchronisation
after each on cuda), microseconds per call; then cProfile's top entries of
dist.all_reduce."""
import cProfile
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("NCCL_HOSTID", "collie-parts-" + os.environ.get("RANK", "0"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.distributed  # noqa: E402

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
dist.init_process_group("collie")
pg = collie.distributed.backend_of()
comm = pg.comm
t = torch.ones(2, device=device)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
opts = dist.AllreduceOptions()


def timed(fn, n=2000):
    for _ in range(200):
        fn()
    sync()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
            sync()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)


parts = [
    ("collie blocking call", lambda: comm.allreduce(t)),
    ("collie async + wait", lambda: comm.allreduce(t, async_op=True).wait()),
    ("group.allreduce + wait", lambda: pg.allreduce([t], opts).wait()),
    ("dist.all_reduce", lambda: dist.all_reduce(t)),
]
if dist.get_rank() == 0:
    print(f"torch {torch.__version__} on {device}: us per 8 B all_reduce")
for name, fn in parts:
    us = timed(fn)
    if dist.get_rank() == 0:
        print(f"{name:>26}: {us:8.1f}", flush=True)
if dist.get_rank() == 0:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        dist.all_reduce(t)
        sync()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
dist.destroy_process_group()
