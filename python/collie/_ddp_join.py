"""collie.torch's DistributedDataParallel, uneven inputs: join(), which
needs no torch.distributed, and the Joinable that PyTorch's Join drives. A
rank out of data shadows the others' collectives with zero gradients; at
the end every rank takes the model of the rank that trained longest. A
mixin of the wrapper (collie/torch.py).
"""
import contextlib

import torch

from . import _lib
from ._ddp_parts import _broadcast_buffers, _JoinHook
from ._lib import check, lib


class _UnevenInputs:
    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Uneven inputs, with PyTorch's signature: run the training loop
        inside. A rank that runs out of data shadows the others' collectives
        (zero gradients) until every rank is done; then every rank takes the
        model of the rank that trained longest. Gradients are divided by the
        whole world (divide_by_initial_world_size=True, PyTorch's default) or
        by the ranks still training. throw_on_early_termination: every rank
        raises once one has run out. Works without torch.distributed; with
        it, torch.distributed.algorithms.join.Join([ddp, ...]) drives the
        wrapper too (it is a Joinable)."""
        self._join_enabled = bool(enable)
        if not enable:
            yield
            return
        self._joining = True
        self._divide_by_initial = bool(divide_by_initial_world_size)
        self._throw_on_early_termination = bool(throw_on_early_termination)
        try:
            yield
        except BaseException:
            # The loop raised (throw_on_early_termination included): no
            # shadowing, which the other ranks would not match.
            self._joining = False
            self._active = None
            raise
        else:
            try:
                if self._throw_on_early_termination:
                    self._join_round(0)  # the others learn of it in their next forward
                    raise _lib.error("invalid_argument",
                                     f"rank {self._comm.rank} exhausted all inputs "
                                     "(join(throw_on_early_termination=True))")
                while self._join_round(0):
                    self._shadow_step()
                self._sync_final_model()
            finally:
                self._joining = False
                self._active = None

    def _join_round(self, active, syncing=False):
        """One all-reduce per step of a join: how many ranks still train,
        and how many of those run a synchronising step (not no_sync, not
        without gradients), which the joined ranks shadow; the ranks that
        train a no_sync step run no collective a joined rank could match."""
        m = self._comm.size + 1
        count = torch.tensor([int(bool(active)) + m * int(bool(syncing))], dtype=torch.int64)
        self._comm.allreduce(count, op="sum")
        self._active = int(count[0]) % m
        self._join_syncing = int(count[0]) // m > 0
        if active and self._throw_on_early_termination and self._active < self._comm.size:
            raise _lib.error("invalid_argument",
                             f"rank {self._comm.rank}: {self._comm.size - self._active} rank(s) "
                             "exhausted all inputs (join(throw_on_early_termination=True))")
        return self._active > 0

    # ---- torch.distributed.algorithms.join.Joinable ------------------------------

    def join_hook(self, **kwargs):
        """What a rank that has joined does each round of PyTorch's Join:
        the collectives of one step with zero gradients; at the end, the
        model of the rank that trained longest."""
        self._divide_by_initial = bool(kwargs.get("divide_by_initial_world_size", True))
        return _JoinHook(self)

    @property
    def join_device(self):
        return self._params[0].device

    @property
    def join_process_group(self):
        """torch.distributed's default group, which PyTorch's Join counts
        the ranks still training over: it must be collie's world."""
        import torch.distributed as dist
        from ._torch_world import torch_world
        from . import world_mismatch
        world = torch_world()
        if world is None or world[1] != self._comm.size or world[0] != self._comm.rank:
            raise _lib.error("invalid_argument", "torch.distributed.algorithms.join.Join counts "
                             "ranks over torch.distributed's default group, which is not "
                             "initialised or not collie's world: " + (
                                 world_mismatch(self._comm, world) if world else
                                 "call torch.distributed.init_process_group, or use "
                                 "ddp.join(), which needs no torch.distributed"))
        return dist.group.WORLD

    def _exchange_sync(self, syncing):
        """In PyTorch's Join, whose count carries no more: whether any rank
        runs a synchronising step, one all-reduce (as PyTorch's DDP)."""
        flag = torch.tensor([int(bool(syncing))], dtype=torch.int64)
        self._comm.allreduce(flag, op="max")
        self._join_syncing = bool(flag[0])

    def _shadow_step(self):
        """The collectives of one training step, with zero gradients: the
        buffers where the training ranks' last step synchronised, then the
        gradients' where this one does (not after their no_sync or
        no-grad forwards)."""
        if self._broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers(training=False)
        self.require_forward_param_sync = self._join_syncing
        if not self._join_syncing:
            return
        status = lib.collie_reducer_join_step(self._h)
        if self._bucket_view:
            self._bind_views()
        check(status)

    def _sync_final_model(self):
        steps = torch.tensor([self._steps * self._comm.size + self._comm.rank], dtype=torch.int64)
        self._comm.allreduce(steps, op="max")
        root = int(steps[0]) % self._comm.size
        with torch.no_grad():
            for p in self._params:
                self._comm.broadcast(p.data, root=root)
        if self._broadcast_buffers:
            _broadcast_buffers(self._comm, self.module, root)
