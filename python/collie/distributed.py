"""collie as a torch.distributed backend: PyTorch's own DDP, dist.all_reduce
and whatever else is built on torch.distributed run their CPU collectives
on collie, with one line changed.

    import collie.distributed                    # registers "collie" (collie.torch does too)
    dist.init_process_group("collie")            # env://, tcp://, file://, store=... alike
    collie.distributed.init_process_group()      # the same, also under mpirun and srun

The backend is a Python ProcessGroup (PyTorch's c10d calls its methods from
its own collectives, its DDP's reducer included). It rendezvous through
the store PyTorch hands it, with PyTorch's rank and world size: no port or
variable of collie's. Each group (the default one, each new_group) is a
collie communicator of its own. The group's timeout is collie's deadline.
Errors are collie's, which are torch.distributed.DistBackendError (a
failure) or DistError (a misuse) where PyTorch has them, and name the op
and the rank.

On PyTorch 2.x CUDA tensors are served too: through collie's NCCL
backend for "collie", through PyTorch's ProcessGroupNCCL for
"cpu:collie,cuda:nccl" (see _routed). Served on CPU tensors: all_reduce (SUM, AVG, MIN, MAX, PRODUCT),
all_reduce_coalesced, broadcast, all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor, all_to_all, all_to_all_single
(even or uneven splits), reduce, gather, scatter, barrier, send and recv;
BAND, BOR and BXOR in all_reduce and reduce (gathered and folded); tensors
of any layout (through a contiguous copy).
monitored_barrier (PyTorch's dist.monitored_barrier where the group has
its memory backend for the CPU, 2.15 here; else the group's method: PyTorch
takes Gloo only on 1.13 and 2.1).
Refused, naming what is missing: the bitwise ops elsewhere, recv from
any source, split_group (PyTorch's refusal).
On a recent PyTorch (2.15 here) PyTorch's DDP over a collie group allocates its
host buckets in collie's memory, all-reduced in place on shm
(_comm_memory).
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

from . import _lib
from . import torch_dtype_code
from ._backend_work import (_OP_NAMES, _allreduce_now, _async, _coalesced, _current_stream,
                            _make_work, _routed)

from ._torch_hooks import bf16_compress_hook, fp16_compress_hook

__all__ = ["ProcessGroupCollie", "BACKEND", "backend_of", "init_process_group", "launcher_env",
           "fp16_compress_hook", "bf16_compress_hook"]

BACKEND = "collie"

def _refuse(what):
    return _lib.error("invalid_argument", f"the collie backend does not do {what}")


def _op_label(op):
    """PyTorch's name of a ReduceOp ("BAND"): its RedOpType's, where the
    ReduceOp object's own repr is only its address."""
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1]


def _op_name(op):
    """collie's name of a torch.distributed.ReduceOp."""
    for value, name in _OP_NAMES:
        if op == value:
            return name
    raise _refuse(f"reduce op {_op_label(op)} (it reduces with SUM, AVG, MIN, MAX and PRODUCT; "
                  "all_reduce and reduce also with BAND, BOR and BXOR)")


# The bitwise ops, which collie's reductions do not have: all_reduce and
# reduce gather every rank's tensor and fold it locally (as Gloo takes
# them, on integer and bool tensors).
_BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


_BITWISE_BY_HASH = {hash(getattr(dist.ReduceOp, name)): fold for name, fold in _BITWISE.items()}


def _bitwise(opts):
    """The fold of a bitwise op in opts (an options object or a ReduceOp),
    else None: by hash(ReduceOp), its RedOpType, as the all_reduce shortcut
    reads the op (no string on the common path)."""
    if opts is None:
        return None
    return _BITWISE_BY_HASH.get(hash(getattr(opts, "reduceOp", opts)))


