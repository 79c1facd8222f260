"""collie's communication memory for PyTorch's own DDP over the "collie"
backend: the C++ backend in _comm_memory_ext.cc, built against the running
PyTorch the first time a group needs it, then loaded from the cache.

PyTorch's reducer (2.x of late) allocates its gradient buckets through the
group's default backend where that backend offers memory for collectives
and DDP_DISABLE_COMM_MEM=0 (PyTorch's default is 1). On shm an all-reduce
whose buffer is such memory on every rank runs in place, reading the
peers' buckets through a shared mapping instead of process_vm_readv: about
2.3 x faster for a 64 MiB bucket on this project's machine
(bench/RESULTS.md). A collie group therefore sets DDP_DISABLE_COMM_MEM=0
unless it is set already (DDP_DISABLE_COMM_MEM=1 keeps PyTorch's own
allocation; it is PyTorch's variable, and PyTorch's NCCL groups in the
process read it too).

The module is built once per PyTorch version and source, with
torch.utils.cpp_extension (a C++ compiler and ninja; about 20 s), under
$XDG_CACHE_HOME/collie/torch_ext (COLLIE_TORCH_EXT_CACHE);
scripts/setup_python.sh builds it for the PyPI PyTorches. Where it cannot
be built, or PyTorch has no such hook (1.13, 2.1), DDP's buckets stay in
PyTorch's memory, as before, with one warning saying why.
"""
import ctypes
import hashlib
import logging
import os
import threading
import warnings

import torch

__all__ = ["supported", "build", "backend", "allocations"]

_NAME = "collie_comm_memory"
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_comm_memory_ext.cc")
_lock = threading.Lock()
_module = None
_failed = None  # why the module could not be had, once known


def supported():
    """Whether this PyTorch's backends can offer DDP memory: its reducer
    asks since pytorch/pytorch#146589 (2025); collie answers where the
    Python binding of c10d::Backend has supports_tensor_alloc (2.15 here;
    not 1.13 or 2.1)."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    backend = getattr(c10d, "Backend", None)
    return backend is not None and hasattr(backend, "supports_tensor_alloc")


def _directory():
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    root = os.environ.get("COLLIE_TORCH_EXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "collie", "torch_ext")
    return os.path.join(root, f"{torch.__version__.replace('+', '_')}-{digest}")


def build(verbose=False):
    """The extension module, built first if this PyTorch has none yet.
    torch.utils.cpp_extension.load builds under a file lock in the cache
    directory (ranks starting together build it once, and none loads a
    half-written file), and where the module is built it only loads it."""
    global _module
    with _lock:
        if _module is None:
            # Importing cpp_extension logs a warning on machines with a CUDA
            # toolkit and no GPU ("No CUDA runtime is found"): not ours to show.
            quiet = logging.getLogger("torch.utils.cpp_extension")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                from torch.utils.cpp_extension import load
            finally:
                quiet.setLevel(level)
            directory = _directory()
            os.makedirs(directory, exist_ok=True)
            _module = load(name=_NAME, sources=[_SOURCE], build_directory=directory,
                           extra_cflags=["-O2"], verbose=verbose)
        return _module


def backend(comm, rank, size):
    """A c10d backend offering `comm`'s memory to PyTorch's DDP, or None
    where this PyTorch cannot use one, DDP_DISABLE_COMM_MEM=1 turns it off,
    or the module cannot be built (warned once)."""
    global _failed
    if not supported() or os.environ.get("DDP_DISABLE_COMM_MEM", "0") != "0":
        return None
    if _failed is not None:
        return None
    try:
        module = build()
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a failed build
        _failed = f"{type(e).__name__}: {e}".splitlines()[0]
        warnings.warn("collie: PyTorch's DDP keeps its buckets in PyTorch's memory (slower "
                      "all-reduces on shm): the module giving it collie's memory could not be "
                      f"built ({_failed})", RuntimeWarning, stacklevel=3)
        return None
    from ._lib import lib
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    made = module.make(rank, size, comm.handle.value, address(lib.collie_comm_mem_alloc),
                       address(lib.collie_mem_free))
    comm._on_close.append(lambda: module.detach(made))
    os.environ.setdefault("DDP_DISABLE_COMM_MEM", "0")
    return made


def allocations():
    """Buckets this process has allocated in collie's memory so far
    (None where the module is not loaded)."""
    return None if _module is None else _module.allocations()
