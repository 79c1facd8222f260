"""ctypes bindings of collie's C ABI (include/collie/collie.h, ABI_VERSION below).

Loading libcollie: $COLLIE_LIBRARY (a path) if set; else the library that
meson install put in <prefix>/<libdir> with this package; else one in a lib
folder above the package; else the dynamic loader's search path.
No PyTorch or C headers are needed, so one package serves every PyTorch.
"""
import ctypes
import ctypes.util
import importlib.util
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

ABI_VERSION = 5  # collie_convert
STRUCT_TAG = 0x434C0000 | ABI_VERSION

# collie_status
OK, IN_PROGRESS = 0, 8
ERR_INTERNAL = 6
CODES = {1: "timeout", 2: "peer_lost", 3: "invalid_argument", 4: "mismatch",
         5: "unavailable", 6: "internal", 7: "aborted"}

# collie_dtype, collie_op, collie_device_type
F32, F64, F16, BF16, I32, I64, U8, I8 = range(8)
OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}
CPU, CUDA = 0, 1


class Error(RuntimeError):
    """A collie error: `code` says what kind ("peer_lost", "timeout",
    "mismatch", ...), the message says what happened, which rank, and what
    to change."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Tensor(Structure):
    _fields_ = [("data", c_void_p), ("numel", c_uint64), ("dtype", c_int32),
                ("device_type", c_int32), ("device_index", c_int32)]


class CommOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("struct_tag", c_uint32), ("rank", c_int32),
                ("world_size", c_int32), ("master_addr", c_char_p), ("master_port", c_int32),
                ("local_rank", c_int32), ("backend", c_char_p), ("timeout_seconds", c_double),
                ("local_world_size", c_int32), ("reserved0", c_int32), ("secret", c_char_p),
                ("deterministic", c_int32), ("reserved1", c_int32)]


ALLOCATE_FN = CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_int32, c_int32, c_int32)
RELEASE_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_size_t, c_int32, c_int32)


class Allocator(Structure):
    _fields_ = [("struct_size", c_uint32), ("struct_tag", c_uint32), ("allocate", ALLOCATE_FN),
                ("release", RELEASE_FN), ("user", c_void_p)]


class ReducerOptions(Structure):
    _fields_ = [("struct_size", c_uint32), ("struct_tag", c_uint32),
                ("first_bucket_bytes", c_uint64), ("bucket_bytes", c_uint64),
                ("gradient_as_bucket_view", c_int32), ("find_unused_parameters", c_int32),
                ("static_graph", c_int32), ("broadcast_parameters", c_int32),
                ("comm_hook", c_char_p), ("param_rows", POINTER(c_uint64)),
                ("bucket_allocator", POINTER(Allocator)), ("rebuild_buckets", c_int32),
                ("reserved0", c_int32), ("param_names", POINTER(c_char_p)),
                ("check_replicas", c_int64), ("check_nonfinite", c_int32),
                ("check_warns", c_int32)]


class ReducerStats(Structure):
    _fields_ = [("struct_size", c_uint32), ("struct_tag", c_uint32), ("iteration", c_uint64),
                ("backward_us", c_double), ("exposed_us", c_double), ("comm_us_total", c_double),
                ("num_buckets", c_uint32), ("gradient_bytes", c_uint64), ("hook_bytes", c_uint64),
                ("layout_generation", c_uint64)]


class GradBucket(Structure):
    _fields_ = [("index", c_uint64), ("buffer", Tensor), ("num_grads", c_uint64),
                ("grads", POINTER(Tensor)), ("params", POINTER(Tensor)), ("rows", POINTER(c_uint64)),
                ("is_last", c_int32), ("iteration", c_uint64)]


HOOK_FN = CFUNCTYPE(None, c_void_p, c_void_p, POINTER(GradBucket), c_void_p)
WORK_CALLBACK = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


def _find_library():
    explicit = os.environ.get("COLLIE_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # written by meson install
        from ._installed import LIBDIR
        for name in ("libcollie.so.0", "libcollie.so"):
            if os.path.exists(os.path.join(LIBDIR, name)):
                return os.path.join(LIBDIR, name)
    except ImportError:
        pass
    # <prefix>/lib/python3/dist-packages/collie -> <prefix>/lib
    for up in (3, 4):
        libdir = os.path.normpath(os.path.join(here, *[".."] * up))
        for name in ("libcollie.so.0", "libcollie.so"):
            if os.path.exists(os.path.join(libdir, name)):
                return os.path.join(libdir, name)
    return ctypes.util.find_library("collie") or "libcollie.so.0"


def _torch_first():
    """Imports PyTorch, when it is installed, before libcollie is loaded.
    A libcollie built with CUDA links libcudart.so.13 and libnccl.so.2 from
    the toolkit it was built against; PyPI's torch brings its own, newer
    copies under the same names, and a process holds one library per name:
    loaded first, collie's older NCCL left torch without the symbols it
    needs (`import collie; import torch` failed with "undefined symbol:
    ncclCommResume"). Loaded second, libcollie binds to torch's copies,
    which are newer and keep the ABI collie was built against."""
    if "torch" in sys.modules:
        return
    try:
        if importlib.util.find_spec("torch") is None:
            return
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken torch is the user's to see when they use it
        pass


def _load():
    _torch_first()
    path = _find_library()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"collie: cannot load the collie library ({path}): {e}. Install collie (README.md, "
            "'Using it'), or point COLLIE_LIBRARY at libcollie.so.0") from None
    T = Tensor
    pc, pw, pr = POINTER(c_void_p), POINTER(c_void_p), POINTER(c_void_p)
    sig = {
        "collie_last_error": (c_char_p, []),
        "collie_abi_version": (c_int, []),
        "collie_comm_connect": (c_int, [POINTER(CommOptions), pc]),
        "collie_comm_destroy": (c_int, [c_void_p]),
        "collie_comm_rank": (c_int, [c_void_p, POINTER(c_int)]),
        "collie_comm_size": (c_int, [c_void_p, POINTER(c_int)]),
        "collie_comm_backend": (c_int, [c_void_p, POINTER(c_char_p)]),
        "collie_comm_allreduce": (c_int, [c_void_p, T, T, c_int, pw]),
        "collie_comm_broadcast": (c_int, [c_void_p, T, c_int, pw]),
        "collie_comm_allgather": (c_int, [c_void_p, T, T, pw]),
        "collie_comm_reduce_scatter": (c_int, [c_void_p, T, T, c_int, pw]),
        "collie_comm_alltoall": (c_int, [c_void_p, T, T, pw]),
        "collie_comm_alltoallv": (c_int, [c_void_p, T, POINTER(c_size_t), T, POINTER(c_size_t),
                                          pw]),
        "collie_comm_barrier": (c_int, [c_void_p, pw]),
        "collie_comm_arrivals": (c_int, [c_void_p, POINTER(c_uint64),
                                         POINTER(c_uint64), POINTER(c_double),
                                         c_char_p, c_size_t]),
        "collie_comm_send": (c_int, [c_void_p, T, c_int, c_int, pw]),
        "collie_comm_recv": (c_int, [c_void_p, T, c_int, c_int, pw]),
        "collie_comm_split": (c_int, [c_void_p, c_int, c_int, pc]),
        "collie_comm_shrink": (c_int, [c_void_p, POINTER(c_int), c_size_t, c_int, pc]),
        "collie_comm_grow": (c_int, [c_void_p, c_int, c_int, pc]),
        "collie_comm_join": (c_int, [c_void_p, pc]),
        "collie_comm_joined": (c_int, [c_void_p, POINTER(c_int)]),
        "collie_comm_abort": (c_int, [c_void_p, c_char_p]),
        "collie_comm_get_async_error": (c_int, [c_void_p]),
        "collie_comm_mem_alloc": (c_int, [c_void_p, c_size_t, POINTER(c_void_p)]),
        "collie_mem_free": (c_int, [c_void_p]),
        "collie_convert": (c_int, [T, T, c_int]),
        "collie_work_wait": (c_int, [c_void_p]),
        "collie_work_wait_for": (c_int, [c_void_p, c_double]),
        "collie_work_query": (c_int, [c_void_p]),
        "collie_work_wait_stream": (c_int, [c_void_p, c_void_p]),
        "collie_set_cuda_stream": (c_int, [c_void_p]),
        "collie_work_free": (c_int, [c_void_p]),
        "collie_work_on_complete": (c_int, [c_void_p, WORK_CALLBACK, c_void_p]),
        "collie_reducer_create": (c_int, [c_void_p, POINTER(T), POINTER(T), c_size_t,
                                          POINTER(ReducerOptions), pr]),
        "collie_reducer_destroy": (c_int, [c_void_p]),
        "collie_reducer_prepare": (c_int, [c_void_p, POINTER(c_uint8), c_size_t]),
        "collie_reducer_mark_ready": (c_int, [c_void_p, c_size_t]),
        "collie_reducer_mark_ready_grad": (c_int, [c_void_p, c_size_t, T]),
        "collie_reducer_set_grad": (c_int, [c_void_p, c_size_t, POINTER(T)]),
        "collie_reducer_finalize": (c_int, [c_void_p]),
        "collie_reducer_join_step": (c_int, [c_void_p]),
        "collie_reducer_param_use": (c_int, [c_void_p, POINTER(c_uint8), c_size_t]),
        "collie_reducer_bucket_grad": (c_int, [c_void_p, c_size_t, POINTER(T)]),
        "collie_reducer_set_static_graph": (c_int, [c_void_p]),
        "collie_reducer_grad_view": (c_int, [c_void_p, c_size_t, POINTER(T)]),
        "collie_reducer_layout_generation": (c_int, [c_void_p, POINTER(c_uint64)]),
        "collie_reducer_set_no_sync": (c_int, [c_void_p, c_int]),
        "collie_reducer_set_comm_hook": (c_int, [c_void_p, c_char_p]),
        "collie_reducer_get_stats": (c_int, [c_void_p, POINTER(ReducerStats)]),
        "collie_reducer_save_state": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
        "collie_reducer_load_state": (c_int, [c_void_p, c_void_p, c_size_t]),
        "collie_reducer_iterations": (c_int, [c_void_p, POINTER(c_uint64)]),
        "collie_hook_register": (c_int, [c_char_p, HOOK_FN, c_void_p]),
        "collie_hook_complete": (c_int, [c_void_p, c_int, c_char_p]),
        "collie_hook_complete_after": (c_int, [c_void_p, c_void_p]),
        "collie_averager_create_periodic": (c_int, [c_void_p, c_uint64, c_uint64, pr]),
        "collie_averager_create_hierarchical": (c_int, [c_void_p, POINTER(c_uint64),
                                                        POINTER(c_int32), c_size_t, c_uint64, pr]),
        "collie_averager_average": (c_int, [c_void_p, POINTER(T), c_size_t]),
        "collie_averager_save_state": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
        "collie_averager_load_state": (c_int, [c_void_p, c_void_p, c_size_t]),
        "collie_averager_destroy": (c_int, [c_void_p]),
    }
    # The version first: an older library lacks the newer calls, and its
    # version says so better than the first missing name would.
    try:
        lib.collie_abi_version.restype, lib.collie_abi_version.argtypes = c_int, []
    except AttributeError:
        raise ImportError(f"collie: {path} is not a collie library (it has no "
                          "collie_abi_version); point COLLIE_LIBRARY at libcollie.so.0") from None
    if lib.collie_abi_version() < ABI_VERSION:
        raise ImportError(f"collie: {path} has ABI {lib.collie_abi_version()}; this package needs "
                          f"{ABI_VERSION} or later: install the library and the package of one "
                          "release (README.md, 'Using it')")
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"collie: {path} says ABI {lib.collie_abi_version()} but has no "
                              f"{name}: a library built from other sources than this package") from None
        f.restype, f.argtypes = res, args
    return lib


lib = _load()


# The class each error code raises: collie.Error, or (once collie.torch is
# imported) its subclasses that are torch.distributed's DistError and
# DistBackendError too, so that code catching PyTorch's errors catches
# collie's.
ERROR_CLASSES = {}


def error(code, message):
    """collie's error for `code` ("timeout", "peer_lost", ...)."""
    return ERROR_CLASSES.get(code, Error)(code, message)


def check(status):
    """Raises collie's error for a failed call (read at once: the message is
    the calling thread's)."""
    if status == OK or status == IN_PROGRESS:
        return status
    raise error(CODES.get(status, "internal"), lib.collie_last_error().decode(errors="replace"))
