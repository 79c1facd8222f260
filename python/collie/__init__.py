"""collie for Python: the communicator, and (collie.torch) a drop-in
DistributedDataParallel for PyTorch.

    import collie
    comm = collie.connect()            # rank, size, rendezvous: the launcher's variables
    comm.allreduce(t, op="avg")        # t: a torch tensor or any C-contiguous buffer

Launch with collie-run, torchrun, mpirun or srun, or from Python with
collie.spawn(fn, nprocs). Errors are collie.Error, whose `code` says what kind
("peer_lost", "timeout", "mismatch", "invalid_argument", ...).
"""
import atexit
import ctypes
import itertools
import threading
import weakref

from ._lib import Error, lib, check
from . import _lib
from .launch import ProcessFailed, spawn, start_processes  # noqa: F401

__all__ = ["Error", "Communicator", "Work", "ProcessFailed", "connect", "join",
           "default_communicator", "spawn", "start_processes"]

_TORCH_DTYPES = {"float32": _lib.F32, "float64": _lib.F64, "float16": _lib.F16,
                 "bfloat16": _lib.BF16, "int32": _lib.I32, "int64": _lib.I64, "uint8": _lib.U8,
                 "int8": _lib.I8}
_BUFFER_DTYPES = {"f": _lib.F32, "d": _lib.F64, "e": _lib.F16, "i": _lib.I32, "l": _lib.I64,
                  "q": _lib.I64, "B": _lib.U8, "b": _lib.I8, "?": _lib.U8}


_TORCH_DTYPE_CODES = {}  # torch dtype -> collie's code, filled as dtypes are met


def torch_dtype_code(dtype):
    """collie's code of a torch dtype, or None where collie does not move it.
    (Looked up by the dtype object: str(dtype) took a tenth of a small
    op's time through the torch.distributed backend.)"""
    code = _TORCH_DTYPE_CODES.get(dtype)
    if code is None:
        code = _TORCH_DTYPES.get(str(dtype).replace("torch.", ""))
        if code is not None:
            _TORCH_DTYPE_CODES[dtype] = code
    return code


def _holds_bools(x):
    """Whether x is a torch tensor, an array or a buffer of bools."""
    d = getattr(x, "dtype", None)
    if d is None:
        try:
            return memoryview(x).format.lstrip("@=<>") == "?"  # ctypes c_bool arrays: "<?"
        except TypeError:
            return False
    return d not in _TORCH_DTYPE_CODES and str(d) in ("torch.bool", "bool")


# Bools travel as their bytes (u8, 0 or 1) and reduce as PyTorch's bool
# arithmetic does, holding 0 or 1: sum and max as or, prod and min as and
# (_op). (Gloo's sum of bools holds the count.)
_BOOL_OPS = {"sum": "max", "max": "max", "prod": "min", "min": "min"}


