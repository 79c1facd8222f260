"""The collie backend of torch.distributed against Gloo and serial
references, in one job:

    collie-run -n 2 python3 backend_check.py [case ...]

init_process_group("collie") from the launcher's variables (env://), a Gloo
group of the same ranks beside it:
  * every collective the backend serves, for every dtype collie has, on
    values every dtype holds exactly: bit-equal to a serial reference and to
    Gloo where Gloo has the op and dtype; random float32 values: bit-equal
    to Gloo at 2 ranks, within rounding at 3;
  * all_to_all and all_to_all_single, even and uneven, against the blocks
    each rank sent and against Gloo;
  * monitored_barrier: passes with every rank, names the ranks missing;
  * the object collectives (pickles of lengths that differ by rank) and
    complex tensors, against known answers;
  * int8 across its range and bools of every pattern, against PyTorch's
    own arithmetic and Gloo;
  * dist.all_reduce(t) waited for goes through the shortcut to collie's C
    call, async_op=True does not;
  * async ops: wait(), is_completed(), get_future()'s value; the call
    returns before the other ranks have called theirs;
  * collie's own DDP in the same job: on the backend's communicator;
  * PyTorch's own DistributedDataParallel over collie against the same over
    Gloo (find_unused_parameters, bucket view, static_graph, its fp16 hook,
    join with uneven inputs; its PowerSGD hook at a rank that makes it
    exact, against plain DDP): parameters within 1e-5 after 5 steps (fp16's
    and PowerSGD's rounding: 2e-4, 1e-4);
  * where PyTorch's DDP asks its backend for memory (2.15; not 1.13, 2.1), its
    buckets in collie's memory (seen in /proc/self/maps), the parameters
    as over Gloo; DDP_DISABLE_COMM_MEM=1 leaves them in PyTorch's; a
    failed build of the module: one warning;
  * bad input: an op collie does not have, tensors that differ across ranks:
    an exception naming the op and the rank, no hang.
Prints one ok/FAIL line per case and rank, then "N passed, N failed".
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import check_cases
from check_cases import Failed, check
import collie.distributed  # noqa: F401 - registers the backend "collie"

torch.set_num_threads(1)
if os.environ.get("BACKEND_CHECK_INIT") == "launcher":
    collie.distributed.init_process_group()  # under mpirun: its variables, not PyTorch's
else:
    dist.init_process_group("collie")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
GLOO = dist.new_group(backend="gloo")
TORCH2 = hasattr(dist, "DistError")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.bool]


def values(rank, n=7, dtype=torch.float32):
    """Small whole numbers (1 to 3): every dtype holds them, their sums and
    products over a few ranks, exactly; bools True and False by rank (so
    that or and and differ)."""
    if dtype == torch.bool:
        return (torch.arange(n) + rank) % 3 == 0
    return ((torch.arange(n) + rank) % 3 + 1).to(dtype)


def exact(got, want, what):
    """Equal dtypes and values; bools byte for byte (a bool tensor holding a
    2, a sum of two Trues, equals True to torch.equal)."""
    if got.dtype == want.dtype == torch.bool:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    check(got.dtype == want.dtype and torch.equal(got, want),
          f"{what}: got {got.tolist()}, want {want.tolist()}")


def logical(t):
    """A bool tensor as 0s and 1s: Gloo's sum of bools holds the count (3
    Trues: a 3), where PyTorch's own bool arithmetic, and collie, hold 1."""
    return t.view(torch.uint8).ne(0) if t.dtype == torch.bool else t


def gloo_has(fn):
    """Runs fn, a Gloo collective: whether Gloo serves it (it lacks some ops
    and dtypes)."""
    try:
        fn()
        return True
    except RuntimeError:
        return False


# ---- the cases -------------------------------------------------------------------

def case_all_reduce():
    ops = {"SUM": dist.ReduceOp.SUM, "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX,
           "PRODUCT": dist.ReduceOp.PRODUCT}
    if hasattr(dist.ReduceOp, "AVG"):
        ops["AVG"] = dist.ReduceOp.AVG
    compared = 0
    for dtype in DTYPES:
        # In float64, then cast: a bool's sum is then its or, its product its and.
        everyone = [values(r, dtype=dtype).double() for r in range(WORLD)]
        serial = {"SUM": sum(everyone), "MIN": torch.stack(everyone).min(0).values,
                  "MAX": torch.stack(everyone).max(0).values,
                  "PRODUCT": torch.stack(everyone).prod(0), "AVG": sum(everyone) / WORLD}
        for name, op in ops.items():
            if name == "AVG" and not dtype.is_floating_point:
                continue
            t = values(RANK, dtype=dtype)
            dist.all_reduce(t, op=op)
            want = serial[name].to(dtype)
            if name == "AVG":
                check(torch.allclose(t.double(), serial[name], rtol=1e-2),
                      f"all_reduce AVG {dtype}: {t.tolist()}")
            else:
                exact(t, want, f"all_reduce {name} {dtype}")
            g = values(RANK, dtype=dtype)
            if name != "AVG" and gloo_has(lambda: dist.all_reduce(g, op=op, group=GLOO)):
                exact(t, logical(g), f"all_reduce {name} {dtype} against Gloo")
                compared += 1
    # Random values: Gloo's sums, bit for bit where the order cannot differ.
    torch.manual_seed(10 + RANK)
    x = torch.randn(10007)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=GLOO)
    if WORLD == 2:
        exact(a, b, "all_reduce of random float32 against Gloo")
    else:
        check(torch.allclose(a, b, rtol=1e-6, atol=1e-6), "random float32 against Gloo")
    return f"{len(ops)} ops x {len(DTYPES)} dtypes exact; {compared} also against Gloo"


