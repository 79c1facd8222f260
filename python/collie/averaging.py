"""collie.averaging: PyTorch's model averaging for post-local SGD over
collie (collie.torch re-exports both): PeriodicModelAverager averages the
parameters every `period` steps, over every rank or hierarchically, and
PostLocalSGDOptimizer runs it after each optimizer step.
"""
import ctypes

import torch

from . import as_tensor, default_communicator
from . import _lib
from ._lib import check, lib

__all__ = ["PeriodicModelAverager", "PostLocalSGDOptimizer"]


class PeriodicModelAverager:
    """PyTorch's PeriodicModelAverager over collie: after warmup_steps,
    every `period` steps the parameters are averaged over every rank (or,
    with group_sizes, hierarchically: periods[i] within groups of
    group_sizes[i] consecutive ranks). Call average_parameters after each
    optimizer step, as post-local SGD does."""

    def __init__(self, period=1, warmup_steps=0, comm=None, *, periods=None, group_sizes=None):
        self._comm = comm if comm is not None else default_communicator()
        h = ctypes.c_void_p()
        if periods is None:
            check(lib.collie_averager_create_periodic(self._comm.handle, int(period),
                                                      int(warmup_steps), ctypes.byref(h)))
        else:
            if group_sizes is None or len(group_sizes) != len(periods):
                raise _lib.error("invalid_argument", "periods and group_sizes need one entry per level")
            ps = (ctypes.c_uint64 * len(periods))(*periods)
            gs = (ctypes.c_int32 * len(periods))(*group_sizes)
            check(lib.collie_averager_create_hierarchical(self._comm.handle, ps, gs, len(periods),
                                                          int(warmup_steps), ctypes.byref(h)))
        self._h = h

    def average_parameters(self, params):
        params = [p for p in params if isinstance(p, torch.Tensor)] if not isinstance(
            params, torch.Tensor) else [params]
        flat = [p.data if p.is_contiguous() else p.data.contiguous() for p in params]
        ts = (_lib.Tensor * max(len(flat), 1))(*[as_tensor(t) for t in flat])
        check(lib.collie_averager_average(self._h, ts, len(flat)))
        with torch.no_grad():
            for p, t in zip(params, flat):
                if t.data_ptr() != p.data_ptr():
                    p.copy_(t)

    def state_dict(self):
        size = ctypes.c_size_t()
        check(lib.collie_averager_save_state(self._h, None, 0, ctypes.byref(size)))
        buf = (ctypes.c_uint8 * max(size.value, 1))()
        check(lib.collie_averager_save_state(self._h, buf, size.value, ctypes.byref(size)))
        return {"collie_averager": bytes(buf)[:size.value]}

    def load_state_dict(self, state):
        raw = bytes(state["collie_averager"])
        buf = (ctypes.c_uint8 * max(len(raw), 1)).from_buffer_copy(raw or b"\0")
        check(lib.collie_averager_load_state(self._h, buf, len(raw)))

    def __del__(self):
        if getattr(self, "_h", None):
            lib.collie_averager_destroy(self._h)
            self._h = None


class PostLocalSGDOptimizer(torch.optim.Optimizer):
    """PyTorch's PostLocalSGDOptimizer: step() runs the wrapped optimizer,
    then the averager."""

    def __init__(self, optim, averager):
        self.optim = optim
        self.averager = averager
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults
        self.state = optim.state

    def step(self, closure=None):
        loss = self.optim.step(closure)
        for group in self.param_groups:
            self.averager.average_parameters(group["params"])
        return loss

    def zero_grad(self, set_to_none=False):
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        sd = self.optim.state_dict()
        sd["collie_averager"] = self.averager.state_dict()["collie_averager"]
        return sd

    def load_state_dict(self, state_dict):
        sd = dict(state_dict)
        if "collie_averager" in sd:
            self.averager.load_state_dict({"collie_averager": sd.pop("collie_averager")})
        self.optim.load_state_dict(sd)