def _overlap(a, b):
    """Whether tensors a and b may share a byte of memory."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _span(t):
    """[first, end) of the bytes t may touch: its own where it is
    contiguous, else its whole storage's."""
    if t.is_contiguous():
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _list(x):
    """A tensor or a list of them (the group's methods have both overloads)."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _reduce_op(opts):
    """The op of an options object, a ReduceOp, or None (SUM)."""
    if opts is None:
        return _op_name(dist.ReduceOp.SUM)
    return _op_name(getattr(opts, "reduceOp", opts))


def _unflatten(flat, tensors):
    """Copies consecutive pieces of `flat` into `tensors`, each its size."""
    at = 0
    for t in tensors:
        t.copy_(flat[at:at + t.numel()].view_as(t))
        at += t.numel()


def _torch_errors():
    """collie.Error's subclasses that are PyTorch's errors too: a failure
    of the communication (a peer lost, a deadline, an abort, the backend)
    is a torch.distributed.DistBackendError, a misuse (bad arguments,
    ranks that disagree) a DistError; on PyTorch without them (1.13),
    RuntimeError, which collie.Error already is. Installed for every
    collie error once collie.distributed (or collie.torch) is imported."""
    dist_error = getattr(dist, "DistError", None)
    backend_error = getattr(dist, "DistBackendError", dist_error)
    if dist_error is None:
        return None, None
    usage = type("DistError", (_lib.Error, dist_error), {"__module__": __name__, "__doc__": (
        "A collie.Error that is torch.distributed.DistError: a misuse or a mismatch.")})
    backend = type("DistBackendError", (_lib.Error, backend_error), {
        "__module__": __name__,
        "__doc__": "A collie.Error that is torch.distributed.DistBackendError: the communication "
                   "failed."})
    for code in _lib.CODES.values():
        _lib.ERROR_CLASSES[code] = usage if code in ("invalid_argument", "mismatch") else backend
    return usage, backend


DistError, DistBackendError = _torch_errors()


def backend_of(group=None):
    """`group` (the default group if None) if it is collie's, else None:
    its .comm is the collie.Communicator, its monitored_barrier collie's."""
    if group is None:
        try:
            group = dist.distributed_c10d._get_default_group()
        except Exception:  # noqa: BLE001 - no default group
            return None
    return group if isinstance(group, ProcessGroupCollie) else None