def case_int8_and_bool():
    """int8 across its range (sums that wrap, negative minima) and bools of
    every pattern: each reduction equal to a serial one in PyTorch's own
    arithmetic and to Gloo's; bools moved by broadcast, all_gather and
    reduce_scatter as they were sent."""
    ops = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT,
           "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX}
    ints = [torch.randint(-128, 128, (257,), dtype=torch.int8,
                          generator=torch.Generator().manual_seed(100 + r)) for r in range(WORLD)]
    bools = [torch.rand(257, generator=torch.Generator().manual_seed(200 + r)) < 0.5
             for r in range(WORLD)]
    every = {torch.int8: torch.stack(ints).long(), torch.bool: torch.stack(bools).long()}
    compared = 0
    serial = {"SUM": lambda x: x.sum(0), "PRODUCT": lambda x: x.prod(0),
              "MIN": lambda x: x.min(0).values, "MAX": lambda x: x.max(0).values}
    for dtype, mine in ((torch.int8, ints[RANK]), (torch.bool, bools[RANK])):
        for name, op in ops.items():
            t = mine.clone()
            dist.all_reduce(t, op=op)
            # int64 results cast back: int8 wraps as its arithmetic does;
            # a bool is any nonzero (sum and max: or; prod and min: and).
            exact(t, serial[name](every[dtype]).to(dtype), f"all_reduce {name} {dtype}")
            g = mine.clone()
            if gloo_has(lambda: dist.all_reduce(g, op=op, group=GLOO)):  # 2.x: 1.13's has neither
                exact(t, logical(g), f"all_reduce {name} {dtype} against Gloo")
                compared += 1
    try:
        dist.all_reduce(bools[RANK].clone(), op=dist.ReduceOp.AVG)
        raise Failed("AVG of bools: no error")
    except (RuntimeError, ValueError) as e:
        check("bool" in str(e), f"AVG of bools: the error does not say why: {e}")
    b = bools[RANK].clone() if RANK == 0 else torch.zeros(257, dtype=torch.bool)
    dist.broadcast(b, 0)
    exact(b, bools[0], "broadcast of bools")
    out = torch.empty(257 * WORLD, dtype=torch.bool)
    dist.all_gather_into_tensor(out, bools[RANK])
    exact(out, torch.cat(bools), "all_gather_into_tensor of bools")
    mine = torch.stack([bools[RANK]] * WORLD).reshape(-1)
    out = torch.empty(257, dtype=torch.bool)
    dist.reduce_scatter_tensor(out, mine)
    exact(out, torch.stack(bools).any(0), "reduce_scatter_tensor of bools (sum: or)")
    # collie's own Communicator: a buffer of bools without a dtype (ctypes)
    # reduces as bools too, and bools are not mixed with bytes (both u8 to
    # collie's C layer).
    import ctypes
    comm = collie.distributed.backend_of().comm
    flags = (ctypes.c_bool * 257)(*bools[RANK].tolist())
    comm.allreduce(flags)
    got = torch.frombuffer(bytearray(bytes(flags)), dtype=torch.uint8)
    exact(got, torch.stack(bools).any(0).to(torch.uint8), "Communicator.allreduce of c_bools")
    n = comm.size
    for what, call in (
            ("allreduce", lambda x, y: comm.allreduce(x, out=y)),
            ("allgather", lambda x, y: comm.allgather(x, torch.cat([y] * n))),
            ("alltoall", lambda x, y: comm.alltoall(torch.cat([x] * n), torch.cat([y] * n)))):
        for a, b in ((torch.uint8, torch.bool), (torch.bool, torch.uint8)):
            try:
                call(torch.full((4,), 7).to(a), torch.zeros(4, dtype=b))
                raise Failed(f"Communicator.{what} of {a} into {b}: no error")
            except RuntimeError as e:
                check("bool" in str(e), f"{what} of {a} into {b}: the error does not say why: {e}")
    return (f"int8 and bool: 4 ops each exact, {compared} of 8 also against Gloo; bools moved "
            "and reduced")


def case_all_reduce_shortcut():
    """dist.all_reduce(t) of one CPU tensor, waited for, goes straight to
    collie's blocking C call (collie._backend_work._allreduce_now);
    async_op=True takes the general path. Both sum right."""
    from collie import _backend_work
    real, calls = _backend_work._ALLREDUCE, []

    def counted(*args):
        calls.append(args)
        return real(*args)
    want = sum(values(r, n=9) for r in range(WORLD))
    dist.all_reduce(values(RANK, n=9))  # float32 met: the shortcut knows its code
    _backend_work._ALLREDUCE = counted
    try:
        t = values(RANK, n=9)
        dist.all_reduce(t)
        check(len(calls) == 1, f"dist.all_reduce(t) made {len(calls)} shortcut calls, not 1")
        exact(t, want, "all_reduce through the shortcut")
        del calls[:]
        t = values(RANK, n=9)
        dist.all_reduce(t, async_op=True).wait()
        check(not calls, "dist.all_reduce(t, async_op=True) took the shortcut")
        exact(t, want, "async all_reduce beside the shortcut")
    finally:
        _backend_work._ALLREDUCE = real
    return "blocking calls through the shortcut, async ones not; both exact"


