"""Compression hooks for PyTorch's own DistributedDataParallel:
collie.distributed.fp16_compress_hook and bf16_compress_hook, drop-in for
PyTorch's default_hooks.fp16_compress_hook and bf16_compress_hook.

    ddp.register_comm_hook(group, collie.distributed.fp16_compress_hook)

The same arithmetic as PyTorch's (the bucket divided by the world size,
sent and summed in the narrow type, widened back into the bucket), with
collie's kernels for the two conversions (F16C where the CPU has it; one
rounding, where PyTorch rounds the conversion and then the division) and,
over a collie group, the compressed bucket kept in collie's communication
memory from one step to the next, which shm all-reduces in place. PyTorch's
own hook spends most of its time in its conversions on the CPU
(`bench/RESULTS.md`). Over any other group the conversions are still
collie's and the all-reduce the group's; CUDA buckets go to PyTorch's own
hook.
"""
import threading

import torch
import torch.distributed as dist

from ._lib import check, lib

__all__ = ["fp16_compress_hook", "bf16_compress_hook"]


def _convert(src, dst, divisor=1):
    """dst = src / divisor, each a contiguous host tensor of a float type,
    in collie's kernel (the GIL released while it runs)."""
    from . import as_tensor
    check(lib.collie_convert(as_tensor(src), as_tensor(dst), divisor))


_scratch_lock = threading.Lock()


def _scratch(group, index, numel, dtype):
    """A compressed bucket for bucket `index` and a function that gives it
    back once its all-reduce has ended. Over a collie group, a tensor in the
    group's communication memory, kept for the next step: one per bucket in
    flight, so that DDP models reducing in the same backward pass (each with
    a bucket 0 of its size) do not share one. Over other groups a new
    tensor each time."""
    from .distributed import backend_of
    pg = backend_of(group)
    if pg is None:
        return torch.empty(numel, dtype=dtype), lambda: None
    with _scratch_lock:
        # (index, dtype, numel) -> [[tensor, in flight], ...]; a layout DDP
        # rebuilt leaves its first buckets' entries, one set per layout.
        pool = pg.__dict__.setdefault("_hook_scratch", {}).setdefault((index, dtype, numel), [])
        entry = next((e for e in pool if not e[1]), None)
        if entry is None:
            from ._ddp_parts import comm_memory
            size = torch.empty((), dtype=dtype).element_size()
            entry = [comm_memory(pg.comm, max(1, numel * size))[:numel * size].view(dtype), False]
            pool.append(entry)
        entry[1] = True

    def release():
        with _scratch_lock:
            entry[1] = False

    return entry[0], release


def _compress_hook(dtype, torch_hook, state, bucket):
    group = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    if not buffer.is_cpu or buffer.dtype != torch.float32:
        return torch_hook(state, bucket)
    world = dist.get_world_size(group)
    small, release = _scratch(group, bucket.index(), buffer.numel(), dtype)
    try:
        _convert(buffer, small, world)
        fut = dist.all_reduce(small, group=group, async_op=True).get_future()
    except BaseException:
        release()
        raise

    def decompress(f):
        try:
            _convert(f.value()[0], buffer)
        finally:
            release()
        return buffer

    return fut.then(decompress)


def fp16_compress_hook(state, bucket):
    """PyTorch's fp16_compress_hook, its conversions collie's: `state` is
    the process group (None: the default group); returns a Future of the
    averaged bucket."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return _compress_hook(torch.float16, default_hooks.fp16_compress_hook, state, bucket)


def bf16_compress_hook(state, bucket):
    """PyTorch's bf16_compress_hook, its conversions collie's (see
    fp16_compress_hook). Unlike PyTorch's, it runs on a PyTorch without
    CUDA (Debian's 1.13, CPU wheels)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return _compress_hook(torch.bfloat16, default_hooks.bf16_compress_hook, state, bucket)


# PyTorch's DDP refuses a hook named bf16_compress_hook unless it was built
# with CUDA 11+ and NCCL 2.10+ (its _check_comm_hook, by name), whatever the
# buckets' device: these go by names of their own, also in DDP's logs.
for _hook in (fp16_compress_hook, bf16_compress_hook):
    _hook.__name__ = _hook.__qualname__ = "collie_" + _hook.__name__
# Pickled by those names, as PyTorch's hooks are by theirs.
collie_fp16_compress_hook, collie_bf16_compress_hook = fp16_compress_hook, bf16_compress_hook
