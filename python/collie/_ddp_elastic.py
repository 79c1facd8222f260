"""collie.torch's DistributedDataParallel re-formed in memory after a rank
is lost and replaced (collie-run --elastic): handoff_state() and the
wrapper's reform(), its joiner's side at construction, and the user's own
object (the step, the optimizer's state) handed over with them."""
import ctypes
import os
import pickle
import warnings

import torch

from . import _lib
from ._lib import check, lib


def handoff_state(ddp, comm, root=0):
    """After a shrink or a grow (collie.Communicator.grow): the reducer state
    a rank's new DistributedDataParallel on `comm` loads (its
    load_handoff()), so that training goes on in memory, without a
    checkpoint. A rank with a wrapper (`ddp`) keeps its own state (bucket
    layout, iteration, the comm hook's state, PowerSGD's error feedback); a
    joiner passes None and gets rank `root`'s, and so does every rank when
    the wrappers finished different iterations. Collective over `comm`: call
    it before making the new wrapper, whose construction broadcasts rank 0's
    parameters and buffers; close() the old wrapper first (its hooks stay
    on the parameters until then)."""
    at_root = comm.rank == root
    # Taken by hand: the next wrapper on `comm` does not take it again.
    comm._handoff_pending = False
    if at_root and ddp is None:
        raise _lib.error("invalid_argument", f"handoff_state on rank {root}: the rank that hands "
                                             "its reducer's state to the others has no wrapper")
    mine = ddp._save_reducer_state() if ddp is not None else b""
    # Ranks whose wrappers finished different iterations (they failed in
    # different collectives) all go on from rank `root`'s state, as from
    # its parameters.
    done = ctypes.c_uint64(0)
    if ddp is not None:
        check(lib.collie_reducer_iterations(ddp._h, ctypes.byref(done)))
    every = torch.zeros(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([done.value if ddp is not None else -1], dtype=torch.int64), every)
    agree = all(int(d) < 0 or int(d) == int(every[root]) for d in every)
    if not agree and at_root:
        warnings.warn(f"handoff_state: the ranks had finished different iterations "
                      f"({[int(d) for d in every]}): every rank goes on from rank {root}'s")
    size = torch.tensor([len(mine) if at_root else 0], dtype=torch.int64)
    comm.broadcast(size, root=root)
    buf = torch.zeros(max(int(size[0]), 1), dtype=torch.uint8)
    if at_root and mine:
        buf[:len(mine)] = torch.tensor(bytearray(mine), dtype=torch.uint8)
    comm.broadcast(buf[:int(size[0])], root=root)
    if at_root or (ddp is not None and agree):
        return mine
    return bytes(buf[:int(size[0])].tolist())


def broadcast_object(comm, obj, root=0):
    """Rank `root`'s `obj` (any picklable object) on every rank of `comm`,
    as two broadcasts: its pickled size, then its bytes. Collective."""
    mine = pickle.dumps(obj) if comm.rank == root else b""
    size = torch.tensor([len(mine)], dtype=torch.int64)
    comm.broadcast(size, root=root)
    buf = torch.zeros(max(int(size[0]), 1), dtype=torch.uint8)
    if comm.rank == root:
        buf[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    comm.broadcast(buf[:int(size[0])], root=root)
    return obj if comm.rank == root else pickle.loads(bytes(buf[:int(size[0])].tolist()))


def _world_size():
    for name in ("COLLIE_WORLD_SIZE", "WORLD_SIZE"):
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return None


class _Elastic:
    """DistributedDataParallel's side of a lost rank replaced in the running
    job. The survivors call reform() after the error that named the lost
    rank; the replacement (started by collie-run --elastic with
    COLLIE_JOIN=1, whose collie.connect() joins) builds its wrapper as at
    the start, and finds rank 0's object in `handed_over`."""

    handed_over = None

    def reform(self, state=None, world=None, wait=0.0):
        """After a collie.Error whose code is "peer_lost" (a rank died under
        the step): re-forms this wrapper in place on a new communicator of
        the survivors grown back to `world` ranks (default: the job's
        launch size, COLLIE_WORLD_SIZE or WORLD_SIZE, else the size it had)
        by the processes that join (collie-run --elastic starts each lost
        rank again). The reducer's state (bucket layout, iteration, the comm
        hook's state) goes to the newcomers from memory, rank 0's parameters
        and buffers to every rank, as at construction. Returns rank 0's
        `state` (any picklable object: the step to redo, the optimizer's
        state_dict) on every rank; a newcomer finds it in `handed_over`.
        The step that failed is not taken: do it again. `ddp.comm` is the new
        communicator (the wrapper closes it with itself); the old one is
        left to its owner. Collective over the survivors and the joiners."""
        old = self._comm
        if world is None:
            world = self._world if self._world is not None else old.size
        comm = old.shrink(wait=wait)
        if world > comm.size:
            comm = comm.grow(world - comm.size, wait=wait)
        handed = handoff_state(self, comm)
        extra = broadcast_object(comm, state)
        self._release()
        if self._owns_comm:
            old.close()
        self._comm, self._owns_comm = comm, True
        self._build()
        self.load_handoff(handed)
        self.handed_over = extra
        return extra

    def _take_handoff(self):
        """At construction on a communicator that joined a running job: the
        joiner's half of the survivors' reform() (the reducer state it
        loads after the build, rank 0's object in `handed_over`); None on
        any other communicator."""
        self._world = _world_size()
        if not getattr(self._comm, "_handoff_pending", False):
            return None
        self._comm._handoff_pending = False
        handed = handoff_state(None, self._comm)
        self.handed_over = broadcast_object(self._comm, None)
        return handed