def case_async():
    t = values(RANK, n=1000)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    w.wait()
    check(w.is_completed(), "is_completed() after wait()")
    want = sum(values(r, n=1000) for r in range(WORLD))
    exact(t, want, "async all_reduce")
    exact(fut.wait()[0], want, "get_future()'s value")
    chained = dist.all_reduce(values(RANK), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    exact(chained.wait(), 2 * sum(values(r) for r in range(WORLD)), "then() on the future")
    # An async op returns before the other ranks have called it (PyTorch's
    # DDP reduces a bucket while backward goes on): rank 0's call returns,
    # then it tells the others to call theirs. 1.13 and 2.1 waited in the
    # call: rank 0 hung there, and the others' wait for its word timed out.
    store = dist.distributed_c10d._get_default_store()
    t = values(RANK, n=1000)
    if RANK == 0:
        w = dist.all_reduce(t, async_op=True)
        store.set("backend_check/async_issued", "1")
    else:
        store.wait(["backend_check/async_issued"], datetime.timedelta(seconds=30))
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    exact(t, want, "an all_reduce rank 0 issued before the others called theirs")
    # wait(timeout) gives up at the timeout while the others have not
    # called yet (Gloo's does): rank 0's wait raises, and only then are the
    # others told to call; the op then ends with the sum. Before, the waiter
    # ran the op itself within the group's deadline and blocked past the
    # timeout (a review found it): here it hung until that deadline.
    t = values(RANK, n=1000)
    if RANK == 0:
        w = dist.all_reduce(t, async_op=True)
        try:
            w.wait(timeout=datetime.timedelta(seconds=0.2))
            raise Failed("wait(timeout) returned while the other ranks had not called")
        except Failed:
            raise
        except Exception as e:  # noqa: BLE001 - PyTorch's or collie's timeout type
            check("timed out" in str(e) or "did not complete" in str(e),
                  f"wait(timeout) raised something else: {e}")
        check(not w.is_completed(), "the op ended though the other ranks had not called")
        store.set("backend_check/waited", "1")
    else:
        store.wait(["backend_check/waited"], datetime.timedelta(seconds=30))
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    exact(t, want, "an all_reduce after a wait(timeout) that gave up")
    return ("wait, is_completed, get_future, then; issued before the other ranks call; "
            "wait(timeout) gives up at its timeout")


def case_future_values():
    """An async op's get_future() value has the shape of Gloo's, where
    Gloo's op has a future: the list of outputs for all_gather and gather
    (collie's were nested in a list), each rank's piece for
    all_gather_into_tensor (collie's was the whole output); the values
    equal (found in an edge-case hunt against Gloo)."""
    def shape(v):
        if isinstance(v, (list, tuple)):
            return [shape(x) for x in v]
        return (tuple(v.shape), v.tolist()) if isinstance(v, torch.Tensor) else repr(v)

    x = lambda: torch.full((2,), float(RANK + 1))  # noqa: E731
    ops = {
        "all_gather": lambda g: dist.all_gather([torch.zeros(2) for _ in range(WORLD)], x(),
                                                group=g, async_op=True),
        "gather": lambda g: dist.gather(x(), [torch.zeros(2) for _ in range(WORLD)]
                                        if RANK == 0 else None, dst=0, group=g, async_op=True),
        "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(
            torch.zeros(2 * WORLD), x(), group=g, async_op=True),
        "broadcast": lambda g: dist.broadcast(x(), src=0, group=g, async_op=True),
        "reduce": lambda g: dist.reduce(x(), dst=0, group=g, async_op=True),
        "scatter": lambda g: dist.scatter(torch.zeros(2), [x() for _ in range(WORLD)]
                                          if RANK == 0 else None, src=0, group=g, async_op=True),
        "all_to_all": lambda g: dist.all_to_all([torch.zeros(2) for _ in range(WORLD)],
                                                [x() for _ in range(WORLD)], group=g,
                                                async_op=True),
        "all_reduce": lambda g: dist.all_reduce(x(), group=g, async_op=True),
    }
    compared = []
    for name, op in ops.items():
        try:
            theirs = shape(op(GLOO).get_future().wait())
        except Exception:  # noqa: BLE001 - Gloo has no such op or future on this PyTorch
            continue
        ours = shape(op(None).get_future().wait())
        if name == "reduce" and RANK != 0:  # the tensor is left undefined off the root
            ours, theirs = [len(ours)], [len(theirs)]
        check(ours == theirs, f"{name}'s future value: {ours}, Gloo's {theirs}")
        compared.append(name)
    check("all_gather" in compared, "all_gather's future was not compared")
    return "future values as Gloo's: " + ", ".join(compared)


def case_coalesced_and_broadcast():
    ts = [values(RANK, n) for n in (3, 5, 1)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 5, 1)):
        exact(t, sum(values(r, n) for r in range(WORLD)), "all_reduce_coalesced")
    for root in range(WORLD):
        for dtype in DTYPES:
            t = values(RANK, dtype=dtype)
            dist.broadcast(t, src=root)
            exact(t, values(root, dtype=dtype), f"broadcast from {root} {dtype}")
    return "all_reduce_coalesced; broadcast from every root, every dtype"


