"""collie.torch: a drop-in torch.nn.parallel.DistributedDataParallel over
collie's reducer.

    import collie.torch
    model = collie.torch.DistributedDataParallel(model)    # instead of torch's DDP
    ...the training loop as before...

What differs from PyTorch's DDP, on purpose (the semantics are collie's
reducer's, the same for every engine on its C ABI; this wrapper only tells
it when each gradient has been accumulated):
  * find_unused_parameters needs no traversal of the autograd graph: a
    parameter whose gradient has not arrived when backward ends contributes
    zeros (or, after no_sync micro-batches, the gradient it accumulated).
  * Activation checkpointing (torch.utils.checkpoint, reentrant or not)
    works without static_graph: a parameter may receive its gradient several
    times in one backward; the first iteration learns how many.
  * A parameter used only in no_sync micro-batches keeps its accumulated
    gradient on the synchronising step.
  * state_dict() is local, as PyTorch's; inside state_of_every_rank() it
    holds every rank's comm-hook state (PowerSGD's error feedback).
  * A parameter received no gradient and find_unused_parameters is off: the
    error comes at the end of that backward, naming the parameter, not one
    iteration later.
Comm hooks: collie's by name ("fp16", "powersgd:rank=2", ...); PyTorch's
built-in hooks passed to register_comm_hook are mapped to collie's; any other
callable is called as PyTorch calls a hook, hook(state, bucket), and may
return a torch Future, a collie Work, a tensor, or None (left in place).
"""
import contextlib
import ctypes
import multiprocessing
import os
import warnings

import torch
from torch.distributed.algorithms.join import Join, Joinable

from . import Communicator, Error, Work, _open_wrappers, as_tensor, default_communicator
from . import _lib
from . import distributed as _distributed  # noqa: F401 - registers the backend "collie"
from ._ddp_parts import (REFUSED_OPTIONS, _DTYPES, _MiB, _TORCH_OF, GradBucket,  # noqa: F401
                         _Arenas, _as_bytes, _as_uint8, _broadcast_buffers, _builtin_spec,
                         _check_process_group, _check_torch_world, _eager_under_compile,
                         _JoinHook, _map_tensors, _Sink)
from ._ddp_checkpoint import _Checkpoint
from ._ddp_elastic import _Elastic, broadcast_object, handoff_state, warm_spare
from ._ddp_hooks import _CommHooks
from ._ddp_join import _UnevenInputs
from ._lib import check, lib
from .averaging import PeriodicModelAverager, PostLocalSGDOptimizer

__all__ = ["DistributedDataParallel", "GradBucket", "PeriodicModelAverager", "PostLocalSGDOptimizer",
           "broadcast_object", "handoff_state"]


# collie's errors as PyTorch's (collie.distributed makes them: importing
# the backend alone must give them too): collie.torch.DistError and
# DistBackendError where PyTorch has them.
if _distributed.DistError is not None:
    DistError, DistBackendError = _distributed.DistError, _distributed.DistBackendError

_TORCH_DDP = torch.nn.parallel.DistributedDataParallel

# A warm spare (collie-run --spares: COLLIE_SPARE=<id>, checked by collie's
# connect()) is idle until a grow takes it: what its first step would wait
# for is done now, before the wrapper's construction waits in the join.
# Not in its subprocesses (a DataLoader's workers inherit the variable).
if os.environ.get("COLLIE_SPARE") and multiprocessing.parent_process() is None:
    warm_spare()


def _check_options(replicas, nonfinite, action):
    """The reducer's checks, as the C ABI takes them (-1: the variable's
    value): replicas compared every `replicas` iterations, gradients searched
    for NaN and Inf before averaging, "error" or "warn" when one fails."""
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        raise _lib.error("invalid_argument", f"check_replicas={replicas!r}: give how many "
                                             f"iterations apart the replicas are compared (0: never)")
    actions = {None: -1, "error": 0, "warn": 1}
    if action not in actions:
        raise _lib.error("invalid_argument", f"check_action={action!r} is not 'error' or 'warn'")
    return (-1 if replicas is None else replicas,
            -1 if nonfinite is None else int(bool(nonfinite)), actions[action])


