"""The backend's Work and how its ops run (collie.distributed's plumbing):
a PyTorch Work over collie's op (_Work: wait with a timeout, is_completed,
get_future, which PyTorch's DDP chains its hooks on), whether an op runs
asynchronously or the caller waits in the front (_async, _caller),
and the routing of CUDA tensors (_routed).
"""
import sys
import threading
import time

import torch
import torch.distributed as dist

from . import _lib
from . import _TORCH_DTYPE_CODES, _value_or_raise


_WorkBase = getattr(dist, "Work", None) or torch._C._distributed_c10d.Work
_from_future = torch._C._distributed_c10d._create_work_from_future


def _python_works_reach_cpp():
    """Whether PyTorch's C++ calls a Python Work's methods (its wait, its
    get_future) when it waits on a Work a Python group returned: it does
    where c10d has a Python trampoline for Work (PyTorch 2.x of late). The
    probe: a C++ wait on a registered Python Work."""
    try:
        seen = []

        class Probe(_WorkBase):
            def wait(self, timeout=None):
                seen.append(True)
                return True
        t = torch.zeros(1)
        torch._C._distributed_c10d._register_work(t, Probe())
        torch.ops._c10d_functional.wait_tensor(t)
        return bool(seen)
    except Exception:  # noqa: BLE001 - an older PyTorch: no trampoline
        return False


ASYNC = _python_works_reach_cpp()