def case_gather_family():
    for dtype in DTYPES:
        mine = values(RANK, 5, dtype)
        outs = [torch.zeros(5, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(outs, mine)
        for r in range(WORLD):
            exact(outs[r], values(r, 5, dtype), f"all_gather {dtype} from rank {r}")
        flat = torch.zeros(5 * WORLD, dtype=dtype)
        into = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        into(flat, mine)
        exact(flat, torch.cat([values(r, 5, dtype) for r in range(WORLD)]),
              f"all_gather_into_tensor {dtype}")
        gloo_flat = torch.zeros(5 * WORLD, dtype=dtype)
        if gloo_has(lambda: into(gloo_flat, mine, group=GLOO)):
            exact(flat, gloo_flat, f"all_gather_into_tensor {dtype} against Gloo")
        root = WORLD - 1
        gathered = [torch.zeros(5, dtype=dtype) for _ in range(WORLD)] if RANK == root else None
        dist.gather(mine, gather_list=gathered, dst=root)
        if RANK == root:
            for r in range(WORLD):
                exact(gathered[r], values(r, 5, dtype), f"gather {dtype} from rank {r}")
        got = torch.zeros(5, dtype=dtype)
        pieces = [values(10 + r, 5, dtype) for r in range(WORLD)] if RANK == 0 else None
        dist.scatter(got, scatter_list=pieces, src=0)
        exact(got, values(10 + RANK, 5, dtype), f"scatter {dtype}")
    return "all_gather, all_gather_into_tensor, gather, scatter: every dtype"


def case_objects():
    """The object collectives (Lightning's strategy.broadcast is
    broadcast_object_list) over the backend's broadcast, all-gather,
    gather and scatter of pickled bytes, whose lengths differ by rank; and
    complex tensors, which PyTorch sums as their real views."""
    mine = {"rank": RANK, "text": "x" * (100 * RANK + 1)}  # a pickle of another length on each
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, mine)
    check(everyone == [{"rank": r, "text": "x" * (100 * r + 1)} for r in range(WORLD)],
          f"all_gather_object: {str(everyone)[:80]}")
    root = WORLD - 1
    sent = [{"step": 7, "ckpt": "a" * 300}, ("path", root)]
    objs = list(sent) if RANK == root else [None, None]
    dist.broadcast_object_list(objs, src=root)
    check(objs == sent, f"broadcast_object_list: {str(objs)[:80]}")
    got = [None] * WORLD if RANK == root else None
    dist.gather_object(("g", RANK, "y" * RANK), got, dst=root)
    if RANK == root:
        check(got == [("g", r, "y" * r) for r in range(WORLD)], f"gather_object: {got}")
    out = [None]
    dist.scatter_object_list(out, [("s", r, [0] * r) for r in range(WORLD)] if RANK == root
                             else None, src=root)
    check(out == [("s", RANK, [0] * RANK)], f"scatter_object_list: {out}")
    c = torch.tensor([1 + 2j, 3 - 1j, -0.5j], dtype=torch.complex64) * (RANK + 1)
    dist.all_reduce(c)
    want = torch.tensor([1 + 2j, 3 - 1j, -0.5j], dtype=torch.complex64) * sum(range(1, WORLD + 1))
    exact(c, want, "all_reduce of complex64")
    return "all_gather_object, broadcast_object_list, gather_object, scatter_object_list; complex"


def case_reduce_family():
    for dtype in DTYPES:
        ins = [values(RANK + 3 * k, 4, dtype) for k in range(WORLD)]
        out = torch.zeros(4, dtype=dtype)
        dist.reduce_scatter(out, ins)
        exact(out, sum(values(r + 3 * RANK, 4, dtype).double() for r in range(WORLD)).to(dtype),
              f"reduce_scatter {dtype}")
        flat = torch.cat(ins)
        out2 = torch.zeros(4, dtype=dtype)
        rst = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
        rst(out2, flat)
        exact(out2, out, f"reduce_scatter_tensor {dtype}")
        for root in range(WORLD):
            t = values(RANK, 6, dtype)
            dist.reduce(t, dst=root)
            if RANK == root:
                exact(t, sum(values(r, 6, dtype).double() for r in range(WORLD)).to(dtype),
                      f"reduce to {root} {dtype}")
            else:
                exact(t, values(RANK, 6, dtype), f"reduce to {root}: a non-root's tensor moved")
    return "reduce_scatter, reduce_scatter_tensor, reduce to every root: every dtype"


def case_all_to_all():
    """all_to_all_single (even and uneven row splits, 2-D rows) and
    all_to_all (tensors of different sizes): each block from its rank
    (a known answer), and the even form equal to Gloo's."""
    def block(src, dst, n, dtype):
        return ((torch.arange(n) + 3 * src + 5 * dst) % 7 + 1).to(dtype)
    for dtype in DTYPES:
        mine = torch.cat([block(RANK, j, 4, dtype) for j in range(WORLD)])
        got = torch.zeros(4 * WORLD, dtype=dtype)
        dist.all_to_all_single(got, mine)
        exact(got, torch.cat([block(q, RANK, 4, dtype) for q in range(WORLD)]),
              f"all_to_all_single {dtype}")
        gloo_got = torch.zeros(4 * WORLD, dtype=dtype)
        if gloo_has(lambda: dist.all_to_all_single(gloo_got, mine, group=GLOO)):
            exact(got, gloo_got, f"all_to_all_single {dtype} against Gloo")
    # Uneven: rank r sends rank j (r + j) % 3 rows of 2 (some empty).
    rows = lambda src, dst: (src + 2 * dst) % 3  # noqa: E731
    send = torch.cat([block(RANK, j, 2 * rows(RANK, j), torch.float64).reshape(-1, 2)
                      for j in range(WORLD)])
    recv = torch.zeros(sum(rows(q, RANK) for q in range(WORLD)), 2, dtype=torch.float64)
    dist.all_to_all_single(recv, send, output_split_sizes=[rows(q, RANK) for q in range(WORLD)],
                           input_split_sizes=[rows(RANK, j) for j in range(WORLD)])
    want = torch.cat([block(q, RANK, 2 * rows(q, RANK), torch.float64).reshape(-1, 2)
                      for q in range(WORLD)])
    exact(recv, want, "all_to_all_single with uneven splits")
    ins = [block(RANK, j, 1 + RANK + j, torch.int64) for j in range(WORLD)]
    outs = [torch.zeros(1 + q + RANK, dtype=torch.int64) for q in range(WORLD)]
    dist.all_to_all(outs, ins)
    for q in range(WORLD):
        exact(outs[q], block(q, RANK, 1 + q + RANK, torch.int64), f"all_to_all from rank {q}")
    work = dist.all_to_all_single(got, mine, async_op=True)
    work.wait()
    return "all_to_all_single (even, uneven, async), all_to_all: every dtype, Gloo's equal"


def case_monitored_barrier():
    """Every rank arrives: it passes. Rank 0 alone (the others wait in a
    Gloo all-reduce until it has given up): it names every other rank; then
    the others alone: each names rank 0. The group works after. Through
    PyTorch's dist.monitored_barrier where it takes collie's group (2.15:
    a group with a backend for the CPU, which the memory backend of
    _comm_memory is), else the group's method (PyTorch takes Gloo only on
    1.13 and 2.1)."""
    import datetime
    group = collie.distributed.backend_of()
    through = "PyTorch's dist.monitored_barrier" if group._memory is not None else "the group's"

    def barrier(timeout, wait_all_ranks=False):
        if group._memory is not None:
            return dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all_ranks)
        return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    barrier(datetime.timedelta(seconds=60))
    short = datetime.timedelta(seconds=1)
    msg = ""
    if RANK == 0:
        try:
            barrier(short, wait_all_ranks=True)
            raise Failed("rank 0 alone passed the monitored barrier")
        except RuntimeError as e:
            msg = str(e)
            want = ", ".join(str(q) for q in range(1, WORLD))
            check(f"{want} did not arrive" in msg, f"the missing ranks are not named: {msg}")
    # The others wait in a Gloo all-reduce, not Gloo's barrier: that barrier
    # first waits on the group's works in progress and rethrows their
    # errors, and the failed probe of gloo_has in an earlier case can still
    # be one for a moment after its wait() raised (1.13 in CI: "Invalid
    # scalar type" from dist.barrier, rank 0 left waiting to the timeout).
    dist.all_reduce(torch.zeros(1), group=GLOO)
    if RANK != 0:
        try:
            barrier(short)
            raise Failed(f"rank {RANK} passed without rank 0")
        except RuntimeError as e:
            msg = str(e)
            check("rank 0 did not release" in msg, f"rank 0 is not named: {msg}")
    t = torch.ones(3)
    dist.all_reduce(t)
    exact(t, torch.full((3,), float(WORLD)), "all_reduce after failed monitored barriers")
    return f"{through}: passes with everyone; refused: {msg[:100]}"


