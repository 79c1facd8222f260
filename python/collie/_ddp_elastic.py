"""collie.torch's DistributedDataParallel re-formed in memory after a rank
is lost and replaced (collie-run --elastic): handoff_state() and the
wrapper's reform(), its joiner's side at construction, and the user's own
object (the step, the optimizer's state) handed over with them."""
import ctypes
import pickle
import warnings

import torch

from . import _lib
from ._lib import check, lib


def warm_spare():
    """In a warm spare (collie-run --elastic --spares K sets COLLIE_SPARE):
    what a newcomer's first step would otherwise wait for, done while it
    waits to be taken. On PyTorch 2.x the first optimizer built in a process
    imports torch._dynamo (1.06 s of the 1.2 s a spare took from the kill
    to its first step, measured on 2.15); a throwaway one does it now."""
    try:
        with torch.enable_grad():
            p = torch.zeros(1, requires_grad=True)
            p.sum().backward()
            opt = torch.optim.SGD([p], lr=0.0, momentum=0.9)
            opt.step()
            opt.load_state_dict(opt.state_dict())
    except Exception as e:  # a warm-up only: the spare works without it
        warnings.warn(f"collie.torch: warming the spare up failed ({e}); its first step will "
                      "take longer")


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
    if ddp is None:
        return _handoff(None, comm, root)
    done = ctypes.c_uint64(0)
    check(lib.collie_reducer_iterations(ddp._h, ctypes.byref(done)))
    return _handoff((ddp._save_reducer_state(), done.value), comm, root)


def _handoff(mine, comm, root=0):
    """handoff_state() on this rank's saved state: (its bytes, the
    iterations its reducer finished), or None for a joiner."""
    at_root = comm.rank == root
    # Taken by hand: the next wrapper on `comm` does not take it again.
    comm._handoff_pending = False
    if at_root and mine is None:
        raise _lib.error("invalid_argument", f"handoff_state on rank {root}: the rank that hands "
                                             "its reducer's state to the others has no wrapper")
    # Ranks whose wrappers finished different iterations (they failed in
    # different collectives) all go on from rank `root`'s state, as from
    # its parameters.
    every = torch.zeros(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([mine[1] if mine is not None else -1], dtype=torch.int64), every)
    agree = all(int(d) < 0 or int(d) == int(every[root]) for d in every)
    if not agree and at_root:
        warnings.warn(f"handoff_state: the ranks had finished different iterations "
                      f"({[int(d) for d in every]}): every rank goes on from rank {root}'s")
    own = mine[0] if mine is not None else b""
    got = _broadcast_bytes(comm, own, root)
    if at_root or (mine is not None and agree):
        return own
    return got


def _broadcast_bytes(comm, data, root=0):
    """Rank `root`'s `data` (bytes; ignored elsewhere) on every rank of
    `comm`, as two broadcasts: its size, then its bytes. Collective."""
    at_root = comm.rank == root
    size = torch.tensor([len(data) if at_root else 0], dtype=torch.int64)
    comm.broadcast(size, root=root)
    buf = torch.zeros(max(int(size[0]), 1), dtype=torch.uint8)
    if at_root and data:
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    comm.broadcast(buf[:int(size[0])], root=root)
    return data if at_root else buf[:int(size[0])].numpy().tobytes()


def broadcast_object(comm, obj, root=0):
    """Rank `root`'s `obj` (any picklable object) on every rank of `comm`,
    pickled and broadcast as bytes. Collective."""
    data = _broadcast_bytes(comm, pickle.dumps(obj) if comm.rank == root else b"", root)
    return obj if comm.rank == root else pickle.loads(data)


class _Elastic:
    """DistributedDataParallel's side of a lost rank replaced in the running
    job. The survivors call reform() after the error that named the lost
    rank; the replacement (started by collie-run --elastic with
    COLLIE_JOIN=1, whose collie.connect() joins) builds its wrapper as at
    the start, and finds rank 0's object in `handed_over`."""

    handed_over = None
    joined = False  # this wrapper took the survivors' hand-over at construction

    def reform(self, state=None, world=None, wait=0.0, attempts=10):
        """After a collie.Error whose code is "peer_lost" (a rank died under
        the step): re-forms this wrapper in place on a new communicator of
        the survivors grown back to `world` ranks (default: the job's
        communicator's size when the wrapper was built)
        by the processes that join (collie-run --elastic starts each lost
        rank again). The reducer's state (bucket layout, iteration, the comm
        hook's state) goes to the newcomers from memory, rank 0's parameters
        and buffers to every rank, as at construction. Returns rank 0's
        `state` (any picklable object: the step to redo, the optimizer's
        state_dict) on every rank; a newcomer finds it in `handed_over`.
        A newcomer's wrapper has `joined` set (its `handed_over` is None
        when the survivors handed None). The step that failed is not taken:
        do it again. A rank lost during
        the re-form itself (a newcomer killed as it joins, another survivor)
        is one more to replace: the survivors start again from the
        communicator they have, up to `attempts` times. `ddp.comm` is the new
        communicator (the wrapper closes it with itself); the old one is
        left to its owner. Collective over the survivors and the joiners."""
        if world is None:
            world = self._world
        # What this rank hands over, each try: its reducer's state, or, for a
        # newcomer lost again before its first forward loaded what it was
        # handed, nothing (it takes rank 0's, as a joiner does).
        mine = None
        if getattr(self, "_handoff_to_load", None) is None:
            done = ctypes.c_uint64(0)
            check(lib.collie_reducer_iterations(self._h, ctypes.byref(done)))
            mine = (self._save_reducer_state(), done.value)
        self._handoff_to_load = None
        comm, tried = self._comm, 0
        while True:
            try:
                comm = comm.shrink(wait=wait)
                if world > comm.size:
                    comm = comm.grow(world - comm.size, wait=wait)
                handed = _handoff(mine, comm)
                extra = broadcast_object(comm, state)
                if self._h:
                    self._release()
                owns = self._adopt(comm)
                if self._owns_comm and self._comm is not comm:
                    self._comm.close()
                self._comm, self._owns_comm = comm, owns
                self._build()
                self.load_handoff(handed)
                break
            except _lib.Error as e:
                tried += 1
                if e.code != "peer_lost" or tried >= attempts:
                    raise
                warnings.warn(f"reform: a rank was lost while re-forming ({e}); starting again "
                              f"({tried} of {attempts})")
        self.handed_over = extra
        return extra

    def _adopt(self, comm):
        """The re-formed communicator's owner: when the wrapper's was the
        process's default communicator (collie.default_communicator(), which
        the averagers and collie.distributed's groups use too), the new one
        takes its place there; else the wrapper owns it. The old one, dead,
        is not closed here (an averager or a torch.distributed group may
        still hold it): it closes with its last holder. Returns whether the
        wrapper owns the new one."""
        import collie
        with collie._default_lock:
            if collie._default is not None and collie._default is self._comm:
                # Not closed here: an averager or a torch.distributed group
                # may still hold it; it closes when the last holder lets go.
                collie._default = comm
                return False
        return True

    def _take_handoff(self):
        """At construction on a communicator that joined a running job: the
        joiner's half of the survivors' reform() (the reducer state it
        loads after the build, rank 0's object in `handed_over`); None on
        any other communicator."""
        # The size to grow back to: this communicator's (the job's, for the
        # default one), not the launch's (a wrapper on a subgroup).
        self._world = self._comm.size
        if not getattr(self._comm, "_handoff_pending", False):
            return None
        self._comm._handoff_pending = False
        handed = _handoff(None, self._comm)
        self.handed_over = broadcast_object(self._comm, None)
        self.joined = True
        return handed