class _Work(_WorkBase):
    """A PyTorch Work over collie's op: wait (with a timeout) raises the
    op's error (a DistBackendError naming the op and the rank),
    is_completed, result, exception, get_future (PyTorch's DDP chains its
    comm hooks on it). `after` runs once the op has ended well, before
    anyone sees its result (copies out of a staging buffer).

    Until the op ends, this object, collie's Work and the tensors are kept
    alive in _INFLIGHT: PyTorch may drop its last Python reference while its
    C++ still waits on it, and collie must not write tensors that were
    freed. A Work leaves it when it ends: waited for, asked
    is_completed(), its future's callback, or found ended when a later op
    is issued (_prune). The completion callback is registered only for a
    future: through collie's continuation thread and the completion pool
    it cost every op about 90 us on PyTorch 2.15 (8 B: 107 us against 17
    without it), waited for or not."""

    def __init__(self, work, result, after=None):
        super().__init__()
        self._work, self._result, self._after = work, list(result), after
        self._lock = threading.Lock()
        self._claimed = self._ended = work is None
        self._error = None
        self._futures = []
        self._hooked = False
        if work is not None:
            _prune()
            with _INFLIGHT_LOCK:
                _INFLIGHT.add(self)

    def _end(self, err):
        """The op has ended (err: its error, or None): runs `after`, then
        marks this Work ended and fulfils its futures, once. Whoever comes
        first: a waiter on its own thread (no hand-off to the completion
        pool on the blocking path: that hop was most of a small op's
        time) or the completion pool."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        if err is None and self._after is not None:
            try:
                self._after()
            except Exception as e:  # noqa: BLE001 - reported as the op's error
                err = e
        with self._lock:
            self._ended, self._error = True, err
            futures, self._futures = self._futures, []
        with _INFLIGHT_LOCK:
            _INFLIGHT.discard(self)
        for fut in futures:
            self._fulfil(fut)

    def _fulfil(self, fut):
        # The error as the value: get_future's then() raises it.
        fut.set_result(self._result if self._error is None else self._error)

    def wait(self, timeout=None):
        if not self._ended:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            try:
                self._work.wait(seconds if seconds and seconds > 0 else None)
                self._end(None)
            except _lib.Error:
                ended, err = self._work.status()
                if ended:  # the op failed (not merely this wait's own timeout)
                    self._end(err)
                raise
            while not self._ended:  # the pool claimed it: its `after` is running
                time.sleep(0.0001)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if not self._ended:
            ended, err = self._work.status()
            if ended:
                self._end(err)
        return self._ended

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        """A future of the result that fails, for C++ as for Python, when
        the op does. A Python Future's set_exception only stores the
        exception as its value, to be raised when Python asks: PyTorch's
        C++ (its DDP's reducer) then read it as a result and crashed
        (parseCppCommHookResult on an exception: SIGSEGV on every survivor
        of a killed rank). So the future handed out is a then() of the one
        this Work fulfils, whose callback raises the op's error: then()
        records that as the future's error in C++."""
        fut = _future_for(self._result)
        hook = False
        with self._lock:
            if not self._ended:
                self._futures.append(fut)
                hook, self._hooked = not self._hooked, True
            else:
                self._fulfil(fut)
        if hook:
            self._work.on_complete(self._end)
        return fut.then(_value_or_raise)


_INFLIGHT = set()  # the _Works whose ops may still run (see _Work)
_INFLIGHT_LOCK = threading.Lock()


def _prune():
    """Ends the in-flight Works whose ops have ended (at each new op)."""
    if not _INFLIGHT:
        return
    with _INFLIGHT_LOCK:
        works = list(_INFLIGHT)
    for w in works:
        ended, err = w._work.status()
        if ended:
            w._end(err)


def _future_for(result):
    """A torch Future to hold `result`: one of the CUDA devices its tensors
    are on, if any (PyTorch's CUDA-aware future, as its NCCL group's)."""
    devices = {t.device for t in _tensors(result) if t.device.type == "cuda"}
    if devices:
        return torch.futures.Future(devices=sorted(devices, key=lambda d: d.index))
    return torch.futures.Future()


def _done_work(work, result, after=None):
    """Where PyTorch's C++ cannot wait on a Python Work (PyTorch 1.13 to
    2.1), an op that ended in the call: PyTorch gets a Work already
    complete."""
    if work is not None:
        work.wait()
    if after is not None:
        after()
    fut = _future_for(result)
    fut.set_result(list(result))
    return _from_future(fut)


def _pending_work(work, result, after=None):
    """Where PyTorch's C++ cannot wait on a Python Work (PyTorch 1.13 to
    2.1), an op issued async: PyTorch's own Work over a future that collie's
    completion fulfils (after `after` has run), so that the caller (PyTorch's
    DDP reducing a bucket while backward runs) goes on at once. A failed op
    fails the future, for C++ as for Python (the then() of _Work.get_future:
    its callback raises the op's error)."""
    fut = _future_for(result)

    def done(err):
        if err is None and after is not None:
            try:
                after()
            except Exception as e:  # noqa: BLE001 - reported as the op's error
                err = e
        fut.set_result(list(result) if err is None else err)
    work.on_complete(done)  # keeps the Work, its buffers and `result` alive until then
    return _from_future(fut.then(_value_or_raise))


def _coalesced(method, outputs, inputs, opts):
    """The *_coalesced form of `method`: one op per pair, all waited for."""
    works = [method(o, i, opts) for o, i in zip(outputs, inputs)]
    for w in works:
        w.wait()
    return _make_work(None, outputs)


def _make_work(work, result, after=None):
    """The Work PyTorch gets for collie's `work`, or for an op that ran to
    its end in the call (work None: a blocking call, see _async), by who
    called the group's method (_caller)."""
    caller = getattr(_tls, "caller", None)
    if work is None:
        if after is not None:
            after()
        if caller == "waits":
            # torch.distributed's front waits for it and drops it: one ended
            # Work for all (making one took 1-3 us of an 8 B op's 9-13).
            return _ENDED
        return _Work(None, result) if ASYNC or caller == "async" else _done_work(None, result)
    if ASYNC or caller == "async":
        return _Work(work, result, after)
    if caller == "backward":
        return _pending_work(work, result, after)
    return _done_work(work, result, after)


_tls = threading.local()


def _async():
    """Whether the group's op in progress is issued async (async_op for
    collie's call). A blocking call runs on the calling thread where nothing
    else is queued: no hand-off to collie's executor and back (a third of a
    64 KiB all-reduce's time). Where PyTorch's C++ can wait on a Python Work
    (ASYNC), every op but those torch.distributed's front waits for at once;
    elsewhere (1.13 to 2.1) only those whose caller is known to take an
    async Work: the front with async_op=True (a Python Work, whose wait()
    raises the op's error) and PyTorch's DDP reducing a bucket from backward
    (_pending_work: C++ reads its future's value, which raises). Any other
    caller may be C++ that waits on the Work it gets, which there cannot
    call a Python Work's wait(), and whose FutureWrappingWork's wait() does
    not raise: it gets a Work of an op already ended (_done_work)."""
    caller = getattr(_tls, "caller", None)
    return caller != "waits" if ASYNC else caller in ("async", "backward")


def _caller(frame, name, tensor):
    """Who called the group's method `name` on `tensor` (its first),
    `frame` being its caller's frame: "waits" (torch.distributed's Python
    front, dist.all_reduce and the rest, with async_op=False: it waits for
    the op before it returns), "async" (the same with async_op=True, and
    isend and irecv: it hands the Work to the user), "backward" (an
    all_reduce of floating-point values from the autograd engine, with no
    Python caller or one in torch.autograd: PyTorch's DDP reducing a
    bucket), or None."""
    code = frame.f_code if frame is not None else None
    if code is not None and code.co_filename.endswith("distributed_c10d.py"):
        if code.co_name in ("isend", "irecv"):  # the Work goes to Python (batch_isend_irecv too)
            return "async"
        if "async_op" not in code.co_varnames:
            return None
        a = frame.f_locals.get("async_op")
        return "waits" if a is False else "async" if a is True else None
    # A bucket's gradients, not the reducer's int32 map of the parameters
    # used, which its C++ waits for with wait() (that raises nothing there).
    if (name == "allreduce" and tensor is not None and tensor.is_floating_point()
            and (code is None or _AUTOGRAD in code.co_filename.replace("\\", "/"))):
        return "backward"
    return None


_AUTOGRAD = "/torch/autograd/"


# collie's group is a ProcessGroup of its own, standing for every device.
# On PyTorch 2.15 Python may also derive from c10d's per-device Backend,
# which PyTorch then wraps in a ProcessGroup with a device table, but tried
# on 2026-11-28 that lost too much: its C++ does not hand alltoall_base or
# monitoredBarrier to Python ("Backend collie does not support
# all_to_all_single"), and an async op's Work was not completed after
# wait(). 2.1 has no Python constructor for it. So "cpu:collie,cuda:nccl"
# is served by the group itself: PyTorch makes the first device's group
# the whole group where that is a Python ProcessGroup, and collie's group
# hands the CUDA calls to PyTorch's NCCL group (_routed).


def _tensors(x):
    """The tensors in x, a tensor or (nested) lists and tuples of them."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _first_tensor(args):
    """The first tensor in args, or None; the usual ([t], opts) at once."""
    a = args[0] if args else None
    if type(a) is list and a:
        a = a[0]
    return a if isinstance(a, torch.Tensor) else next(_tensors(args), None)


def _routed(method, now=None):
    """A collective of the group that hands a call on CUDA tensors to
    PyTorch's ProcessGroupNCCL where the group was made with "cuda:nccl" in
    its backend string ("cpu:collie,cuda:nccl"); else collie serves it,
    CUDA tensors through collie's NCCL backend. `now(group, *args)`, where
    given, is the call's shortcut: its Work where it served the call, None
    where the general path is to."""
    name = method.__name__

    def call(self, *args, **kwargs):
        if now is not None and not kwargs:
            work = now(self, *args)
            if work is not None:
                return work
        t = _first_tensor(args)
        if t is not None and t.device.type == "cuda":
            other = self._cuda_group()
            if other is not None:
                return getattr(other, name)(*args, **kwargs)
        before = getattr(_tls, "caller", None)
        try:
            frame = sys._getframe(1)
        except ValueError:  # no Python frame: called from C++ on a thread of its own
            frame = None
        _tls.caller = _caller(frame, name, t)
        try:
            return method(self, *args, **kwargs)
        finally:
            _tls.caller = before
    call.__name__, call.__qualname__, call.__doc__ = name, method.__qualname__, method.__doc__
    return call


def _current_stream(device):
    """PyTorch's current stream on `device`, a cudaStream_t as an int.
    (torch.cuda.current_stream(device) took 10 us of an 8 B op's 40.)"""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


# An op ended in the call, its result nobody's (see _make_work).
_ENDED = _Work(None, []) if ASYNC else _done_work(None, [])


# torch.distributed's reduce ops collie has, with collie's names.
_OP_NAMES = tuple((value, name) for name, value in (
    ("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
    ("prod", dist.ReduceOp.PRODUCT), ("avg", getattr(dist.ReduceOp, "AVG", None)))
    if value is not None)

_ALLREDUCE = _lib.lib.collie_comm_allreduce
_OP_CODES = {hash(op): _lib.OPS[name] for op, name in _OP_NAMES}  # hash(ReduceOp): its RedOpType


def _allreduce_now(group, tensors, opts=None):
    """The backend's most frequent call, dist.all_reduce(t) with async_op
    False on one contiguous CPU tensor of a dtype met before, straight into
    collie's blocking C call: the general path's caller detection, checks
    and Work took 6-7 us of an 8 B op that takes collie 1 us. Where
    PyTorch's options say async_op (2.x of late: asyncOp) that is read;
    elsewhere the caller's frame is (_caller). None for any other call: the
    general path serves it, and raises whatever is wrong with it."""
    if type(tensors) is not list or len(tensors) != 1:
        return None
    t = tensors[0]
    waits = getattr(opts, "asyncOp", None)
    if waits or opts is None:  # asyncOp True: the caller keeps the Work
        return None
    code = _TORCH_DTYPE_CODES.get(t.dtype)
    op = _OP_CODES.get(hash(opts.reduceOp))
    if code is None or op is None or not t.is_cpu or not t.is_contiguous():
        return None
    if waits is None:  # PyTorch 1.13 to 2.6: who called (1: _routed's call, 2: its caller)
        try:
            if _caller(sys._getframe(2), "allreduce", t) != "waits":
                return None
        except ValueError:  # no Python frame there: C++ called (PyTorch's DDP)
            return None
    desc = _lib.Tensor(t.data_ptr(), t.numel(), code, _lib.CPU, 0)
    _lib.check(_ALLREDUCE(group._comm._h, desc, desc, op, None))
    return _ENDED
