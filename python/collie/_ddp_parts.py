"""What collie.torch's DistributedDataParallel is built of: bucket memory
as torch tensors (_Arenas), the GradBucket a Python comm hook gets, the
autograd node that starts the reducer's backward (_Sink), the mapping of
PyTorch's built-in comm hooks to collie's, the checks of the communicator
and process group a user passes, and PyTorch's DDP options collie refuses.
"""
import ctypes
import weakref

import torch
from torch.distributed.algorithms.join import JoinHook

from . import _lib
from ._lib import check, lib


def _eager_under_compile(fn):
    """The wrapper's forward runs eagerly under torch.compile (its ctypes
    calls and autograd Function are not for TorchDynamo), while the module
    it calls is compiled, as PyTorch's DDP's forward is treated."""
    disable = getattr(torch, "_disable_dynamo", None)
    return disable(fn, recursive=False) if disable is not None else fn

_DTYPES = {torch.float32: _lib.F32, torch.float64: _lib.F64, torch.float16: _lib.F16,
           torch.bfloat16: _lib.BF16, torch.int32: _lib.I32, torch.int64: _lib.I64,
           torch.uint8: _lib.U8}
_TORCH_OF = {v: k for k, v in _DTYPES.items()}
_MiB = 1 << 20


def _bytes_of(t):
    """A tensor's elements as a flat uint8 tensor: a view where it is
    contiguous, else a copy. What a broadcast moves for a dtype collie does
    not reduce (int8, bool, complex, ...): a broadcast only copies."""
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def _broadcast_buffers(comm, module, root):
    """`root`'s buffers (BatchNorm's running statistics and step count,
    masks, ...) to every rank, one broadcast of their bytes per device,
    whatever their dtypes, as PyTorch's DDP moves every buffer."""
    by_device = {}
    for b in module.buffers():
        if b.numel():
            by_device.setdefault(b.device, []).append(b)
    for group in by_device.values():
        # Widest elements first: each buffer's bytes then start at a multiple
        # of its element size, where they can be viewed as its dtype.
        group.sort(key=lambda b: -b.element_size())
        flat = torch.cat([_bytes_of(b.detach()) for b in group])
        comm.broadcast(flat, root=root)
        at = 0
        with torch.no_grad():
            for b in group:
                n = b.numel() * b.element_size()
                b.copy_(flat[at:at + n].view(b.dtype).view(b.shape))
                at += n


def comm_memory(comm, nbytes):
    """`nbytes` of `comm`'s communication memory (collie_comm_mem_alloc:
    zeroed, 64-byte aligned; on shm the peers map it and an all-reduce runs
    in place) as a uint8 tensor, freed when the last tensor over it goes."""
    ptr = ctypes.c_void_p()
    check(lib.collie_comm_mem_alloc(comm.handle, nbytes, ctypes.byref(ptr)))
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
    weakref.finalize(buf, lib.collie_mem_free, ptr.value)
    return torch.frombuffer(buf, dtype=torch.uint8)


class _Arenas:
    """Bucket memory as torch tensors, so param.grad can be a view of it and a
    hook gets the bucket as a tensor on its device. Host buckets come from
    the communicator (collie_comm_mem_alloc: on shm the peers map them and
    the all-reduce runs in place, with no copy through the segment), wrapped
    by torch.frombuffer; the memory is freed when the last tensor over it
    goes. Device buckets come from PyTorch's allocator."""

    def __init__(self, comm=None):
        self.comm = comm
        self.live = {}  # aligned address -> (uint8 tensor, offset of the address in it)
        self._allocate_cb = _lib.ALLOCATE_FN(self._allocate)
        self._release_cb = _lib.RELEASE_FN(self._release)
        self.struct = _lib.Allocator(ctypes.sizeof(_lib.Allocator), _lib.STRUCT_TAG,
                                     self._allocate_cb, self._release_cb, None)

    def _allocate(self, _user, nbytes, _dtype, device_type, device_index):
        try:
            if device_type == _lib.CPU and self.comm is not None:
                t = comm_memory(self.comm, nbytes)
                self.live[t.data_ptr()] = (t, 0)
                return t.data_ptr()
            device = "cpu" if device_type == _lib.CPU else f"cuda:{device_index}"
            t = torch.zeros(nbytes + 64, dtype=torch.uint8, device=device)
            off = (-t.data_ptr()) % 64
            self.live[t.data_ptr() + off] = (t, off)
            return t.data_ptr() + off
        except Exception:  # noqa: BLE001 - collie reports a NULL as out of memory
            return None

    def _release(self, _user, ptr, _nbytes, _device_type, _device_index):
        self.live.pop(ptr, None)

    def view(self, addr, numel, dtype, shape=None):
        """A tensor of `numel` `dtype` elements over bucket memory at `addr`."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        for base, (t, off) in self.live.items():
            if base <= addr and addr + nbytes <= base + t.numel() - off:
                start = addr - base + off
                flat = t[start:start + nbytes].view(dtype)
                return flat.view(shape) if shape is not None else flat
        raise _lib.error("internal", "collie.torch: bucket memory outside every arena")


class GradBucket:
    """What a Python comm hook gets, with the methods of PyTorch's
    GradBucket: buffer() is the flat bucket (leave the average there, or
    return it), gradients() are views of it shaped like parameters().
    `comm` is collie's communicator, for hooks written against collie."""

    def __init__(self, index, buffer, grads, params, is_last, comm):
        self._index, self._buffer, self._grads, self._params = index, buffer, grads, params
        self._is_last, self.comm = is_last, comm

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._grads

    def parameters(self):
        return self._params

    def is_last(self):
        return self._is_last

    def set_buffer(self, tensor):
        self._buffer.copy_(tensor)