def case_launcher_env():
    """What collie.distributed.init_process_group gives env:// under
    mpirun: the launcher's rank and size, 127.0.0.1 when every rank is on
    this host, else an error asking for MASTER_ADDR; a port from the job
    id, the same for every rank of the job; nothing under torchrun."""
    from collie.distributed import launcher_env
    job = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_MCA_ess_base_jobid": "77"}
    one_host = dict(job, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_SIZE="4")
    got = launcher_env(one_host)
    check(got["RANK"] == "3" and got["WORLD_SIZE"] == "4" and got["MASTER_ADDR"] == "127.0.0.1",
          f"one host: {got}")
    other = launcher_env(dict(one_host, OMPI_COMM_WORLD_RANK="0"))
    check(other["MASTER_PORT"] == got["MASTER_PORT"] and 20000 <= int(got["MASTER_PORT"]) < 32768,
          f"ports differ between ranks of a job: {got} {other}")
    try:
        launcher_env(dict(job, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_SIZE="2"))
        raise Failed("two hosts without MASTER_ADDR: no error")
    except RuntimeError as e:
        check("MASTER_ADDR" in str(e), f"the error does not say what to set: {e}")
    check(launcher_env({"RANK": "0", "OMPI_COMM_WORLD_RANK": "0"}) == {}, "torchrun's RANK")
    return f"mpirun's variables for env://, port {got['MASTER_PORT']} for job 77"


