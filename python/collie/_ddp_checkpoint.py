"""collie.torch's DistributedDataParallel, checkpoints: the reducer's state
(bucket layout, iteration, the comm hook's state) as the module's extra
state, this rank's or, inside state_of_every_rank(), every rank's. A mixin
of the wrapper (collie/torch.py).
"""
import contextlib
import ctypes

import torch

from . import _lib
from ._ddp_parts import _as_bytes, _as_uint8
from ._lib import check, lib


class _Checkpoint:
    def get_extra_state(self):
        """This rank's reducer state (bucket layout, iteration, the comm
        hook's state), with the rank that saved it. Local, as PyTorch's DDP's
        state_dict is: the DDP tutorial's `if rank == 0:
        torch.save(ddp.state_dict(), ...)` needs nothing from the others.
        Inside `with ddp.state_of_every_rank():` it is every rank's
        (collective: call state_dict() on every rank, save on one)."""
        mine = self._save_reducer_state()
        if not self._every_rank_state:
            return {"collie_reducer_rank": self._comm.rank,
                    "collie_world_size": self._comm.size, "collie_reducer": [_as_uint8(mine)]}
        n = self._comm.size
        sizes = torch.zeros(n, dtype=torch.int64)
        sizes[self._comm.rank] = len(mine)
        self._comm.allreduce(sizes, op="sum")
        width = max(int(sizes.max()), 1)
        blob = torch.zeros(width, dtype=torch.uint8)
        blob[:len(mine)] = torch.tensor(bytearray(mine), dtype=torch.uint8)
        everyone = torch.zeros(n * width, dtype=torch.uint8)
        self._comm.allgather(blob, everyone)
        raw = everyone.numpy().tobytes() if hasattr(everyone, "numpy") else bytes(everyone.tolist())
        return {"collie_reducer_rank": None, "collie_world_size": n,
                "collie_reducer": [_as_uint8(raw[r * width:r * width + int(sizes[r])])
                                   for r in range(n)]}

    def _save_reducer_state(self):
        size = ctypes.c_size_t()
        check(lib.collie_reducer_save_state(self._h, None, 0, ctypes.byref(size)))
        mine = (ctypes.c_uint8 * max(size.value, 1))()
        check(lib.collie_reducer_save_state(self._h, mine, size.value, ctypes.byref(size)))
        return bytes(mine)[:size.value]

    @contextlib.contextmanager
    def state_of_every_rank(self):
        """state_dict() inside holds every rank's reducer state (gathered:
        call it on every rank), so that a checkpoint saved on rank 0 resumes
        every rank exactly, PowerSGD's per-rank error feedback included."""
        self._every_rank_state = True
        try:
            yield
        finally:
            self._every_rank_state = False

    def load_handoff(self, state):
        """Loads what collie.torch.handoff_state() gave this rank after a
        shrink or a grow: its own reducer state, or (a joiner's) rank 0's.
        Collective, as set_extra_state is."""
        self.set_extra_state({"collie_reducer_rank": 0, "collie_world_size": self._comm.size,
                              "collie_reducer": [_as_uint8(state)]})

    def set_extra_state(self, state):
        """Loads the reducer state of a checkpoint (every rank loads one saved
        at the same step: the load checks that, collectively). A checkpoint
        of every rank's state gives each rank its own; one rank's state (the
        tutorial's save on rank 0) is loaded by every rank: the layout, the
        iteration and the hook's shared state are every rank's anyway, and a
        per-rank part (PowerSGD's error feedback) is that rank's, as
        PyTorch's PowerSGDState saved on rank 0 gives every rank rank 0's."""
        states = state["collie_reducer"]
        # Checkpoints of earlier versions hold every rank's state, untagged.
        saved_by = state.get("collie_reducer_rank", None)
        if saved_by is None and len(states) != self._comm.size:
            raise _lib.error("mismatch", f"the checkpoint holds {len(states)} ranks' reducer states; "
                                    f"this job has {self._comm.size} ranks")
        mine = _as_bytes(states[self._comm.rank] if saved_by is None else states[0])
        buf = (ctypes.c_uint8 * max(len(mine), 1)).from_buffer_copy(mine or b"\0")
        check(lib.collie_reducer_load_state(self._h, buf, len(mine)))
        if self._bucket_view:
            self._bind_views()