class _Sink(torch.autograd.Function):
    """Identity on the module's outputs: its backward is the first node of
    the backward pass, where the reducer is prepared and the end-of-backward
    callback is queued on the outer graph task (not a reentrant checkpoint's
    inner one)."""

    @staticmethod
    def forward(ctx, ddp, *outputs):
        ctx.ddp = ddp
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.ddp._start_backward()
        return (None,) + grads


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        mapped = [_map_tensors(o, fn) for o in obj]
        return type(obj)(*mapped) if hasattr(obj, "_fields") else type(obj)(mapped)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, fn)) for k, v in obj.items())
    return obj


def _builtin_spec(state, hook):
    """collie's spec for one of PyTorch's built-in hooks (or
    collie.distributed's, which are theirs for PyTorch's own DDP), or None."""
    module = getattr(hook, "__module__", "") or ""
    name = getattr(hook, "__name__", "")
    if module == "collie._torch_hooks" and name.startswith("collie_"):
        return {"collie_fp16_compress_hook": "fp16",
                "collie_bf16_compress_hook": "bf16"}.get(name)
    if not module.startswith("torch.distributed.algorithms.ddp_comm_hooks"):
        return None
    simple = {"allreduce_hook": "allreduce", "fp16_compress_hook": "fp16",
              "bf16_compress_hook": "bf16", "noop_hook": "noop"}
    if name in simple:
        return simple[name]
    if name in ("powerSGD_hook", "batched_powerSGD_hook") and state is not None:
        spec = "powersgd" if name == "powerSGD_hook" else "batched_powersgd"
        return (f"{spec}:rank={state.matrix_approximation_rank},"
                f"start_iter={state.start_powerSGD_iter},"
                # collie never compresses a matrix into more bytes than it
                # has: rates below 1 mean the same as 1.
                f"min_compression_rate={max(1.0, float(state.min_compression_rate))},"
                f"error_feedback={int(state.use_error_feedback)},warm_start={int(state.warm_start)},"
                f"orthogonalization_epsilon={state.orthogonalization_epsilon}")
    if name == "post_localSGD_hook" and state is not None:
        # PyTorch's default subgroup (None) is each host's ranks.
        sub = state.subgroup
        size = "host" if sub is None else str(sub.size())
        return f"post_local_sgd:start_iter={state.start_localSGD_iter},subgroup={size}"
    return None


def _as_uint8(raw):
    """Bytes as a uint8 tensor: what torch.load(weights_only=True) accepts
    in a checkpoint (it refuses bytes)."""
    t = torch.empty(len(raw), dtype=torch.uint8)
    if raw:
        t.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return t


def _as_bytes(state):
    """A saved reducer state as bytes: a uint8 tensor, or the bytes that
    earlier versions saved."""
    if isinstance(state, torch.Tensor):
        return state.contiguous().numpy().tobytes() if state.numel() else b""
    return bytes(state)


def _check_torch_world(comm):
    """A communicator given by the user must be torch.distributed's world
    when that is initialised: a world of one beside a job of two (ranks
    started by hand, a communicator connected before init_process_group)
    would train every rank alone without an error."""
    from ._torch_world import torch_world
    from . import world_mismatch
    world = torch_world()
    if world is not None and comm.size == 1 and world[1] > 1:
        raise _lib.error("invalid_argument", world_mismatch(comm, world))


def _check_process_group(group, comm):
    """A torch.distributed group passed as process_group: collie reduces over
    its own communicator, so the group must be the same ranks, the whole
    job. A subgroup would have been silently widened to every rank."""
    import torch.distributed as dist
    why = None
    try:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
    except Exception as e:  # not initialized, or not a group
        size, rank, why = None, None, f"{type(e).__name__}: {e}"
    if why is None and (size != comm.size or rank != comm.rank):
        why = (f"its size is {size} and this process is its rank {rank}; collie's "
               f"communicator's size is {comm.size} and this process is its rank {comm.rank}")
    if why is not None:
        raise _lib.error("invalid_argument",
                    "collie.torch.DistributedDataParallel: process_group is a torch.distributed "
                    f"group that is not the whole job ({why}). collie reduces over its own "
                    "communicator: for a subgroup pass "
                    "comm=collie.default_communicator().split(color, key), "
                    "or a collie.Communicator as process_group")


# PyTorch's DDP options that collie's does not have, and why: refused when
# set (to anything but their defaults), never ignored.
REFUSED_OPTIONS = {
    "delay_all_reduce_named_params": "collie reduces every parameter in its bucket as backward "
                                     "produces it",
    "param_to_hook_all_reduce": "collie reduces every parameter in its bucket as backward "
                                "produces it",
    "mixed_precision": "cast the model yourself, or reduce in fp16/bf16 with comm_hook='fp16' "
                       "or 'bf16'",
    "device_mesh": "pass comm= (a collie.Communicator, or one split from "
                   "collie.default_communicator())",
    "skip_all_reduce_unused_params": "unused parameters travel as zeros, as by default in "
                                     "PyTorch",
    "bucket_cap_mb_list": "give bucket_cap_mb and first_bucket_cap_mb",
}


class _JoinHook(JoinHook):
    """collie's wrapper in PyTorch's Join: shadow steps, then the final
    model."""

    def __init__(self, ddp):
        self.ddp = ddp

    def main_hook(self):
        self.ddp._exchange_sync(False)
        self.ddp._shadow_step()

    def post_hook(self, is_last_joiner):
        self.ddp._sync_final_model()