class DistributedDataParallel(_CommHooks, _UnevenInputs, _Checkpoint, _Elastic, torch.nn.Module,
                              Joinable):
    """torch.nn.parallel.DistributedDataParallel's constructor and methods
    over collie. The communicator: `comm` (or a collie.Communicator passed as
    process_group); by default one connected from the launcher's variables.
    `comm_hook`: a hook spec to start with ("fp16", "powersgd:rank=2").
    The checks (each None: its COLLIE_CHECK_* variable): `check_replicas=N`
    compares every rank's parameters every N iterations and names the ranks
    and the first parameter that differ; `check_nonfinite=True` names the
    rank, parameter and element of a NaN or Inf gradient before it is
    averaged; `check_action="warn"` logs instead of raising."""


    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=None,
                 init_sync=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, skip_all_reduce_unused_params=False,
                 bucket_cap_mb_list=None, batched_grad_copy=False, forward_sync_buffers=None,
                 lazy_bucket_allocation=False, *, comm=None, comm_hook=None,
                 first_bucket_cap_mb=1, check_replicas=None, check_nonfinite=None,
                 check_action=None):
        # PyTorch 2.x's DDP signature, in its order (1.13's put process_group
        # before init_sync: pass it by name there). device_ids, output_device,
        # dim, check_reduction, batched_grad_copy and lazy_bucket_allocation
        # change nothing here; the options collie does not have are refused
        # when set, naming why, rather than ignored.
        super().__init__()
        Joinable.__init__(self)
        del device_ids, output_device, dim, check_reduction, batched_grad_copy
        del lazy_bucket_allocation
        given = {"delay_all_reduce_named_params": delay_all_reduce_named_params,
                 "param_to_hook_all_reduce": param_to_hook_all_reduce,
                 "mixed_precision": mixed_precision, "device_mesh": device_mesh,
                 "skip_all_reduce_unused_params": skip_all_reduce_unused_params or None,
                 "bucket_cap_mb_list": bucket_cap_mb_list}
        for name, value in given.items():
            if value is not None:
                raise _lib.error("invalid_argument", f"collie.torch.DistributedDataParallel does not "
                                                f"take {name} ({REFUSED_OPTIONS[name]})")
        # As PyTorch 2.x: broadcast_buffers=False keeps buffers rank-local at
        # construction too; forward_sync_buffers only governs the forwards.
        self._init_sync_buffers = True if forward_sync_buffers is not None else \
            broadcast_buffers is not False
        if broadcast_buffers is None:
            broadcast_buffers = True if forward_sync_buffers is None else forward_sync_buffers
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        self.module = module
        if comm is None and isinstance(process_group, Communicator):
            comm = process_group
        self._owns_comm = False
        self._comm = comm if comm is not None else default_communicator()
        if process_group is not None and not isinstance(process_group, Communicator):
            _check_process_group(process_group, self._comm)
        elif comm is not None:
            _check_torch_world(self._comm)
        self._find_unused = bool(find_unused_parameters)
        self._static_graph = bool(static_graph)
        self._bucket_view = bool(gradient_as_bucket_view)
        self._broadcast_buffers = bool(broadcast_buffers)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise _lib.error("invalid_argument",
                        "collie.torch.DistributedDataParallel: the module has no parameter that "
                        "requires a gradient")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        for n, p in named:
            if p.dtype not in _DTYPES:
                raise _lib.error("invalid_argument",
                            f"parameter {n} is {p.dtype}, which collie does not reduce")
            if not p.is_contiguous():
                raise _lib.error("invalid_argument", f"parameter {n} is not contiguous")
            if p.is_sparse:
                raise _lib.error("invalid_argument", f"parameter {n} is sparse; collie reduces dense "
                                                "gradients only")
        self._index_of = {p.data_ptr(): i for i, p in enumerate(self._params)}
        self._reducer_options = (first_bucket_cap_mb, bucket_cap_mb,
                                 comm_hook if isinstance(comm_hook, str) else None,
                                 _check_options(check_replicas, check_nonfinite, check_action))
        self._init_sync = bool(init_sync)
        self._hook_spec = None  # the last register_comm_hook's, for a reform
        self._python_hooks = []
        self._synced_steps = 0  # synchronised backward passes finished
        self._steps = 0
        # A process that joined a running job (collie-run --elastic): the
        # survivors' reform() hands it their state and rank 0's object.
        # Loaded at the first forward, not here: the comm hook the program
        # registers after construction (PyTorch's order) must be in place
        # before its state (PowerSGD's error feedback) is.
        self._handoff_to_load = self._take_handoff()
        self._build()
        if comm_hook is not None and not isinstance(comm_hook, str):
            self.register_comm_hook(None, comm_hook)

    def _build(self):
        """The reducer over self._comm, the gradient hooks on the parameters
        and the step's state: at construction, and again by reform()."""
        n = len(self._params)
        first_bucket_cap_mb, bucket_cap_mb, spec, checks = self._reducer_options
        tensors = (_lib.Tensor * n)(*[as_tensor(p.data) for p in self._params])
        rows = (ctypes.c_uint64 * n)(*[p.shape[0] if p.dim() >= 2 else 0 for p in self._params])
        self._arenas = _Arenas(self._comm)
        self._bucket_bytes = int(bucket_cap_mb * _MiB)
        # DDP's semantics (gradients that arrive several times, unused
        # parameters and their exchange, the static graph, no_sync, the
        # errors) are the reducer's, as for every engine on the C ABI.
        names = (ctypes.c_char_p * n)(*[name.encode() for name in self._names])
        opts = _lib.ReducerOptions(
            ctypes.sizeof(_lib.ReducerOptions), _lib.STRUCT_TAG, int(first_bucket_cap_mb * _MiB),
            int(bucket_cap_mb * _MiB), int(self._bucket_view), int(self._find_unused),
            int(self._static_graph), int(self._init_sync),
            spec.encode() if spec is not None else None, rows,
            ctypes.pointer(self._arenas.struct), 1, 0, names, *checks)
        h = ctypes.c_void_p()
        check(lib.collie_reducer_create(self._comm.handle, tensors, None, n, ctypes.byref(opts),
                                        ctypes.byref(h)))
        self._h = h
        _open_wrappers.add(self)  # closed at exit, before the interpreter finalizes
        if self._hook_spec is not None:
            check(lib.collie_reducer_set_comm_hook(self._h, self._hook_spec.encode()))
        self._generation = None
        self._views = [None] * n
        if self._bucket_view:
            self._bind_views()
        if self._init_sync and self._init_sync_buffers:
            _broadcast_buffers(self._comm, self.module, 0)
        # A hook per parameter, after its gradient has been accumulated:
        # PyTorch's own (2.1 and later), else one on the parameter's gradient
        # accumulator node, kept alive here.
        self._accumulators, self._handles = [], []
        for i, p in enumerate(self._params):
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._handles.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))
                continue
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._handles.append(acc.register_hook(self._make_hook(i)))
            self._accumulators.append(acc)
        self._given = [None] * n  # copy mode: the gradient tensor the reducer was last given
        self._in_backward = False
        self._armed = False
        self._warned_unarmed = False
        self.require_backward_grad_sync = True
        # As PyTorch's DDP: buffers go out before a forward when the last
        # forward was a synchronising one (or there was none).
        self.require_forward_param_sync = True
        self._joining = False
        # join(enable=...)'s last word, which stays after the join as the
        # Join PyTorch's ddp.join() makes leaves its config: while true,
        # buffers come from the highest rank still training.
        self._join_enabled = False
        self._active = None  # ranks still training in this step of a join
        self._join_syncing = True  # whether any of them synchronises in it
        self._divide_by_initial = True
        self._throw_on_early_termination = False
        self._every_rank_state = False

    @property
    def comm(self):
        """The collie.Communicator the gradients travel over."""
        return self._comm

    # ---- the training step ------------------------------------------------

    @_eager_under_compile
    def forward(self, *inputs, **kwargs):
        if self._handoff_to_load is not None:  # a newcomer's: see __init__
            state, self._handoff_to_load = self._handoff_to_load, None
            self.load_handoff(state)
        syncing = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self._joining:
            self._join_round(1, syncing)
        elif self._join_config.enable:
            # In PyTorch's Join: it counts the ranks still training (and
            # raises for throw_on_early_termination).
            work = Join.notify_join_context(self)
            if work is not None:
                work.wait()
                self._active = int(work.result()[0].item())
            self._exchange_sync(syncing)  # matched by _JoinHook.main_hook on joined ranks
        # Buffers out when PyTorch's DDP sends them: not after a no_sync
        # micro-batch or a no-grad forward (evaluation), whose ranks keep
        # their own until the next synchronising step.
        if self._broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self._call_module(inputs, kwargs)
        self.require_forward_param_sync = (torch.is_grad_enabled()
                                           and self.require_backward_grad_sync)
        if not torch.is_grad_enabled():
            return out
        self._steps += 1
        # As PyTorch's DDP: a grad-enabled forward through the wrapper arms
        # the gradient hooks, so that the next backward reduces even when its
        # loss was not computed from this output (a loss from .module, an
        # output dropped and recomputed).
        self._armed = True
        flat = []
        _map_tensors(out, lambda t: flat.append(t) if t.requires_grad else None)
        if not flat:
            return out
        sunk = iter(_Sink.apply(self, *flat))
        return _map_tensors(out, lambda t: next(sunk) if t.requires_grad else t)

    def _call_module(self, inputs, kwargs):
        """The wrapped module's forward, as PyTorch's DDP calls it under
        torch.compile: PyTorch's DDP class names this wrapper its active
        module meanwhile, so that TorchDynamo compiles the module with
        DDPOptimizer, which cuts the graph where the buckets end
        (bucket_bytes_cap). Without the cuts the compiled backward runs
        whole before any gradient is accumulated, and every bucket leaves
        at its end (bench/RESULTS.md)."""
        cls = _TORCH_DDP if hasattr(_TORCH_DDP, "_active_ddp_module") else None
        if cls is None:
            return self.module(*inputs, **kwargs)
        old = cls._active_ddp_module
        cls._active_ddp_module = self
        try:
            return self.module(*inputs, **kwargs)
        finally:
            cls._active_ddp_module = old

    @property
    def bucket_bytes_cap(self):
        """The bucket size after the first (PyTorch's DDP's attribute, which
        TorchDynamo's DDPOptimizer reads to cut graphs). At least 1 MiB:
        DDPOptimizer's first piece is 1 MiB and it refuses a smaller cap
        after it; smaller buckets then get coarser cuts."""
        return max(self._bucket_bytes, 1 << 20)

    def _start_backward(self):
        if self._in_backward:
            return  # several outputs, one backward
        check(lib.collie_reducer_prepare(self._h, None, 0))
        self._in_backward = True
        self._armed = False
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _make_hook(self, i):
        def hook(*_):
            if not self._in_backward and self._armed:
                self._start_backward()  # the loss did not come from the wrapper's output
            if self._in_backward:
                self._on_gradient(i)
            elif not self._warned_unarmed and self.require_backward_grad_sync:
                self._warned_unarmed = True
                warnings.warn(
                    f"collie.torch.DistributedDataParallel on rank {self._comm.rank}: parameter "
                    f"{self._names[i]} received a gradient from a backward with no forward "
                    "through the wrapper before it; it stays this rank's own, not averaged over "
                    "the ranks. Call the wrapper (not .module) in training steps.", stacklevel=2)
        return hook

    def _on_gradient(self, i):
        """Gradient i has been accumulated (once more, under checkpointing or
        for a shared weight): the reducer counts it, and sends its bucket
        when every gradient in it has arrived as often as in the first
        step (no_sync: only accumulates)."""
        if self._bucket_view:
            self._into_view(i)
            check(lib.collie_reducer_mark_ready(self._h, i))
            return
        p = self._params[i]
        if not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        self._given[i] = p.grad
        check(lib.collie_reducer_mark_ready_grad(self._h, i, as_tensor(p.grad)))

    def _into_view(self, i):
        """With bucket views the gradient must live in its bucket: after
        zero_grad(set_to_none=True), or an out-of-place accumulation, copy it
        there and make param.grad the view again (as PyTorch's DDP does)."""
        p, v = self._params[i], self._views[i]
        if p.grad is not None and p.grad.data_ptr() != v.data_ptr():
            v.copy_(p.grad)
            p.grad = v

    def _update_given(self):
        """Copy mode: the reducer reads and writes gradients where it was
        last told they are; tell it where they are now (zero_grad may have
        freed or replaced them since a no_sync step gave them)."""
        for i, p in enumerate(self._params):
            g = p.grad
            if g is not self._given[i]:
                if g is not None and not g.is_contiguous():
                    g = p.grad = g.contiguous()
                self._given[i] = g
                check(lib.collie_reducer_set_grad(
                    self._h, i, ctypes.byref(as_tensor(g)) if g is not None else None))

    def _end_backward(self):
        try:
            if not self._bucket_view:
                self._update_given()
            status = lib.collie_reducer_finalize(self._h)
            if not self.require_backward_grad_sync:
                check(status)
                return
            if self._bucket_view:
                self._bind_views()
            check(status)  # a parameter with no gradient, or one that arrived late, named
            if self._find_unused or self._static_graph:
                self._give_unused()
            if (not self._divide_by_initial and self._active is not None
                    and 0 < self._active < self._comm.size):
                # join(divide_by_initial_world_size=False): the average over
                # the ranks still training, not over the whole world.
                with torch.no_grad():
                    for p in self._params:
                        if p.grad is not None:
                            p.grad.mul_(self._comm.size / self._active)
            self._synced_steps += 1
        finally:
            self._in_backward = False

    def _give_unused(self):
        """Parameters no gradient reached here but some other rank's did get
        their average as param.grad, also when it was None (as with
        PyTorch's DDP); those no rank used keep what they had."""
        n = len(self._params)
        use = (ctypes.c_uint8 * n)()
        check(lib.collie_reducer_param_use(self._h, use, n))
        for i, p in enumerate(self._params):
            if use[i] != 1 or p.grad is not None:
                continue
            if self._bucket_view:
                p.grad = self._views[i]
            else:
                t = _lib.Tensor()
                check(lib.collie_reducer_bucket_grad(self._h, i, ctypes.byref(t)))
                p.grad = self._arenas.view(t.data, p.numel(), p.dtype, p.shape).clone()
                self._given[i] = p.grad

    def _bind_views(self):
        """Where each gradient lives in bucket memory; re-read when the
        buckets were re-laid out. Parameters that have a gradient get the
        new view as param.grad (moving the layout moved their values)."""
        g = ctypes.c_uint64()
        check(lib.collie_reducer_layout_generation(self._h, ctypes.byref(g)))
        if g.value == self._generation:
            return
        self._generation = g.value
        t = _lib.Tensor()
        for i, p in enumerate(self._params):
            check(lib.collie_reducer_grad_view(self._h, i, ctypes.byref(t)))
            self._views[i] = self._arenas.view(t.data, p.numel(), p.dtype, p.shape)
            if p.grad is not None:
                p.grad = self._views[i]

    def _sync_buffers(self, training=True):
        """Rank 0's buffers to every rank; once join is enabled, the buffers
        of the highest rank still training, as PyTorch's DDP chooses (rank 0
        may have joined, its buffers stale): one more all-reduce then. None
        without buffers, as PyTorch's DDP."""
        if next(self.module.buffers(), None) is None:
            return
        root = 0
        if self._join_enabled or self._join_config.enable:
            rank = torch.tensor([self._comm.rank if training else -1], dtype=torch.int64)
            self._comm.allreduce(rank, op="max")
            root = int(rank[0])
        _broadcast_buffers(self._comm, self.module, root)

    # ---- the DDP API users know ---------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally; the first backward outside reduces
        them (with what that backward adds)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        check(lib.collie_reducer_set_no_sync(self._h, 1))
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
            check(lib.collie_reducer_set_no_sync(self._h, int(not old)))

    def _set_static_graph(self):
        """PyTorch's (and Lightning's) way to turn static_graph on after
        construction (before the first step)."""
        check(lib.collie_reducer_set_static_graph(self._h))
        self._static_graph = True

    # ---- observability ------------------------------------------------------

    def reducer_stats(self):
        """The reducer's timings and byte counts of the last synchronised step:
        backward_us, exposed_us (finalize waiting for communication),
        comm_us_total, num_buckets, gradient_bytes, hook_bytes, ..."""
        s = _lib.ReducerStats(ctypes.sizeof(_lib.ReducerStats), _lib.STRUCT_TAG)
        check(lib.collie_reducer_get_stats(self._h, ctypes.byref(s)))
        return {f: getattr(s, f) for f, _ in _lib.ReducerStats._fields_[2:]}

    # ---- lifetime -----------------------------------------------------------------

    def close(self):
        """Waits for what is in flight and frees the reducer (and the
        communicator, when this DDP connected it)."""
        if getattr(self, "_h", None):
            self._release()
            if self._owns_comm:
                self._comm.close()

    def _release(self):
        """The gradient hooks off the parameters, the reducer freed."""
        for h in self._handles:
            h.remove()
        self._handles = []
        check(lib.collie_reducer_destroy(self._h))
        self._h = None
        _open_wrappers.discard(self)
        # The arenas (a reference cycle with their callbacks, so freed only
        # by the cycle collector) allocate no more: let go of the
        # communicator, which then closes with its last holder (reform()'s
        # old one at once, not at the next collection; it held 8 sockets).
        self._arenas.comm = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a destructor must not raise
            pass
