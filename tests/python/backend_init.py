"""The collie backend under each of torch.distributed's init methods, with no
launcher (ranks started by torch.multiprocessing.spawn, as PyTorch's DDP
tutorial starts them):

    python3 backend_init.py

tcp://, file://, an explicit TCPStore and env:// (MASTER_ADDR/MASTER_PORT),
one after another in the same 3 processes (destroy_process_group between):
each rank all-reduces its rank + 1, and a new_group of the odd ranks
reduces too; the sums are checked against the known answer. A bad
init_method is an error that names it. Prints one line per method, then
"N passed, N failed".
"""
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collie.torch  # noqa: F401 - registers the backend "collie"

WORLD = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, methods, results):
    """Rank `rank` through every method in turn, in one process (a process
    per method and rank spent 2-3 s importing torch each): init, the
    checks, destroy_process_group, the next."""
    for method, where in methods:
        try:
            if method == "env":
                os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(where)
                dist.init_process_group("collie", rank=rank, world_size=WORLD)
            elif method == "store":
                store = dist.TCPStore("127.0.0.1", where, WORLD, rank == 0,
                                      timeout=timedelta(seconds=60))
                dist.init_process_group("collie", store=store, rank=rank, world_size=WORLD)
            else:
                dist.init_process_group("collie", init_method=where, rank=rank, world_size=WORLD)
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t)
            odd = dist.new_group([r for r in range(WORLD) if r % 2 == 1], backend="collie")
            u = torch.tensor([float(rank)])
            if rank % 2 == 1:
                dist.all_reduce(u, group=odd)
            dist.barrier()
            dist.destroy_process_group()
            results.put((method, rank, t.item(), u.item()))
        except Exception:  # noqa: BLE001 - reported by the parent
            results.put((method, rank, "error", traceback.format_exc()))
            return  # this rank's group is in an unknown state: the others time out


def check_method(got):
    """Why one method's results (rank, total, odd) are wrong, or None."""
    want_sum = WORLD * (WORLD + 1) / 2
    odd_sum = sum(r for r in range(WORLD) if r % 2 == 1)
    if len(got) != WORLD:
        return f"{len(got)} of {WORLD} ranks reported"
    for rank, total, odd in sorted(got):
        if total == "error":
            return f"rank {rank}: {odd}"
        if total != want_sum:
            return f"rank {rank}: all_reduce gave {total}, not {want_sum}"
        if rank % 2 == 1 and odd != odd_sum:
            return f"rank {rank}: the odd ranks' group gave {odd}, not {odd_sum}"
    return None


def main():
    tmp = tempfile.mkdtemp()
    # env:// last: its variables, set in each rank's environment, must not
    # be what the other methods found the job by.
    methods = [("tcp", f"tcp://127.0.0.1:{free_port()}"), ("file", f"file://{tmp}/rendezvous"),
               ("store", free_port()), ("env", free_port())]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=run, args=(r, methods, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240  # inside meson's 300 s, to say which method stuck
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():  # stuck: its methods report as missing below
            p.kill()
    got = {}
    while not results.empty():
        method, rank, total, odd = results.get()
        got.setdefault(method, []).append((rank, total, odd))
    failed = 0
    for method, where in methods:
        why = check_method(got.get(method, []))
        failed += why is not None
        print(f"{'ok  ' if why is None else 'FAIL'} init by {method} ({where})"
              + (f": {why}" if why else ": every rank's sum, and a new_group's"), flush=True)
    # A bad init_method: PyTorch's error, naming it, before collie is reached.
    try:
        dist.init_process_group("collie", init_method="nonsense://x", rank=0, world_size=1)
        print("FAIL a bad init_method: no error")
        failed += 1
    except (ValueError, RuntimeError) as e:
        print(f"ok   a bad init_method: {type(e).__name__}: {str(e)[:80]}")
    print(f"{len(methods) + 1 - failed} passed, {failed} failed (torch {torch.__version__})")
    shutil.rmtree(tmp)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("COLLIE_TIMEOUT", "60")
    main()