def case_point_to_point():
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.zeros(6)
    if RANK % 2 == 0:
        dist.send(values(RANK, 6), dst=right)
        dist.recv(got, src=left)
    else:
        dist.recv(got, src=left)
        dist.send(values(RANK, 6), dst=right)
    exact(got, values(left, 6), "send/recv around the ring")
    got2 = torch.zeros(6)
    ops = [dist.P2POp(dist.isend, values(RANK + 5, 6), right),
           dist.P2POp(dist.irecv, got2, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    exact(got2, values(left + 5, 6), "batch_isend_irecv")
    # The receive posted first, and more than the sockets hold: isend and
    # irecv must return at once (on 1.13 and 2.1 they once waited in the
    # call: every rank in its irecv, nobody sending).
    big = 1 << 20
    got3 = torch.zeros(big)
    ops = [dist.P2POp(dist.irecv, got3, left), dist.P2POp(dist.isend, values(RANK + 9, big), right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    exact(got3, values(left + 9, big), "batch_isend_irecv, the receive first, 4 MiB")
    got4 = torch.zeros(big)
    works = [dist.irecv(got4, src=left), dist.isend(values(RANK + 3, big), dst=right)]
    for w in works:
        w.wait()
    exact(got4, values(left + 3, big), "irecv then isend, 4 MiB")
    dist.barrier()
    return "send/recv, batch_isend_irecv, irecv before isend (4 MiB), barrier"


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(group, steps=5, hook=None, join_short=False, model=None, **kw):
    torch.manual_seed(0)
    model = model() if model is not None else Branchy()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, **kw)
    if hook is not None:
        state, fn = hook(group)
        ddp.register_comm_hook(state, fn)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    n = steps - (1 if join_short and RANK == 0 else 0)
    from contextlib import nullcontext
    with ddp.join() if join_short else nullcontext():
        for step in range(n):
            g = torch.Generator().manual_seed(100 * step + RANK)
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    if kw.get("gradient_as_bucket_view"):
        train.grads = [p.grad for p in model.parameters() if p.grad is not None]
    return [p.detach().clone() for p in model.parameters()]


def case_pytorch_ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    configs = {
        "plain": dict(find_unused_parameters=True),
        "bucket view": dict(gradient_as_bucket_view=True, find_unused_parameters=True),
        "static_graph": dict(static_graph=True),
        "fp16 hook": dict(find_unused_parameters=True, tolerance=2e-4,
                          hook=lambda g: (g, default_hooks.fp16_compress_hook)),
        # PowerSGD at a rank that holds every matrix whole (8 >= the
        # smaller side of each) is the plain average up to rounding: the
        # reference is plain DDP over Gloo. (PowerSGD itself over Gloo is
        # no reference: its chained all-reduces leave Gloo's threads in
        # different orders on different ranks, and Gloo aborts, "op.
        # preamble.length <= op.nbytes", in 2 of 6 runs on PyTorch 2.15 and
        # 5 of 8 on 1.13, without collie.) static_graph, not
        # find_unused_parameters: with the latter PyTorch's DDP all-reduces
        # its used-parameter map on the main thread while PowerSGD's
        # chained all-reduces leave from completion threads, in an order
        # that differs across ranks (collie reported the mismatch once in
        # CI: "allreduce #174 (f32 x 0) but ... (i32 x 6)").
        "PowerSGD hook (rank 8: exact)": dict(
            static_graph=True, tolerance=1e-4, gloo_without_hook=True,
            hook=lambda g: (powerSGD_hook.PowerSGDState(
                process_group=g, matrix_approximation_rank=8, start_powerSGD_iter=2,
                random_seed=7), powerSGD_hook.powerSGD_hook)),
        "join (rank 0 one step short)": dict(find_unused_parameters=True, join_short=True),
    }
    worst, ran = 0.0, 0
    only = os.environ.get("BACKEND_CHECK_DDP")
    for name, kw in configs.items():
        if only and only != name:
            continue
        # fp16 sums of 3 ranks round differently in another order (collie
        # adds in float32 and rounds once): within fp16's rounding.
        tolerance = kw.pop("tolerance", 1e-5)
        plain = kw.pop("gloo_without_hook", False)
        ran += 1
        ours = train(None, **kw)
        theirs = train(GLOO, **{k: v for k, v in kw.items() if not (plain and k == "hook")})
        for a, b in zip(ours, theirs):
            diff = (a - b).abs().max().item()
            worst = max(worst, diff)
            check(diff <= tolerance, f"PyTorch's DDP, {name}: collie and Gloo differ by {diff}")
    return (f"PyTorch's DDP over collie equals it over Gloo in {ran} configurations "
            f"(worst {worst:.1e})")


# collie's compression hooks against PyTorch's. At 2 ranks the sum is one
# addition and halving is exact, but where half a gradient is an f16
# subnormal (below 6.1e-5) PyTorch rounds twice (the conversion, then the
# division) and collie once: up to one subnormal step, 2^-24, a gradient
# element a step, times lr 0.1 over 5 steps, 3e-8 (bf16's subnormals lie
# below f32's normals: none here). At 3 ranks, within the narrow type's
# rounding of a sum in another order.
HOOK_TOLERANCE = {"fp16": 1e-7 if WORLD == 2 else 2e-4, "bf16": 1e-7 if WORLD == 2 else 2e-3}


def case_collie_compress_hooks():
    """collie.distributed's fp16 and bf16 compression hooks on PyTorch's own
    DDP, against PyTorch's own hooks over Gloo: the parameters after 5
    steps within the narrow type's rounding (PyTorch rounds the conversion
    and then the division by the world size, collie once); over a collie
    group on shm the compressed buckets lie in collie's memory; over the
    Gloo group too (collie's conversions, Gloo's all-reduce). On 1.13 and
    2.1, whose Gloo has no bf16 (and whose DDP takes PyTorch's bf16 hook only
    with CUDA), the bf16 reference is that hook's code over the collie group."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def written_out(dtype):
        # PyTorch's bf16_compress_hook, as its source reads: DDP refuses
        # PyTorch's by name without CUDA and NCCL.
        def hook(group, bucket):
            group = group if group is not None else dist.group.WORLD
            buffer = bucket.buffer()
            small = buffer.to(dtype).div_(dist.get_world_size(group))
            fut = dist.all_reduce(small, group=group, async_op=True).get_future()
            return fut.then(lambda f: buffer.copy_(f.value()[0]))
        return hook

    # 1.13 and 2.1: Gloo has no bf16, and PyTorch's bf16 hook wants CUDA.
    old_torch = not gloo_has(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bfloat16),
                                                     group=GLOO))
    hooks = {"fp16": (collie.distributed.fp16_compress_hook, default_hooks.fp16_compress_hook,
                      HOOK_TOLERANCE["fp16"]),
             "bf16": (collie.distributed.bf16_compress_hook,
                      written_out(torch.bfloat16) if old_torch else default_hooks.bf16_compress_hook,
                      HOOK_TOLERANCE["bf16"])}
    worst = {}
    for name, (ours_hook, torch_hook, tolerance) in hooks.items():
        # Without bf16 in Gloo the reference is PyTorch's hook over the
        # collie group (PyTorch's conversions, collie's all-reduce).
        no_gloo = old_torch and name == "bf16"
        theirs = train(None if no_gloo else GLOO, hook=lambda g: (g, torch_hook),
                       find_unused_parameters=True)
        for where, group in (("the collie group", None), ("the Gloo group", GLOO))[:1 + (not no_gloo)]:
            ours = train(group, hook=lambda g: (g, ours_hook), find_unused_parameters=True)
            for a, b in zip(ours, theirs):
                diff = (a - b).abs().max().item()
                worst[name] = max(worst.get(name, 0.0), diff)
                check(diff <= tolerance, f"collie's {name} hook over {where}: {diff} from "
                      f"PyTorch's over Gloo")
    group = collie.distributed.backend_of(None)
    kept = group.__dict__.get("_hook_scratch", {})
    check(len(kept) > 0, "no compressed bucket kept by the collie group")
    if group.comm.backend == "shm":
        check(all(in_collie_memory(t) for pool in kept.values() for t, _ in pool),
              "a compressed bucket outside collie's memory on shm")
    return ("collie's fp16 and bf16 hooks on PyTorch's DDP over collie and over Gloo: within "
            f"{worst['fp16']:.1e} and {worst['bf16']:.1e} of PyTorch's hooks over Gloo")


def train_pair(group, hook, steps=5):
    """Two models of one architecture (buckets of the same sizes), each its
    own DDP with `hook` on the same group, in one backward pass: a GAN's
    generator step is so. Their losses differ, so do their gradients."""
    torch.manual_seed(0)
    models = [Branchy(), Branchy()]
    ddps = [torch.nn.parallel.DistributedDataParallel(m, process_group=group,
                                                      find_unused_parameters=True)
            for m in models]
    for d in ddps:
        d.register_comm_hook(*hook(group))
    opt = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddps[0](x), y)
        (loss + torch.nn.functional.mse_loss(ddps[1](x), -2 * y)).backward()
        opt.step()
    return [p.detach().clone() for m in models for p in m.parameters()]


def case_compress_hooks_two_models():
    """collie's fp16 hook on two DDP models that reduce in the same backward
    pass over one collie group, against PyTorch's hook over Gloo: each
    bucket in flight has a compressed buffer of its own (they shared one
    when their buckets had the same index and size), and the hook pickles
    by name as PyTorch's do."""
    import pickle
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    for h in (collie.distributed.fp16_compress_hook, collie.distributed.bf16_compress_hook):
        check(pickle.loads(pickle.dumps(h)) is h, f"{h.__name__} does not pickle by name")
    group = collie.distributed.backend_of(None)
    group.__dict__.pop("_hook_scratch", None)
    ours = train_pair(None, lambda g: (g, collie.distributed.fp16_compress_hook))
    theirs = train_pair(GLOO, lambda g: (g, default_hooks.fp16_compress_hook))
    worst = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    check(worst <= HOOK_TOLERANCE["fp16"],
          f"two models with collie's fp16 hook: {worst} from PyTorch's over Gloo")
    # Whether both models' buckets are in flight at once is PyTorch's
    # timing (on 2.15 and 1.13 they were, and a shared buffer put them 0.09
    # off; on 2.1 not): the result is what is checked.
    kept = group.__dict__.get("_hook_scratch", {})
    check(not any(busy for pool in kept.values() for _, busy in pool),
          "a compressed buffer still marked in flight after the steps")
    return (f"two models in one backward: within {worst:.1e} of PyTorch's hook over Gloo "
            f"({sum(map(len, kept.values()))} compressed buffers for {len(kept)} buckets)")


def in_collie_memory(t):
    """Whether t's first byte lies in collie's communication memory: a
    mapping of a memfd named collie-buf (comm/shm/region.cc), read from
    /proc/self/maps, not from collie."""
    addr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return any("collie-buf" in x for x in fields[5:])
    return False


def wide():
    # Its one bucket (52 KiB) takes shm's in-place all-reduce (from 32 KiB).
    return torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 4))


def case_ddp_comm_memory():
    """PyTorch's DDP over collie allocates its buckets in collie's memory
    where PyTorch asks its backend for memory (2.15; not 1.13, 2.1): on shm every
    gradient (a view of its bucket) lies in a collie-buf mapping, and the
    parameters equal those of the same over Gloo. DDP_DISABLE_COMM_MEM=1
    keeps PyTorch's own memory. Where the module cannot be built, a warning
    says so and DDP keeps PyTorch's memory."""
    import importlib.util
    import tempfile
    import warnings
    from collie import _comm_memory
    group = collie.distributed.backend_of()
    if not _comm_memory.supported():
        check(group._memory is None, "a memory backend on a PyTorch whose DDP cannot use it")
        train(None, model=wide, gradient_as_bucket_view=True)
        check(not any(in_collie_memory(g) for g in train.grads),
              "DDP's buckets in collie's memory on a PyTorch without the hook")
        return f"not offered: PyTorch {torch.__version__}'s DDP asks no backend for memory"
    check(_comm_memory._failed is None and group._memory is not None,
          f"no memory backend: its module could not be built ({_comm_memory._failed})")
    check(os.environ.get("DDP_DISABLE_COMM_MEM") == "0",
          f"DDP_DISABLE_COMM_MEM is {os.environ.get('DDP_DISABLE_COMM_MEM')!r}, not 0, after "
          "init_process_group('collie')")
    shm = group.comm.backend == "shm"
    said = []
    for disable in ("0", "1"):
        os.environ["DDP_DISABLE_COMM_MEM"] = disable
        try:
            for model in (Branchy, wide):
                kw = dict(model=model, gradient_as_bucket_view=True,
                          find_unused_parameters=model is Branchy)
                before = _comm_memory.allocations()
                ours = train(None, **kw)
                made = _comm_memory.allocations() - before
                inside = [in_collie_memory(g) for g in train.grads]
                theirs = train(GLOO, **kw)
                for a, b in zip(ours, theirs):
                    diff = (a - b).abs().max().item()
                    check(diff <= 1e-5, f"DDP_DISABLE_COMM_MEM={disable}, {model.__name__}: "
                                        f"collie and Gloo differ by {diff}")
                # At construction, and again where DDP rebuilds its buckets
                # after the first step (not with find_unused_parameters).
                check((made >= 1) == (disable == "0"),
                      f"DDP_DISABLE_COMM_MEM={disable}, {model.__name__}: {made} buckets "
                      "allocated in collie's memory")
                want = shm and disable == "0"
                check(all(x == want for x in inside),
                      f"DDP_DISABLE_COMM_MEM={disable}, {model.__name__}: {sum(inside)} of "
                      f"{len(inside)} gradients in collie's memory, want "
                      f"{'all' if want else 'none'} (backend {group.comm.backend})")
        finally:
            os.environ["DDP_DISABLE_COMM_MEM"] = "0"
        said.append(f"DDP_DISABLE_COMM_MEM={disable}: gradients in collie's memory "
                    f"{'yes' if shm and disable == '0' else 'no'}")
    # A group whose communicator has closed gives PyTorch's memory; what it
    # gave before stays good.
    other = dist.new_group(backend="collie")
    cpu = torch.device("cpu")
    kept = other._memory.allocate_tensor(1000, dtype=torch.float64, device=cpu)
    check(in_collie_memory(kept) == shm, "a bucket of a live group outside collie's memory")
    other.comm.close()
    before = _comm_memory.allocations()
    late = other._memory.allocate_tensor(1000, dtype=torch.float64, device=cpu)
    check(not in_collie_memory(late) and _comm_memory.allocations() == before,
          "a bucket in collie's memory through a closed communicator")
    kept.fill_(2.5)
    check(float(kept.sum()) == 2500.0, "memory given before the close is not usable after it")
    del kept, late, other
    # A build that fails (no compiler here): a warning, once; no backend.
    spec = importlib.util.spec_from_file_location("collie._comm_memory_probe",
                                                  _comm_memory.__file__)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    saved = {k: os.environ.get(k) for k in ("CXX", "COLLIE_TORCH_EXT_CACHE")}
    with tempfile.TemporaryDirectory() as cache, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        os.environ.update(CXX="false", COLLIE_TORCH_EXT_CACHE=cache)
        try:
            first = probe.backend(group.comm, RANK, WORLD)
            second = probe.backend(group.comm, RANK, WORLD)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    told = [str(w.message) for w in seen if "could not be built" in str(w.message)]
    check(first is None and second is None, "a backend although its module could not be built")
    check(len(told) == 1, f"{len(told)} warnings of the failed build, want 1: {told}")
    return "; ".join(said) + "; a failed build warned once"


def case_bad_input():
    errors = (RuntimeError,) + ((dist.DistError,) if TORCH2 else ())
    # A bitwise op where collie has none (a reduce-scatter), and on floats:
    # refused, naming the op (its repr was only an address) or the dtype.
    for call, name in ((lambda: dist.reduce_scatter_tensor(
                            torch.ones(2, dtype=torch.int32), torch.ones(2 * WORLD, dtype=torch.int32),
                            op=dist.ReduceOp.BAND), "reduce op BAND"),
                       (lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR),
                        "bitwise op on torch.float32")):
        try:
            call()
            raise Failed(f"{name}: no error")
        except errors as e:
            check(name in str(e), f"the error does not say {name}: {e}")
    # PyTorch's split_group splits C++ backends, which collie's Python group
    # has none of: PyTorch's own refusal (it raised AttributeError reading
    # supports_splitting; found in an edge-case hunt against Gloo).
    if hasattr(dist, "split_group"):
        try:
            dist.split_group(split_ranks=[list(range(WORLD))])
            raise Failed("split_group: no error")
        except RuntimeError as e:
            check("does not support splitting" in str(e), f"split_group: {e}")
    # A dtype collie does not move, a device it does not serve: refused at
    # the call, naming the op, the rank and the reason.
    for bad, why in ((torch.ones(3, dtype=torch.int16), "torch.int16"),
                     (torch.ones(3, device="meta"), "meta tensors")):
        try:
            dist.all_reduce(bad)
            raise Failed(f"{why}: no error")
        except errors as e:
            check(f"all_reduce on rank {RANK}" in str(e) and why in str(e),
                  f"the error does not name the op, rank and {why}: {e}")
    # Shapes that differ across ranks: an error on every rank, naming them.
    t = torch.ones(4 + RANK)
    try:
        dist.all_reduce(t)
        raise Failed("differing shapes: no error")
    except errors as e:
        msg = str(e)
        check("rank" in msg and "allreduce" in msg, f"the error names no op and rank: {msg}")
    return f"refused: {msg[:120]}"