class ProcessGroupCollie(dist.ProcessGroup):
    """torch.distributed's process group over a collie communicator."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        from ._torch_world import connect_through_torch
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        self._comm = connect_through_torch(store=store, rank=rank, size=size,
                                           timeout=seconds or None,
                                           deterministic=_options["deterministic"])
        self._store = store
        self._timeout = seconds or 1800.0  # PyTorch's default group timeout
        self._monitored = 0  # monitored_barrier calls, for their store keys
        self._cuda = None  # PyTorch's NCCL group for "cuda:nccl" (False: collie's own)
        self._offer_memory()

    def _offer_memory(self):
        """PyTorch's DDP over this group allocates its host buckets in
        collie's communication memory (recent PyTorch; see
        _comm_memory): through a C++ backend registered as the group's
        default, for the CPU. The collectives stay this class's: PyTorch
        calls the Python methods of a Python group first; only what asks
        the C++ group for its CPU backend itself (functional collectives)
        reaches that backend, which has no collective."""
        from . import _comm_memory
        self._memory = _comm_memory.backend(self._comm, self.rank(), self.size())
        if self._memory is not None:
            custom = dist.ProcessGroup.BackendType.CUSTOM
            try:
                self._register_backend(torch.device("cpu"), custom, self._memory)
                self._set_default_backend(custom)
            except (RuntimeError, TypeError, AttributeError) as e:  # a PyTorch unlike 2.15's
                import warnings
                warnings.warn("collie: PyTorch's DDP keeps its buckets in PyTorch's memory: "
                              f"this PyTorch took no memory backend ({e})", RuntimeWarning)
                self._memory = None

    @property
    def comm(self):
        """The collie.Communicator under this group."""
        return self._comm

    def getBackendName(self):
        return BACKEND

    def _cuda_group(self):
        """PyTorch's ProcessGroupNCCL over this group's store, made at the
        first CUDA op, where the group's backend string names "cuda:nccl";
        None where collie serves CUDA tensors itself. Every rank makes it
        at the same op (the first on CUDA tensors), and NCCL's communicator
        is made at its first collective, as PyTorch's own groups do."""
        if self._cuda is None:
            world = getattr(dist.distributed_c10d, "_world", None)
            config = str(getattr(world, "pg_backend_config", {}).get(self, "")) if world else ""
            devices = dict(p.split(":", 1) for p in config.split(",") if ":" in p)
            name = devices.get("cuda", BACKEND).strip()
            if name == BACKEND:
                self._cuda = False
            elif name != "nccl":
                raise _lib.error("invalid_argument", f"the collie group on rank {self.rank()}: "
                                 f"backend \"{config}\" names cuda:{name}; collie hands CUDA "
                                 "tensors to nccl or serves them itself")
            else:
                nccl = dist.ProcessGroupNCCL
                opts = nccl.Options()
                opts._timeout = datetime.timedelta(seconds=self._timeout)
                self._cuda = nccl(dist.PrefixStore("collie/cuda:nccl/", self._store),
                                  self.rank(), self.size(), opts)
        return self._cuda or None

    def _tensor(self, t, what):
        """t, if collie can move it; else an error naming the op and rank.
        A CUDA tensor's op is ordered after PyTorch's current stream."""
        if t.is_cpu:
            pass
        elif t.device.type == "cuda":
            _lib.lib.collie_set_cuda_stream(_current_stream(t.device) or None)
        else:
            raise self._refused(what, f"{t.device} tensors (CPU and CUDA tensors only)")
        if torch_dtype_code(t.dtype) is None and t.dtype != torch.bool:
            raise self._refused(what, f"{t.dtype} tensors (it moves float32, float64, float16, "
                                "bfloat16, int32, int64, uint8, int8 and bool)")
        if not t.is_contiguous():
            raise self._refused(what, "a non-contiguous tensor")
        return t

    def _staged(self, t, what):
        """t checked (_tensor) and, where it is not contiguous (a
        transposed or channels_last tensor, a strided view), a contiguous
        copy to run the op on and the copy back into t once it has ended:
        (tensor, after). Each rank's elements meet by their logical place,
        whatever each rank's layout."""
        if t.is_contiguous():
            return self._tensor(t, what), None
        c = self._tensor(t.contiguous(), what)
        return c, lambda: t.copy_(c)

    def _bitwise_reduce(self, t, fold, what, root=None):
        """all_reduce (root None) or reduce with a bitwise op: every rank's
        tensor gathered, folded in rank order here, written into t (on the
        root only for reduce)."""
        if t.is_floating_point() or t.is_complex():
            raise self._refused(what, f"a bitwise op on {t.dtype} tensors (integer and bool "
                                "tensors only)")
        src, back = self._staged(t, what)
        flat = torch.empty(src.numel() * self.size(), dtype=src.dtype, device=src.device)

        def after():
            if root is not None and self.rank() != root:
                return
            parts = flat.view(self.size(), -1)
            acc = parts[0].clone()
            for p in parts[1:]:
                acc = fold(acc, p)
            src.copy_(acc.view_as(src))
            if back is not None:
                back()
        return _make_work(self._comm.allgather(src, flat, async_op=_async()), [t], after)

    def _one(self, tensors, what):
        if type(tensors) is list and len(tensors) == 1:  # the usual call, at once
            return tensors[0]
        tensors = _list(tensors)
        if len(tensors) != 1:
            raise self._refused(what, f"{len(tensors)} tensors in one call (one per call, as "
                                "Gloo's CPU collectives)")
        return tensors[0]

    def _one_per_rank(self, tensors, what, kind):
        """tensors, if it holds one per rank of the group; else an error."""
        if len(tensors) != self.size():
            raise _lib.error("invalid_argument", f"{what} on rank {self.rank()}: {len(tensors)} "
                             f"{kind} tensors for a group of {self.size()}")
        return tensors

    def _refused(self, what, why):
        return _lib.error("invalid_argument",
                          f"{what} on rank {self.rank()}: the collie backend does not take {why}")

    # PyTorch keeps a group's name in its per-device backends, which a
    # Python ProcessGroup has none of: "ProcessGroup name not set" where
    # DeviceMesh (FSDP2, DTensor) reads it. The group keeps its own.
    def _set_group_name(self, name):
        self._collie_group_name = name

    @property
    def group_name(self):
        return getattr(self, "_collie_group_name", "")

    # ---- collectives -------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        given = self._one(tensors, "all_reduce")
        fold = _bitwise(opts)
        if fold is not None:
            return self._bitwise_reduce(given, fold, "all_reduce")
        t, back = self._staged(given, "all_reduce")
        op = _reduce_op(opts)
        return _make_work(self._comm.allreduce(t, op=op, async_op=_async()), [given], back)
    allreduce = _routed(allreduce, now=_allreduce_now)  # dist.all_reduce(t): a shortcut

    @_routed
    def allreduce_coalesced(self, tensors, opts=None):
        tensors = _list(tensors)
        for t in tensors:
            self._tensor(t, "all_reduce_coalesced")
        op = _reduce_op(opts)
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)

        return _make_work(self._comm.allreduce(flat, op=op, async_op=_async()), tensors,
                          lambda: _unflatten(flat, tensors))

    @_routed
    def broadcast(self, tensors, opts):
        given = self._one(tensors, "broadcast")
        t, back = self._staged(given, "broadcast")
        root = opts if isinstance(opts, int) else opts.rootRank
        return _make_work(self._comm.broadcast(t, root=root, async_op=_async()), [given], back)

    @_routed
    def _allgather_base(self, output, input, opts=None):
        input = self._tensor(input.contiguous(), "all_gather_into_tensor")
        out, back = self._staged(output, "all_gather_into_tensor")
        # The future's value is each rank's piece of the output, as Gloo's.
        return _make_work(self._comm.allgather(input, out, async_op=_async()),
                          list(output.chunk(self.size())) if output.dim() else [output], back)

    @_routed
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return _coalesced(self._allgather_base, outputs, inputs, opts)

    @_routed
    def allgather(self, output_lists, inputs, opts=None):
        t = self._tensor(self._one(inputs, "all_gather").contiguous(), "all_gather")
        if output_lists and isinstance(output_lists[0], torch.Tensor):
            output_lists = [output_lists]  # allgather(outputs, input)
        outs = self._one_per_rank(self._one(output_lists, "all_gather"), "all_gather", "output")
        for o in outs:
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise _lib.error("invalid_argument", f"all_gather on rank {self.rank()}: an "
                                 f"output tensor of {o.numel()} {o.dtype} for an input of "
                                 f"{t.numel()} {t.dtype}")
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype, device=t.device)
        # The future's value is the list of outputs, as Gloo's (not nested).
        return _make_work(self._comm.allgather(t, flat, async_op=_async()), outs,
                          lambda: _unflatten(flat, outs))

    @_routed
    def _reduce_scatter_base(self, output, input, opts=None):
        input = self._tensor(input.contiguous(), "reduce_scatter_tensor")
        out, back = self._staged(output, "reduce_scatter_tensor")
        op = _reduce_op(opts)
        return _make_work(self._comm.reduce_scatter(input, out, op=op, async_op=_async()),
                          [output], back)

    @_routed
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return _coalesced(self._reduce_scatter_base, outputs, inputs, opts)

    @_routed
    def reduce_scatter(self, outputs, input_lists, opts=None):
        given = self._one(outputs, "reduce_scatter")
        out, back = self._staged(given, "reduce_scatter")
        if input_lists and isinstance(input_lists[0], torch.Tensor):
            input_lists = [input_lists]  # reduce_scatter(output, inputs)
        ins = self._one_per_rank(self._one(input_lists, "reduce_scatter"), "reduce_scatter",
                                 "input")
        flat = torch.cat([i.reshape(-1) for i in ins])
        op = _reduce_op(opts)
        return _make_work(self._comm.reduce_scatter(flat, out, op=op, async_op=_async()), [given],
                          back)

    @_routed
    def reduce(self, tensors, opts):
        given = self._one(tensors, "reduce")
        root = opts.rootRank
        fold = _bitwise(opts)
        if fold is not None:
            return self._bitwise_reduce(given, fold, "reduce", root)
        t, back = self._staged(given, "reduce")
        op = _reduce_op(opts)
        if self.rank() == root:
            return _make_work(self._comm.allreduce(t, op=op, async_op=_async()), [given], back)
        scratch = t.clone()  # every rank's result but the root's is left alone
        return _make_work(self._comm.allreduce(scratch, op=op, async_op=_async()), [given])

    @_routed
    def gather(self, output_lists, inputs, opts):
        t = self._tensor(self._one(inputs, "gather").contiguous(), "gather")
        root = opts.rootRank
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype, device=t.device)
        outs = (self._one_per_rank(output_lists[0], "gather", "output")
                if self.rank() == root else [])
        # The future's value: the root's outputs, as Gloo's (not nested).
        return _make_work(self._comm.allgather(t, flat, async_op=_async()),
                          outs if self.rank() == root else output_lists,
                          lambda: _unflatten(flat, outs))

    @_routed
    def scatter(self, outputs, input_lists, opts):
        out = self._one(outputs, "scatter")  # written by copy_: any layout
        self._tensor(out.contiguous(), "scatter")
        root = opts.rootRank
        flat = torch.empty(out.numel() * self.size(), dtype=out.dtype, device=out.device)
        if self.rank() == root:
            ins = self._one(input_lists, "scatter")
            torch.cat([i.reshape(-1) for i in ins], out=flat)

        def after():
            r = self.rank()
            out.copy_(flat[r * out.numel():(r + 1) * out.numel()].view_as(out))
        return _make_work(self._comm.broadcast(flat, root=root, async_op=_async()), [out], after)

    @_routed
    def barrier(self, opts=None):
        return _make_work(self._comm.barrier(async_op=_async()), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Gloo's monitored_barrier: rank 0 waits for every other rank's
        arrival and names those that have not come within `timeout` (the
        first, or with wait_all_ranks every one), then releases them; a
        rank not released in time names rank 0. Through the group's store,
        not the communicator, so that a failed one leaves it usable."""
        self._monitored += 1
        key = f"collie/monitored_barrier/{self._monitored}/"
        seconds = (timeout.total_seconds() if isinstance(timeout, datetime.timedelta)
                   else float(timeout) if timeout is not None else self._timeout)
        rank, n = self.rank(), self.size()
        what = f"monitored_barrier #{self._monitored} on rank {rank}"
        deadline = time.monotonic() + seconds
        if rank != 0:
            self._store.set(f"{key}arrived/{rank}", b"1")
            if not self._arrived(f"{key}released", deadline):
                raise _lib.error("timeout", f"{what}: rank 0 did not release it within "
                                 f"{seconds:g} s (rank 0 names the ranks that did not arrive)")
            return _make_work(None, [])
        missing = []
        for q in range(1, n):
            if not self._arrived(f"{key}arrived/{q}", deadline):
                missing.append(q)
                if not wait_all_ranks:
                    break
        if missing:
            ranks = "rank" + ("s " if len(missing) > 1 else " ") + ", ".join(map(str, missing))
            raise _lib.error("timeout", f"{what}: {ranks} did not arrive within {seconds:g} s")
        self._store.set(f"{key}released", b"1")
        return _make_work(None, [])

    def _arrived(self, key, deadline):
        """Whether `key` is in the store by `deadline` (a last short look
        if it has passed: 10 ms, as 1.13's stores have no check())."""
        left = max(deadline - time.monotonic(), 0.01)
        try:
            self._store.wait([key], datetime.timedelta(seconds=left))
            return True
        except Exception:  # noqa: BLE001 - the store's timeout (its type differs by version)
            return False

    @_routed
    def send(self, tensors, dst, tag):
        t = self._tensor(self._one(tensors, "send").contiguous(), "send")
        return _make_work(self._comm.send(t, dst, tag=tag, async_op=_async()), [t])

    @_routed
    def recv(self, tensors, src, tag):
        given = self._one(tensors, "recv")
        t, back = self._staged(given, "recv")
        return _make_work(self._comm.recv(t, src, tag=tag, async_op=_async()), [given], back)

    # PyTorch 2.x's newer names, which its Python front calls on the group.
    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def _get_backend(self, device=None):
        """PyTorch asks a group for its backend of a device (whether it
        coalesces point-to-point ops, ...): this group is its own."""
        return self

    supports_coalescing = False
    # PyTorch's split_group splits a group's C++ backends, which a Python
    # group has none of: it says so (new_group serves), and DeviceMesh and
    # init_process_group(device_id=...) take new_group's way. Without the
    # attribute they raised AttributeError.
    supports_splitting = False

    def recv_anysource(self, tensors, tag):
        raise _refuse("recv from any source (name the source rank)")

    @_routed
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: split sizes count rows (dim 0); none: equal.
        In place (input and output the same memory, as Gloo takes it): the
        input copied first."""
        if _overlap(input, output):
            input = input.clone()
        input = self._tensor(input.contiguous(), "all_to_all_single")
        given = output
        output, back = self._staged(output, "all_to_all_single")
        if input.dtype != output.dtype:
            raise _lib.error("invalid_argument", f"all_to_all_single on rank {self.rank()}: "
                             f"input is {input.dtype} but output is {output.dtype}")
        n = self.size()

        def counts(t, splits, name):
            if not splits:
                if t.dim() == 0 or t.size(0) % n:
                    raise _lib.error("invalid_argument", f"all_to_all_single on rank "
                                     f"{self.rank()}: {name} has {t.size(0) if t.dim() else 0} "
                                     f"rows, not a multiple of the group's {n} ranks")
                splits = [t.size(0) // n] * n
            row = t[0].numel() if t.dim() and t.size(0) else 0
            return [int(s) * row for s in splits]
        kw = {}
        if output_split_sizes or input_split_sizes:
            kw = dict(send_counts=counts(input, input_split_sizes, "input"),
                      recv_counts=counts(output, output_split_sizes, "output"))
            if len(set(kw["send_counts"] + kw["recv_counts"])) == 1:
                kw = {}  # even splits: collie's alltoall, one collective on shm, tcp and mpi
        if input.device.type == "cpu" and output.device.type == "cpu":
            return _make_work(self._comm.alltoall(input, output, async_op=_async(), **kw), [given],
                              back)
        # collie's all-to-all moves host memory: device tensors go through it.
        host_out = torch.empty(output.shape, dtype=output.dtype)
        return _make_work(self._comm.alltoall(input.cpu(), host_out, async_op=_async(), **kw),
                          [given], lambda: given.copy_(host_out))

    @_routed
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all: tensor j of the inputs goes to rank j."""
        for kind, ts in (("input", input_tensors), ("output", output_tensors)):
            for t in self._one_per_rank(ts, "all_to_all", kind):  # any layout: cat and copy_
                self._tensor(t.contiguous(), "all_to_all")
        dtypes = {t.dtype for t in list(input_tensors) + list(output_tensors)}
        if len(dtypes) != 1:
            raise _lib.error("invalid_argument", f"all_to_all on rank {self.rank()}: tensors "
                             f"of several dtypes ({', '.join(sorted(map(str, dtypes)))})")
        # One host buffer each way (collie's all-to-all moves host memory).
        flat_in = torch.cat([t.reshape(-1).cpu() for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        sizes = [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]
        even = len(set(sizes[0] + sizes[1])) == 1
        work = (self._comm.alltoall(flat_in, flat_out, async_op=_async()) if even else
                self._comm.alltoall(flat_in, flat_out, send_counts=sizes[0], recv_counts=sizes[1],
                                    async_op=_async()))
        return _make_work(work, output_tensors, lambda: _unflatten(flat_out, output_tensors))


# Launchers whose ranks PyTorch's env:// cannot find by itself: their rank,
# world size and local world size variables, and the job id both sides
# derive a port from (as collie's own connect() does, base/config.h).
_LAUNCHERS = (
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"),
    ("srun (SLURM)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None, "SLURM_JOB_ID"),
)


def launcher_env(environ=None):
    """The variables PyTorch's env:// reads (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) that mpirun and srun do not set, from theirs;
    {} where RANK is set or no such launcher started this process. Rank 0's
    address is 127.0.0.1 when every rank is on this host; across hosts
    MASTER_ADDR must be given (an error says so). The port comes from the
    job id, the same on every rank."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ:
        return {}
    for name, rank, world, local_rank, local_world, job in _LAUNCHERS:
        if rank not in environ or world not in environ:
            continue
        out = {"RANK": environ[rank], "WORLD_SIZE": environ[world]}
        if local_rank in environ:
            out["LOCAL_RANK"] = environ[local_rank]
        if "MASTER_ADDR" not in environ:
            if local_world and environ.get(local_world) == environ[world]:
                out["MASTER_ADDR"] = "127.0.0.1"
            else:
                raise _lib.error("invalid_argument", f"the collie backend under {name}: the "
                                 "ranks may span several hosts; set MASTER_ADDR to rank 0's "
                                 "host name or address")
        if "MASTER_PORT" not in environ:
            if not environ.get(job):
                raise _lib.error("invalid_argument", f"the collie backend under {name}: no "
                                 f"{job} to derive a port from; set MASTER_PORT")
            h = 1469598103934665603  # FNV-1a, as base/config.h's port_from_job_id
            for b in environ[job].encode():
                h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
            # One above collie's own store port for this job, so that both may
            # run; below the kernel's ephemeral ports (32768 up), as it is.
            out["MASTER_PORT"] = str(20000 + (h % 12768 + 1) % 12768)
        return out
    return {}


def arrivals(group=None):
    """Which rank arrived last, and how long after the first, at `group`'s
    collectives (the default group if None) since the last call: a
    collective over the group. collie.Communicator.arrivals of the group's
    communicator: a dict with "collectives", per rank "last" and
    "median_late_ms", and the "summary" sentence."""
    pg = backend_of(group)
    if pg is None:
        raise ValueError("collie.distributed.arrivals: the group is not collie's "
                         "(init_process_group(\"collie\"))")
    return pg.comm.arrivals()


_options = {"deterministic": None}  # what the groups made from now on are given


def init_process_group(backend=BACKEND, deterministic=None, **kwargs):
    """torch.distributed.init_process_group(backend, **kwargs), also under
    mpirun and srun, which set none of the variables PyTorch's env:// reads:
    where neither init_method nor store is given, it fills them in from the
    launcher's (launcher_env) first. Under torchrun and collie-run it is
    PyTorch's call unchanged. deterministic=True (None: COLLIE_DETERMINISTIC):
    collie's groups made from now on, the default one and new_group's, sum
    all_reduce and reduce_scatter in rank order, the same bits on every
    backend (every rank must pass the same)."""
    _options["deterministic"] = deterministic
    if "init_method" not in kwargs and "store" not in kwargs:
        os.environ.update(launcher_env())
    dist.init_process_group(backend, **kwargs)


def _create(store, rank, size, timeout=None, *_):
    return ProcessGroupCollie(store, rank, size, timeout)


def register():
    """Registers the backend "collie" with torch.distributed (once)."""
    if getattr(dist.Backend, "COLLIE", None) is not None:
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    except TypeError:  # PyTorch before 2.1: no devices
        dist.Backend.register_backend(BACKEND, _create)


register()
