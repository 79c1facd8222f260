"""dist.all_reduce's time per call through the torch.distributed backend
"collie", beside Gloo's and collie's own blocking all-reduce, in one job:

    collie-run -n 2 python3 bench/torch_backend_latency.py

Sizes 8 B to 16 MiB (f32); per size the median over 5 rounds of back-to-back
calls (200 up to 64 KiB, 20 above), after 20 warm-ups; rank 0 prints.
"backend overhead" is the backend's time minus collie's own call's."""
import time, statistics, torch, torch.distributed as dist, collie.torch
torch.set_num_threads(1)
dist.init_process_group("collie")
gloo = dist.new_group(backend="gloo")
comm = dist.distributed_c10d._get_default_group().comm
rank = dist.get_rank()
def bench(fn, n):
    for _ in range(20): fn()
    ts = []
    for _ in range(5):
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(n): fn()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts) * 1e6
for nbytes in (8, 1024, 65536, 1 << 20, 16 << 20):
    t = torch.ones(nbytes // 4)
    n = 200 if nbytes <= 65536 else 20
    b = bench(lambda: dist.all_reduce(t), n)
    g = bench(lambda: dist.all_reduce(t, group=gloo), n)
    c = bench(lambda: comm.allreduce(t), n)
    if rank == 0:
        print(f"{nbytes:>10} B  backend {b:9.1f} us  gloo {g:9.1f} us  collie direct {c:9.1f} us  backend/gloo {b/g:5.2f}  backend overhead {b-c:7.1f} us", flush=True)
