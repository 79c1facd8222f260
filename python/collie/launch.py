"""Starting a job's ranks from inside Python.

    collie.spawn(train, args=(cfg,), nprocs=2)                  # like torch.multiprocessing.spawn
    collie.spawn(train, nprocs=2, start_method="fork")          # from a notebook (Lightning's ddp_notebook)

Each process runs fn(rank, *args) with collie's launch variables set (and
torchrun's, on another port, for code that also uses torch.distributed), so
collie.connect() and collie.torch.DistributedDataParallel need no arguments.
When a rank fails, the others get a moment to report their own error, are
then stopped, and the first failure is raised here with its traceback.
"""
import io
import multiprocessing
import os
import secrets
import socket
import sys
import time
import traceback

__all__ = ["spawn", "start_processes", "ProcessFailed"]


class ProcessFailed(RuntimeError):
    """A rank started by spawn() failed: `rank`, `exitcode`, and the
    traceback it raised (when it raised one)."""

    def __init__(self, rank, exitcode, tb):
        how = f"exited with status {exitcode}" if exitcode >= 0 else f"was killed by signal {-exitcode}"
        super().__init__(f"collie.spawn: rank {rank} {how}" + (f":\n{tb}" if tb else ""))
        self.rank, self.exitcode, self.traceback = rank, exitcode, tb


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, args, env, errors):
    # Whole lines: the ranks share the parent's stdout and stderr, and a
    # line written in pieces would interleave with another rank's.
    # (Under PYTHONUNBUFFERED print writes the text and the newline apart.)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            setattr(sys, name, io.TextIOWrapper(open(stream.fileno(), "wb", closefd=False),
                                                encoding=stream.encoding, errors=stream.errors,
                                                line_buffering=True))
        except (AttributeError, OSError, ValueError):
            pass  # not a file (captured, redirected in-process): leave it
    os.environ.update(env)
    os.environ.update({"COLLIE_RANK": str(rank), "COLLIE_LOCAL_RANK": str(rank),
                       "RANK": str(rank), "LOCAL_RANK": str(rank)})
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        pass
    except BaseException:  # noqa: BLE001 - sent to the parent, then the child fails
        errors.put((rank, traceback.format_exc()))
        raise SystemExit(1)


def start_processes(fn, args=(), nprocs=1, join=True, start_method="spawn"):
    """Starts nprocs processes running fn(rank, *args); with join, waits for
    them all and raises ProcessFailed for the first that fails. Returns the
    processes when join is False."""
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, not {nprocs}")
    ctx = multiprocessing.get_context(start_method)
    env = {"COLLIE_WORLD_SIZE": str(nprocs), "COLLIE_LOCAL_WORLD_SIZE": str(nprocs),
           "COLLIE_MASTER_ADDR": "127.0.0.1", "COLLIE_MASTER_PORT": str(_free_port()),
           "COLLIE_JOB_SECRET": secrets.token_hex(16), "WORLD_SIZE": str(nprocs),
           "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_child, args=(fn, r, args, env, errors), daemon=False)
             for r in range(nprocs)]
    for p in procs:
        p.start()
    if not join:
        return procs
    failed = None
    stop_at = None
    while any(p.is_alive() for p in procs):
        for r, p in enumerate(procs):
            if failed is None and not p.is_alive() and p.exitcode != 0:
                failed = (r, p.exitcode)
                stop_at = time.monotonic() + 1.0  # the others: a moment to say why
        if stop_at is not None and time.monotonic() >= stop_at:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            stop_at = None
        time.sleep(0.01)
    for p in procs:
        p.join()
    if failed is None:
        for r, p in enumerate(procs):
            if p.exitcode != 0:
                failed = (r, p.exitcode)
                break
    if failed is None:
        return None
    tracebacks = {}
    while not errors.empty():
        r, tb = errors.get()
        tracebacks[r] = tb
    raise ProcessFailed(failed[0], failed[1], tracebacks.get(failed[0], ""))


def spawn(fn, args=(), nprocs=1, join=True, start_method="spawn"):
    """torch.multiprocessing.spawn's signature: runs fn(rank, *args) on
    nprocs processes of one collie job. start_method="fork" works from a
    notebook, where fn cannot be pickled."""
    return start_processes(fn, args, nprocs, join, start_method)