def case_layouts_bitwise_in_place():
    """What Gloo takes and collie refused (found in an edge-case hunt
    against Gloo), against serial references: tensors that are not
    contiguous (transposed, channels_last, a strided view, whose other
    elements stay untouched) in all_reduce, broadcast, reduce, all_gather,
    reduce_scatter_tensor and recv, each rank's elements met by their
    logical place; BAND, BOR and BXOR on integer and bool tensors in
    all_reduce and reduce; all_to_all_single in place."""
    def base(r, dtype=torch.float32):
        return (torch.arange(24, dtype=torch.float64).reshape(4, 6) * (r + 1) + r).to(dtype)
    total = sum(base(r) for r in range(WORLD))
    t = base(RANK).t()  # transposed
    dist.all_reduce(t)
    exact(t, total.t(), "all_reduce of a transposed tensor")
    img = base(RANK).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    dist.all_reduce(img)
    exact(img, total.reshape(1, 2, 3, 4), "all_reduce of a channels_last tensor")
    big = torch.zeros(48)
    view = big[::2]
    view.copy_(base(RANK).reshape(-1))
    dist.all_reduce(view)
    exact(big[::2], total.reshape(-1), "all_reduce of a strided view")
    exact(big[1::2], torch.zeros(24), "the elements between a strided view's")
    root = WORLD - 1
    t = base(RANK).t()
    dist.broadcast(t, src=root)
    exact(t, base(root).t(), "broadcast of a transposed tensor")
    t = base(RANK).t()
    dist.reduce(t, dst=root)
    if RANK == root:
        exact(t, total.t(), "reduce of a transposed tensor")
    outs = [torch.zeros(6, 4) for _ in range(WORLD)]
    dist.all_gather(outs, base(RANK).t())
    for r in range(WORLD):
        exact(outs[r], base(r).t(), f"all_gather of transposed tensors, rank {r}'s")
    out = torch.zeros(4, 6).t()
    dist.reduce_scatter_tensor(out, torch.cat([base(RANK).t().contiguous()] * WORLD))
    exact(out, total.t(), "reduce_scatter_tensor into a transposed output")
    if WORLD >= 2 and RANK in (0, 1):
        if RANK == 0:
            dist.send(base(7).t(), dst=1)
        else:
            got = torch.zeros(4, 6).t()
            dist.recv(got, src=0)
            exact(got, base(7).t(), "recv into a transposed tensor")
    bits = lambda r, dtype: torch.tensor([0b1011 * (r + 1), 0xF0F0 ^ r, -1 - r, r * 7],  # noqa: E731
                                         dtype=torch.int64).to(dtype)
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.int8):
        for name, fold in (("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or),
                           ("BXOR", torch.bitwise_xor)):
            want = bits(0, dtype)
            for r in range(1, WORLD):
                want = fold(want, bits(r, dtype))
            t = bits(RANK, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            exact(t, want, f"all_reduce {name} {dtype}")
            t = bits(RANK, dtype)
            dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, name))
            exact(t, want if RANK == root else bits(RANK, dtype), f"reduce {name} {dtype}")
    flags = torch.tensor([True, RANK % 2 == 0, RANK == 0, False])
    for name, want in (("BAND", [True, WORLD == 1, WORLD == 1, False]),
                       ("BOR", [True, True, True, False])):
        t = flags.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        exact(t, torch.tensor(want), f"all_reduce {name} bool")
    buf = torch.arange(2 * WORLD, dtype=torch.float32) + 100 * RANK
    dist.all_to_all_single(buf, buf)
    want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2, dtype=torch.float32) + 100 * r
                      for r in range(WORLD)])
    exact(buf, want, "all_to_all_single in place")
    return ("transposed, channels_last and strided tensors; BAND, BOR, BXOR on integers and "
            "bool; all_to_all_single in place")


