"""collie.torch's DistributedDataParallel, its comm hooks: a collie spec by
name, PyTorch's built-in hooks mapped to collie's, or any callable
hook(state, bucket) called as PyTorch calls it, its result (a torch Future,
a collie Work, a tensor or None) handed back to the reducer. A mixin of the
wrapper (collie/torch.py), which holds the reducer it sets them on.
"""
import inspect

import torch

from . import Communicator, Work
from . import _lib
from ._ddp_parts import _TORCH_OF, GradBucket, _builtin_spec
from ._lib import check, lib


class _CommHooks:
    _hook_count = 0  # Python hooks registered in this process, for their names

    def register_comm_hook(self, state, hook):
        """`hook`: a collie spec ("fp16", "powersgd:rank=2,start_iter=10", ...);
        one of PyTorch's built-in hooks (mapped to collie's own); or any
        callable hook(state, bucket) as PyTorch calls it (see GradBucket)."""
        if self._synced_steps:
            raise _lib.error(
                "invalid_argument",
                f"rank {self._comm.rank}: register_comm_hook after {self._synced_steps} "
                "synchronised step(s): as with PyTorch's DDP, register the hook before the first "
                "backward, on every rank (ranks that switch hooks at different steps would "
                "reduce their buckets differently)")
        if isinstance(hook, str):
            spec = hook
        else:
            spec = _builtin_spec(state, hook)
            if spec is None:
                if not callable(hook):
                    raise _lib.error("invalid_argument", f"{hook!r} is not a comm hook")
                spec = self._register_python_hook(state, hook)
        check(lib.collie_reducer_set_comm_hook(self._h, spec.encode()))
        self._hook_spec = spec  # set again on the reducer a reform() builds

    def _register_python_hook(self, state, fn):
        try:
            nargs = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            nargs = 2
        if nargs != 2:
            raise _lib.error("invalid_argument",
                        f"a comm hook is called as hook(state, bucket); {fn!r} takes {nargs} "
                        "arguments")
        _CommHooks._hook_count += 1
        name = f"python_hook_{_CommHooks._hook_count}"
        params = self._params

        def trampoline(_user, comm, c_bucket, done):
            try:
                cb = c_bucket.contents
                dtype = _TORCH_OF[cb.buffer.dtype]
                flat = self._arenas.view(cb.buffer.data, cb.buffer.numel, dtype)
                grads, ps = [], []
                for k in range(cb.num_grads):
                    p = params[self._index_of[cb.params[k].data]]
                    ps.append(p)
                    grads.append(self._arenas.view(cb.grads[k].data, p.numel(), dtype, p.shape))
                bucket = GradBucket(cb.index, flat, grads, ps, bool(cb.is_last),
                                    Communicator(comm, owned=False))
                self._finish_hook(fn(state, bucket), flat, done)
            except Exception as e:  # noqa: BLE001 - reported through collie
                lib.collie_hook_complete(done, _lib.ERR_INTERNAL,
                                         f"comm hook {getattr(fn, '__name__', fn)!r} raised "
                                         f"{type(e).__name__}: {e}".encode())

        cb = _lib.HOOK_FN(trampoline)
        self._python_hooks.append(cb)  # the C side keeps only the pointer
        check(lib.collie_hook_register(name.encode(), cb, None))
        return name

    @staticmethod
    def _finish_hook(result, flat, done):
        if isinstance(result, Work):
            handle, result._h = result._h, None  # collie frees it when it completes
            check(lib.collie_hook_complete_after(done, handle))
            return

        def place(value):
            if isinstance(value, (list, tuple)) and len(value) == 1:
                value = value[0]
            if value is None:
                return
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"a comm hook returned {type(value).__name__}; return a torch "
                                "Future, a collie Work, the bucket's tensor or None")
            if value.numel() != flat.numel():
                raise ValueError(f"a comm hook returned {value.numel()} elements for a bucket of "
                                 f"{flat.numel()}")
            if value.data_ptr() != flat.data_ptr():
                flat.copy_(value)

        # torch.distributed's works give torch._C.Future, which
        # torch.futures.Future wraps but does not subclass in every version.
        if isinstance(result, (torch.futures.Future, torch._C.Future)):
            def on_done(fut):
                try:
                    place(fut.value())
                    lib.collie_hook_complete(done, _lib.OK, None)
                except Exception as e:  # noqa: BLE001 - reported through collie
                    lib.collie_hook_complete(done, _lib.ERR_INTERNAL,
                                             f"comm hook future failed: {e}".encode())
            result.then(on_done)
            return
        place(result)
        lib.collie_hook_complete(done, _lib.OK, None)
