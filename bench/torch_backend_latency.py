"""dist.all_reduce's time per call through the torch.distributed backend
"collie", beside Gloo's and collie's own blocking all-reduce, in one job:

    collie-run -n 2 python3 bench/torch_backend_latency.py [--cpp]

Sizes 8 B to 16 MiB (f32); per size the median over 9 rounds of back-to-back
calls (200 up to 64 KiB, 20 above), after 20 warm-ups, the calls taking
turns round by round; rank 0 prints.
"C call" is collie's blocking all-reduce called as C calls it (collie-bench's
call; from Python, through ctypes, its tensor described once);
"Communicator.allreduce" is collie's own Python API's call;
"backend overhead" is the backend's time minus the C call's;
"front" is dist.all_reduce's time on a Python group that does nothing
(PyTorch's own share of any Python backend's call). --cpp
adds the backend written as a C++ extension ("collie_cpp",
bench/c10d_ext/), on a communicator of its own."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import collie
import collie.distributed
from collie import _lib

torch.set_num_threads(1)
dist.init_process_group("collie")
gloo = dist.new_group(backend="gloo")
comm = collie.distributed.backend_of().comm
rank = dist.get_rank()
cpp = None


class _Ended(torch._C._distributed_c10d.Work):
    def wait(self, timeout=None):
        return True


_ENDED = _Ended()


class _Nothing(dist.ProcessGroup):
    """A group whose all_reduce does nothing (and returns one ended Work for
    all): what PyTorch's front costs."""

    def allreduce(self, tensors, opts=None):
        return _ENDED

    def getBackendName(self):
        return "nothing"


dist.Backend.register_backend("nothing", lambda store, r, n, timeout: _Nothing(r, n),
                              **({"devices": ["cpu"]} if torch.__version__ >= "2" else {}))
nothing = dist.new_group(backend="nothing")
if "--cpp" in sys.argv:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "c10d_ext"))
    import register
    register.register()
    cpp = dist.new_group(backend="collie_cpp")


def bench(fns, n, rounds=9):
    """Per fn, the median over `rounds` of n back-to-back calls' mean (us);
    the fns take turns round by round, so a slow spell of the VM falls on
    all of them alike. Each round of a fn starts with 10 calls untimed:
    right after Gloo's round, collie's own call of 64 KiB took 38-62 us
    against 19-20 otherwise (by the run)."""
    for fn in fns:
        for _ in range(20):
            fn()
    ts = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, ts):
            for _ in range(10):  # after another library's round (see the docstring)
                fn()
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - t0) / n)
    return [statistics.median(x) * 1e6 for x in ts]


def c_call(t):
    """collie's blocking all-reduce of t as a C caller makes it (what
    collie-bench times): one call into the C ABI, its tensor described
    once, outside the timing."""
    desc = collie.as_tensor(t)
    fn, h = _lib.lib.collie_comm_allreduce, comm._h

    def call():
        _lib.check(fn(h, desc, desc, 0, None))
    return call


for nbytes in (8, 1024, 65536, 256 << 10, 1 << 20, 16 << 20):
    t = torch.ones(nbytes // 4)
    n = 200 if nbytes <= 65536 else 20
    fns = [lambda: dist.all_reduce(t), lambda: dist.all_reduce(t, group=gloo),
           c_call(t), lambda: dist.all_reduce(t, group=nothing), lambda: comm.allreduce(t)]
    if cpp is not None:
        fns.append(lambda: dist.all_reduce(t, group=cpp))
    b, g, c, f, p, *x = bench(fns, n)
    x = x[0] if x else float("nan")
    if rank == 0:
        print(f"{nbytes:>10} B  backend {b:9.1f} us  gloo {g:9.1f} us  C call {c:9.1f} us  "
              f"Communicator.allreduce {p:9.1f} us  backend/gloo {b / g:5.2f}  "
              f"backend overhead {b - c:7.1f} us = {100 * (b - c) / c:5.1f} % (front {f:4.1f} us)"
              + (f"  C++ backend {x:9.1f} us (overhead {x - c:7.1f} us)" if cpp is not None
                 else ""), flush=True)

# Every group before the interpreter goes: a Gloo worker thread that drops
# its last Work while Python finalizes aborts the process (pytorch/pytorch#190489).
dist.destroy_process_group()