def case_collie_ddp_on_the_backend():
    """collie's own DDP in a job whose torch.distributed runs on collie: its
    default communicator is the backend's (no second rendezvous), and its
    gradients are the average (a known answer)."""
    import collie
    import collie.torch as ct
    group = collie.distributed.backend_of()
    check(collie.default_communicator() is group.comm,
          "collie.default_communicator() is not the backend's communicator")
    torch.manual_seed(1)
    ddp = ct.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
    ddp(torch.full((2, 4), float(RANK + 1))).sum().backward()
    want = torch.full((1, 4), 2 * (WORLD + 1) / 2)
    exact(ddp.module.weight.grad, want, "collie's DDP on the backend's communicator")
    ddp.close()
    return "one communicator for both; the average gradient"


CASES = {"all_reduce": case_all_reduce, "all_reduce_shortcut": case_all_reduce_shortcut,
         "int8_and_bool": case_int8_and_bool,
         "collie_ddp": case_collie_ddp_on_the_backend, "async": case_async,
         "future_values": case_future_values,
         "layouts_bitwise_in_place": case_layouts_bitwise_in_place,
         "coalesced_and_broadcast": case_coalesced_and_broadcast,
         "gather_family": case_gather_family, "reduce_family": case_reduce_family,
         "objects": case_objects,
         "point_to_point": case_point_to_point, "all_to_all": case_all_to_all,
         "monitored_barrier": case_monitored_barrier, "launcher_env": case_launcher_env, "pytorch_ddp": case_pytorch_ddp,
         "ddp_comm_memory": case_ddp_comm_memory, "collie_compress_hooks": case_collie_compress_hooks,
         "compress_hooks_two_models": case_compress_hooks_two_models,
         "bad_input": case_bad_input}


def main():
    check_cases.run(CASES, sys.argv[1:] or list(CASES), Failed, RANK, WORLD, group=GLOO)


if __name__ == "__main__":
    os.environ.setdefault("COLLIE_TIMEOUT", "60")
    main()
