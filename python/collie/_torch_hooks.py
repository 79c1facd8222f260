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
import torch
import torch.distributed as dist

from ._lib import check, lib

__all__ = ["fp16_compress_hook", "bf16_compress_hook"]


def _convert(src, dst, divisor=1):
    """dst = src / divisor, each a contiguous host tensor of a float type,
    in collie's kernel (the GIL released while it runs)."""
    from . import as_tensor
    check(lib.collie_convert(as_tensor(src), as_tensor(dst), divisor))


def _scratch(group, index, numel, dtype):
    """The compressed bucket `index`: over a collie group, a tensor in the
    group's communication memory kept for the next step (made again when
    DDP rebuilds its buckets with another size); else a new tensor."""
    from .distributed import backend_of
    pg = backend_of(group)
    if pg is None:
        return torch.empty(numel, dtype=dtype)
    kept = pg.__dict__.setdefault("_hook_scratch", {})
    t = kept.get((index, dtype))
    if t is None or t.numel() != numel:
        from ._ddp_parts import comm_memory
        size = torch.empty((), dtype=dtype).element_size()
        t = comm_memory(pg.comm, max(1, numel * size))[:numel * size].view(dtype)
        kept[(index, dtype)] = t
    return t


def _compress_hook(dtype, torch_hook, state, bucket):
    group = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    if not buffer.is_cpu or buffer.dtype != torch.float32:
        return torch_hook(state, bucket)
    world = dist.get_world_size(group)
    small = _scratch(group, bucket.index(), buffer.numel(), dtype)
    _convert(buffer, small, world)
    fut = dist.all_reduce(small, group=group, async_op=True).get_future()

    def decompress(f):
        _convert(f.value()[0], buffer)
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