def as_tensor(x):
    """A collie_tensor describing `x`: a torch tensor (contiguous), or a
    C-contiguous object with the buffer protocol (numpy array, bytearray)."""
    if hasattr(x, "data_ptr") and hasattr(x, "dtype"):  # torch.Tensor
        code = torch_dtype_code(x.dtype)
        if code is None and _holds_bools(x):
            code = _lib.U8
        if code is None:
            raise _lib.error("invalid_argument", f"collie does not move {x.dtype} tensors")
        if not x.is_contiguous():
            raise _lib.error("invalid_argument", "collie needs contiguous tensors: call .contiguous()")
        if x.is_cpu:
            return _lib.Tensor(x.data_ptr(), x.numel(), code, _lib.CPU, 0)
        dev = x.device
        return _lib.Tensor(x.data_ptr(), x.numel(), code,
                           _lib.CPU if dev.type == "cpu" else _lib.CUDA, dev.index or 0)
    view = memoryview(x)
    if not view.c_contiguous or view.readonly:
        raise _lib.error("invalid_argument", "collie needs a writable, C-contiguous buffer")
    fmt = view.format.lstrip("@=<")
    if fmt not in _BUFFER_DTYPES:
        raise _lib.error("invalid_argument", f"collie does not move buffers of format '{view.format}'")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view)) if view.nbytes else None
    return _lib.Tensor(addr, view.nbytes // view.itemsize, _BUFFER_DTYPES[fmt], _lib.CPU, 0)


# Completion callbacks: one C trampoline for every op (a ctypes callback
# must outlive each call into it), finding the Python function by key.
_callbacks = {}
_callback_keys = itertools.count(1)


_completions = None  # the threads that run completion functions (made at first use)
_completions_lock = threading.Lock()
_exiting = False  # set at exit (_close_at_exit): completions are no longer run

# What is still open at exit, closed before the interpreter finalizes: the
# DDP wrappers (their reducers) first, then the communicators. A collie
# thread that calls into Python once finalization has begun (a completion
# dispatched a moment after the program's last wait returned) is ended by
# Python with pthread_exit, and that forced unwind through collie's C++
# frames aborts the process ("terminate called without an active
# exception") after a job that had passed: CI saw it about once in 25 runs
# of the backend's checks. Closed here, every collie thread is joined
# while it may still take the GIL.
_open_wrappers = weakref.WeakSet()
_open_comms = weakref.WeakSet()


def _close_at_exit():
    global _exiting
    _exiting = True  # what completes while these close is not run (nobody waits)
    for group in (_open_wrappers, _open_comms):
        for obj in list(group):
            try:
                # An op still running would hold close() until a peer that
                # may be waiting for this process's exit joins it, or until
                # its deadline: the process is going, so end it now (its
                # peers are told this rank aborted).
                if group is _open_comms and obj.in_flight():
                    obj.abort("the process is exiting with this rank's operations in flight")
                obj.close()
            except Exception:  # noqa: BLE001 - at exit: nobody to raise to
                pass


atexit.register(_close_at_exit)


def _dispatch(user, status, message):
    """On collie's continuation thread: hands the op's completion function
    to a thread of its own pool. Never runs it here: a completion that
    fulfils a torch Future runs the Future's callbacks, which may issue
    another op and wait for it (PyTorch's PowerSGD hook does), and that
    op's completion needs this thread."""
    entry = _callbacks.pop(user, None)
    if entry is None or _exiting:
        return
    fn, work = entry
    err = None if status == _lib.OK else _lib.error(
        _lib.CODES.get(status, "internal"), (message or b"").decode(errors="replace"))
    global _completions
    if _completions is None:
        with _completions_lock:
            if _completions is None:
                from concurrent.futures import ThreadPoolExecutor
                # A completion that waits holds its thread; the pool grows
                # (to this bound) instead of stalling the others.
                _completions = ThreadPoolExecutor(max_workers=64,
                                                  thread_name_prefix="collie-completion")
    try:
        _completions.submit(_run_completion, fn, err, work)
    except RuntimeError:  # the pool has shut down: the interpreter is exiting
        pass


def _run_completion(fn, err, work):  # noqa: ARG001 - work: alive (its buffers too) until fn has run
    try:
        fn(err)
    except Exception:  # noqa: BLE001 - nobody to raise to on this thread
        import traceback
        traceback.print_exc()


_DISPATCH = _lib.WORK_CALLBACK(_dispatch)


def _counts(counts, numel, n):
    """A ctypes array of n element counts; None: equal blocks of numel."""
    if counts is None:
        counts = [numel // n] * n
    counts = list(counts)
    if len(counts) != n:
        raise _lib.error("invalid_argument",
                         f"alltoall: {len(counts)} counts given; one per rank ({n}) is needed")
    return (ctypes.c_size_t * n)(*counts)


def _value_or_raise(fut):
    """fut's value, or the error it holds as its value raised (see
    Work.get_future; collie.distributed's Work does the same)."""
    value = fut.value()
    if isinstance(value, BaseException):
        raise value
    return value


class Work:
    """An operation in flight: wait() for it (raises collie.Error if it
    failed), is_completed() without waiting, get_future() for a
    torch.futures.Future (PyTorch's Work.get_future()). Keeps its buffers
    alive."""

    def __init__(self, handle, keep, result=()):
        self._h = handle
        self._keep = keep
        self._result = list(result)

    def wait(self, timeout=None):
        if timeout is None:
            check(lib.collie_work_wait(self._h))
        else:
            if hasattr(timeout, "total_seconds"):  # a datetime.timedelta, as PyTorch's
                timeout = timeout.total_seconds()
            check(lib.collie_work_wait_for(self._h, float(timeout)))
        return True

    def is_completed(self):
        return check(lib.collie_work_query(self._h)) != _lib.IN_PROGRESS

    def status(self):
        """(ended, error) without waiting: (False, None) while it runs,
        (True, None) once it has ended well, (True, its collie.Error)."""
        st = lib.collie_work_query(self._h)
        if st == _lib.IN_PROGRESS:
            return False, None
        try:
            check(st)
        except Error as e:
            return True, e
        return True, None

    def result(self):
        """The op's output tensors (PyTorch's Work.result())."""
        return list(self._result)

    def get_future(self):
        """A torch.futures.Future that completes when the op does, with its
        output tensors as the value (as PyTorch's Work.get_future()), or
        with its error: PyTorch's DDP comm hooks return it and chain on it
        with then(). A thread waits for the op on the future's behalf."""
        import torch
        fut = torch.futures.Future()
        # The error as the value, raised by then(): a Python Future's
        # set_exception keeps the exception as its value, which PyTorch's
        # C++ (its DDP's reducer, given this future by a comm hook) read as
        # the result. then() records a raised error as the future's error.
        self.on_complete(lambda err: fut.set_result(self.result() if err is None else err))
        return fut.then(_value_or_raise)

    def on_complete(self, fn):
        """Calls fn(None) once the op has ended well, fn(error) if it
        failed: on a thread of collie's completion pool (never the
        communicator's continuation thread: see _dispatch). The Work (and
        its buffers) stays alive until then."""
        key = next(_callback_keys)
        _callbacks[key] = (fn, self)  # self: kept alive until fn has run
        try:
            check(lib.collie_work_on_complete(self._h, _DISPATCH, key))
        except BaseException:
            _callbacks.pop(key, None)
            raise

    def __del__(self):
        if getattr(self, "_h", None):
            lib.collie_work_free(self._h)
            self._h = None


def _bools_match(x, out, what):
    """Bools and bytes are both u8 to collie, which cannot tell them apart:
    refused mixed, so that no bool tensor comes to hold a 2 or a 7."""
    if _holds_bools(x) != _holds_bools(out):
        raise _lib.error("invalid_argument", f"{what} of bools into another dtype, or of another "
                         "dtype into bools: input and output must both be bool")


def _op(op, x=None, out=None):
    """collie's code of op for a reduction of x into out (bools: see
    _BOOL_OPS; bools and bytes are not mixed)."""
    if op not in _lib.OPS:
        raise _lib.error("invalid_argument", f"unknown op '{op}': sum avg min max prod")
    if out is not None:
        _bools_match(x, out, "a reduction")
    if x is not None and _holds_bools(x):
        if op not in _BOOL_OPS:
            raise _lib.error("invalid_argument", f"{op} is not defined on bool tensors (sum and "
                             "max reduce them as or, prod and min as and)")
        op = _BOOL_OPS[op]
    return _lib.OPS[op]


class Communicator:
    """collie's communicator: every rank of the job calls the same
    collectives in the same order. async_op=True returns a Work."""

    # Whether it joined a running job and its first DistributedDataParallel
    # has yet to take the survivors' hand-off (collie.torch's reform()).
    _handoff_pending = False

    def __init__(self, handle, owned=True):
        self._h = ctypes.c_void_p(handle)
        self._owned = owned
        self._works = weakref.WeakSet()  # the async ops handed out, while anyone holds them
        # Called as it closes: what holds the handle outside Python lets go
        # (collie.distributed's memory backend for PyTorch's DDP).
        self._on_close = []
        if owned:
            _open_comms.add(self)

    def in_flight(self):
        """Whether an async op of this communicator that someone still
        holds (a Work, or its on_complete callback) has not ended."""
        return any(not w.is_completed() for w in list(self._works))

    @property
    def handle(self):
        return self._h

    @property
    def rank(self):
        r = ctypes.c_int()
        check(lib.collie_comm_rank(self._h, ctypes.byref(r)))
        return r.value

    @property
    def size(self):
        n = ctypes.c_int()
        check(lib.collie_comm_size(self._h, ctypes.byref(n)))
        return n.value

    @property
    def joined(self):
        """True when this communicator was made by joining a running job
        (collie.join(), or collie.connect() under COLLIE_JOIN=1, as
        collie-run --elastic starts a replacement); False for a grow's
        survivors and every other communicator."""
        j = ctypes.c_int()
        check(lib.collie_comm_joined(self._h, ctypes.byref(j)))
        return bool(j.value)

    @property
    def backend(self):
        name = ctypes.c_char_p()
        check(lib.collie_comm_backend(self._h, ctypes.byref(name)))
        return name.value.decode()

    def _run(self, start, async_op, keep, result=()):
        if not async_op:
            check(start(None))
            return None
        w = ctypes.c_void_p()
        check(start(ctypes.byref(w)))
        work = Work(w, keep, result)
        self._works.add(work)
        return work

    def allreduce(self, x, op="sum", async_op=False, out=None):
        tin = as_tensor(x)
        tout = as_tensor(out) if out is not None else tin
        return self._run(lambda w: lib.collie_comm_allreduce(self._h, tin, tout, _op(op, x, out),
                                                             w),
                         async_op, (x, out), [x if out is None else out])

    def broadcast(self, x, root=0, async_op=False):
        t = as_tensor(x)
        return self._run(lambda w: lib.collie_comm_broadcast(self._h, t, root, w), async_op, x,
                         [x])

    def allgather(self, x, out, async_op=False):
        tin, tout = as_tensor(x), as_tensor(out)
        _bools_match(x, out, "an all-gather")
        return self._run(lambda w: lib.collie_comm_allgather(self._h, tin, tout, w), async_op,
                         (x, out), [out])

    def reduce_scatter(self, x, out, op="sum", async_op=False):
        tin, tout = as_tensor(x), as_tensor(out)
        return self._run(lambda w: lib.collie_comm_reduce_scatter(self._h, tin, tout,
                                                                   _op(op, x, out), w),
                         async_op, (x, out), [out])

    def alltoall(self, x, out, send_counts=None, recv_counts=None, async_op=False):
        """Block j of x goes to rank j; block q of out comes from rank q.
        Equal blocks (size() of them), or send_counts[j] elements to rank j
        and recv_counts[q] from rank q, packed in rank order."""
        tin, tout = as_tensor(x), as_tensor(out)
        _bools_match(x, out, "an all-to-all")
        if send_counts is None and recv_counts is None:
            return self._run(lambda w: lib.collie_comm_alltoall(self._h, tin, tout, w), async_op,
                             (x, out), [out])
        n = self.size
        sc = _counts(send_counts, tin.numel, n)
        rc = _counts(recv_counts, tout.numel, n)
        return self._run(lambda w: lib.collie_comm_alltoallv(self._h, tin, sc, tout, rc, w),
                         async_op, (x, out, sc, rc), [out])

    def barrier(self, async_op=False):
        return self._run(lambda w: lib.collie_comm_barrier(self._h, w), async_op, None)

    def send(self, x, peer, tag=0, async_op=False):
        t = as_tensor(x)
        return self._run(lambda w: lib.collie_comm_send(self._h, t, peer, tag, w), async_op, x)

    def recv(self, x, peer, tag=0, async_op=False):
        t = as_tensor(x)
        return self._run(lambda w: lib.collie_comm_recv(self._h, t, peer, tag, w), async_op, x,
                         [x])

    def split(self, color, key=0):
        out = ctypes.c_void_p()
        check(lib.collie_comm_split(self._h, color, key, ctypes.byref(out)))
        return Communicator(out.value) if out.value else None

    def shrink(self, exclude=(), wait=0.0):
        """After ranks are lost: a new communicator of the survivors, in the
        old order, numbered from 0 (collective over the survivors; ranks in
        `exclude` and those this rank saw die are left out at once, the
        others waited for up to `wait` seconds, 0: the smaller of the
        timeout and 10 s)."""
        out = ctypes.c_void_p()
        ex = (ctypes.c_int * max(len(exclude), 1))(*exclude)
        check(lib.collie_comm_shrink(self._h, ex, len(exclude), int(wait * 1000),
                                     ctypes.byref(out)))
        return Communicator(out.value)

    def grow(self, joiners, wait=0.0):
        """A new communicator of this one's ranks, numbered as here, and
        `joiners` processes that join the running job (collie.join(), or
        collie.connect() under COLLIE_JOIN=1, as collie-run --elastic
        restarts a lost rank), numbered after them in the order they came.
        Collective over this communicator; waits up to `wait` seconds (0:
        the timeout) for the joiners."""
        out = ctypes.c_void_p()
        check(lib.collie_comm_grow(self._h, joiners, int(wait * 1000), ctypes.byref(out)))
        return Communicator(out.value)

    def arrivals(self):
        """Which rank arrived last, and how long after the first, at the
        host collectives since the last call (collective: every rank calls
        it). A dict: "collectives" compared, per rank "last" (how many it
        arrived last at) and "median_late_ms", and the "summary" sentence
        ("rank 2 arrived last in 91 % of 1000 collectives, median 14 ms
        after the first; ..."), "" when nothing was compared."""
        n = self.size
        count = ctypes.c_uint64()
        last = (ctypes.c_uint64 * n)()
        late = (ctypes.c_double * n)()
        text = ctypes.create_string_buffer(4096)
        check(lib.collie_comm_arrivals(self._h, ctypes.byref(count), last, late, text,
                                       len(text)))
        return {"collectives": count.value, "last": list(last), "median_late_ms": list(late),
                "summary": text.value.decode()}

    def abort(self, reason="aborted from Python"):
        check(lib.collie_comm_abort(self._h, reason.encode()))

    def error(self):
        """The communicator's first failure as a collie.Error, or None."""
        try:
            check(lib.collie_comm_get_async_error(self._h))
        except Error as e:
            return e
        return None

    def close(self):
        for fn in getattr(self, "_on_close", ()):
            fn()
        self._on_close = []
        if self._owned and self._h:
            check(lib.collie_comm_destroy(self._h))
        self._h = None
        _open_comms.discard(self)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a destructor must not raise
            pass


def _options(master_addr, master_port, backend, timeout, secret):
    """The C ABI's options with what connect() and join() share set; every
    other field left to the launcher's variables."""
    o = _lib.CommOptions(ctypes.sizeof(_lib.CommOptions), _lib.STRUCT_TAG, -1, -1, None, -1, -1,
                         None, 0.0, -1, 0, None, -1, 0)
    if master_addr:
        o.master_addr = master_addr.encode()
    if master_port:
        o.master_port = master_port
    if backend:
        o.backend = backend.encode()
    if timeout:
        o.timeout_seconds = float(timeout)
    if secret:
        o.secret = secret.encode()
    return o


def connect(rank=None, world_size=None, master_addr=None, master_port=None, backend=None,
            timeout=None, secret=None, local_rank=None, local_world_size=None,
            deterministic=None):
    """Connects this process to the job. Everything left None comes from the
    launcher's variables (collie-run's, torchrun's, Open MPI's, SLURM's).
    local_rank and local_world_size say which ranks share this host (shm
    needs all of them on one): launchers that set no LOCAL_WORLD_SIZE, as
    Lightning's do not, leave collie to assume one host. deterministic=True
    (None: COLLIE_DETERMINISTIC): all-reduce and reduce-scatter sum in rank
    order, the same bits on every backend; set it alike on every rank."""
    o = _options(master_addr, master_port, backend, timeout, secret)
    if deterministic is not None:
        o.deterministic = int(bool(deterministic))
    if rank is not None:
        o.rank = rank
    if world_size is not None:
        o.world_size = world_size
    if local_rank is not None:
        o.local_rank = local_rank
    if local_world_size is not None:
        o.local_world_size = local_world_size
    h = ctypes.c_void_p()
    check(lib.collie_comm_connect(ctypes.byref(o), ctypes.byref(h)))
    comm = Communicator(h.value)
    # Under COLLIE_JOIN=1 the connect joined a running job (as join()):
    # the first DistributedDataParallel built on it takes the survivors'
    # hand-off (collie.torch's reform()).
    comm._handoff_pending = comm.joined
    return comm


def join(master_addr=None, master_port=None, timeout=None, secret=None, backend=None):
    """A process that joins a running job: waits (up to the timeout) until a
    communicator of the job grows by it (Communicator.grow), and returns its
    place there. The store and the secret come from the arguments or the
    launcher's variables, as for connect(); the rank and the world size from
    the grow. collie.connect() does this under COLLIE_JOIN=1."""
    o = _options(master_addr, master_port, backend, timeout, secret)
    h = ctypes.c_void_p()
    check(lib.collie_comm_join(ctypes.byref(o), ctypes.byref(h)))
    comm = Communicator(h.value)
    comm._handoff_pending = comm.joined  # True; see connect()
    return comm


_default = None
_default_lock = threading.Lock()


def default_communicator():
    """The process's job-wide communicator, connected on first use and kept
    until the process ends (PyTorch's default process group).
    DistributedDataParallel and the averagers use it when given no
    communicator; split it for subgroups.

    Its job: torch.distributed's, when the program has initialised it (the
    same ranks and world size, rendezvoused through PyTorch's store, however
    the ranks were started); else the launcher's variables (collie-run,
    torchrun, mpirun, srun, collie.spawn); with neither, a world of one,
    which collie says once on stderr."""
    global _default
    from ._torch_world import connect_through_torch, torch_world
    with _default_lock:
        world = torch_world()
        if _default is not None and _default.handle is not None:
            if world is not None and (world[0], world[1]) != (_default.rank, _default.size):
                raise _lib.error("invalid_argument", world_mismatch(_default, world))
            return _default
        if world is not None:
            # torch.distributed on collie's backend: its communicator is
            # this job's already (no second rendezvous, no second segment).
            group = _torch_default_group()
            if group is not None:
                from .distributed import backend_of
                mine = backend_of(group)
                if mine is not None:
                    _default = mine.comm
                    return _default
        _default = connect_through_torch() if world is not None else connect()
        return _default


def _torch_default_group():
    try:
        import torch.distributed as dist
        return dist.distributed_c10d._get_default_group()
    except Exception:  # noqa: BLE001 - no default group
        return None


def world_mismatch(comm, world):
    """The message for a collie communicator whose world is not
    torch.distributed's."""
    return (f"collie's communicator is rank {comm.rank} of {comm.size} but torch.distributed "
            f"says this process is rank {world[0]} of {world[1]}: the two would reduce over "
            "different ranks. collie's default communicator follows torch.distributed when "
            "it is initialised before collie's first use; connect collie after "
            "torch.distributed.init_process_group, or launch both from the same variables "
            "(collie-run, torchrun, mpirun)")
