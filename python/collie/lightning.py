"""collie.lightning: Lightning's DDP strategy with collie's
DistributedDataParallel (collie.torch) in place of PyTorch's.

    import collie.lightning                            # registers the names below
    trainer = Trainer(strategy="collie_ddp", accelerator="cpu", devices=2)
    # DDPStrategy's options, and a collie comm hook by name:
    trainer = Trainer(strategy=collie.lightning.CollieDDPStrategy(
        comm_hook="powersgd:rank=2", static_graph=True, gradient_as_bucket_view=True), ...)

Importing this module registers, in Lightning's StrategyRegistry,
collie_ddp (Lightning's script launcher, as "ddp"), collie_ddp_spawn,
collie_ddp_fork and collie_ddp_notebook (as "ddp_spawn", "ddp_fork",
"ddp_notebook"), for lightning.pytorch and for the standalone
pytorch_lightning, whichever are installed.

Everything but the wrapper is Lightning's DDPStrategy: the launchers, the
samplers, checkpointing, and the torch.distributed process group (gloo on
CPU, nccl on GPU), which Lightning's own collectives need (barrier,
broadcast, reduce, all_gather, self.log(sync_dist=True)). collie's
communicator sits beside it and carries the gradients.

Runs on Lightning 2.1 to 2.6: CI runs tests/python/lightning_check.py
against Lightning 2.6.6 on PyTorch 2.15 and 2.1.4 on PyTorch 2.1.2 (see
docs/engines/lightning.md).
"""
import importlib
import importlib.util
import inspect
import logging
import sys


def _lightning_packages():
    """lightning.pytorch and pytorch_lightning, those installed. A package
    that is installed but fails to import raises its own error."""
    found = []
    for top, name in (("lightning", "lightning.pytorch"),
                      ("pytorch_lightning", "pytorch_lightning")):
        try:
            installed = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            installed = False
        if installed:
            found.append(importlib.import_module(name))
    return found


_PACKAGES = _lightning_packages()
if not _PACKAGES:
    raise ImportError(
        "collie.lightning needs PyTorch Lightning 2.1 or later (2.1.4 to 2.6.6 tested): neither "
        "lightning.pytorch nor pytorch_lightning is installed for this Python "
        f"({sys.executable}). Install it (pip install lightning), or use "
        "collie.torch.DistributedDataParallel without Lightning.")

import torch  # noqa: E402 - after the check, so that its message comes first

from ._torch_world import connect_through_torch  # noqa: E402
from .torch import (REFUSED_OPTIONS, DistributedDataParallel,  # noqa: E402
                    PeriodicModelAverager, _builtin_spec, _Sink)

__all__ = ["CollieDDPStrategy", "STRATEGIES"]

log = logging.getLogger(__name__)

# Registered names and their start methods, as DDPStrategy registers its own.
_NAMES = (("collie_ddp", "popen"), ("collie_ddp_spawn", "spawn"), ("collie_ddp_fork", "fork"),
          ("collie_ddp_notebook", "fork"))

# The DDP options a strategy passes through to collie's wrapper (the rest of
# DDPStrategy's **kwargs). device_ids is the strategy's to choose, as in
# DDPStrategy; the communicator is the strategy's (process_group: see
# _CollieDDP.__init__).
_DDP_OPTIONS = frozenset(inspect.signature(DistributedDataParallel.__init__).parameters) - {
    "self", "module", "device_ids", "process_group", "comm", "comm_hook"} - set(REFUSED_OPTIONS)

def _spec_int(spec, key, default):
    """An integer parameter of a hook spec ("post_local_sgd:start_iter=8")."""
    _, _, params = spec.partition(":")
    for kv in params.split(","):
        k, _, v = kv.partition("=")
        if k.strip() == key:
            return int(v)
    return default


def _wrapped_spec(wrapper, state, hook):
    """collie's spec for PyTorch's fp16/bf16_compress_wrapper around one of
    PyTorch's built-in hooks (or a collie spec)."""
    module = getattr(wrapper, "__module__", "") or ""
    prefix = None
    if module.startswith("torch.distributed.algorithms.ddp_comm_hooks"):
        prefix = {"fp16_compress_wrapper": "fp16_wrap",
                  "bf16_compress_wrapper": "bf16_wrap"}.get(getattr(wrapper, "__name__", ""))
    inner = hook if isinstance(hook, str) else _builtin_spec(state, hook)
    if prefix is None or inner is None:
        raise ValueError(
            f"collie_ddp: ddp_comm_wrapper={wrapper!r} around ddp_comm_hook={hook!r}: collie runs "
            "PyTorch's fp16_compress_wrapper and bf16_compress_wrapper around PyTorch's built-in "
            "hooks; otherwise pass comm_hook='fp16_wrap:<hook>' (or 'bf16_wrap:<hook>') by name")
    return f"{prefix}:{inner}"


def _manual(wrapper_module, lightning_module):
    """collie's wrapper around a LightningModule that optimizes manually."""
    return (isinstance(wrapper_module, DistributedDataParallel)
            and not lightning_module.automatic_optimization)


class _Redirection:
    """What DDPStrategy's forward redirection does for PyTorch's DDP in manual
    optimization, for collie's too: once training_step (and the
    manual_backward in it) has run, the wrapper's forward is not a
    synchronising one, so that, as with PyTorch's DDP under Lightning, the
    next forward does not broadcast buffers."""

    def on_after_inner_forward(self, wrapper_module, original_module):
        super().on_after_inner_forward(wrapper_module, original_module)
        if _manual(wrapper_module, original_module):
            wrapper_module.require_backward_grad_sync = False

    def on_after_outer_forward(self, wrapper_module, original_module):
        super().on_after_outer_forward(wrapper_module, original_module)
        if _manual(wrapper_module, original_module):
            wrapper_module.require_backward_grad_sync = True


class _CollieDDP:
    """What CollieDDPStrategy changes in Lightning's DDPStrategy (a mixin, so
    that one body serves lightning.pytorch's and pytorch_lightning's)."""

    strategy_name = "collie_ddp"

    def __init__(self, *args, comm_hook=None, **kwargs):
        # Lightning's timeout (30 minutes unless given) is torch.distributed's;
        # collie takes it only when the user gave one, and otherwise keeps its
        # own (COLLIE_TIMEOUT, or collie's default).
        self._collie_timeout = kwargs.get("timeout")
        super().__init__(*args, **kwargs)
        if "process_group" in self._ddp_kwargs:
            raise ValueError(
                "collie_ddp: process_group is not supported: the gradients go over collie's "
                "communicator of every rank, which the strategy connects")
        unknown = sorted(set(self._ddp_kwargs) - _DDP_OPTIONS)
        if unknown:
            raise TypeError(f"collie_ddp: collie's DistributedDataParallel takes no "
                            f"{', '.join(unknown)} (it takes {', '.join(sorted(_DDP_OPTIONS))})")
        if comm_hook is not None and not isinstance(comm_hook, str):
            raise TypeError("collie_ddp: comm_hook is a collie hook by name ('fp16', "
                            "'powersgd:rank=2', ...); pass PyTorch's hook functions as "
                            "ddp_comm_hook")
        if comm_hook is not None and self._ddp_comm_hook is not None:
            raise ValueError("collie_ddp: give comm_hook (collie's, by name) or ddp_comm_hook "
                             "(PyTorch's), not both")
        self._comm_hook = comm_hook
        self._collie_comm = None
        self._forward_redirection = self._redirection()

    # ---- collie's communicator ------------------------------------------------

    def _collie_communicator(self):
        """collie's communicator of this job's ranks, connected on first use
        (every rank calls this, in _setup_model) and closed in teardown."""
        if self._collie_comm is not None and self._collie_comm.handle:
            return self._collie_comm
        # torch.distributed's job, which every rank has joined by now
        # (Lightning's launchers, torchrun, collie-run alike): collie's rank 0
        # serves its store on a port it holds from the moment it picks it,
        # and sends the address through PyTorch's store (collie._torch_world).
        timeout = (self._collie_timeout.total_seconds()
                   if self._collie_timeout is not None else None)
        self._collie_comm = connect_through_torch(timeout=timeout)
        if (self._collie_comm.rank, self._collie_comm.size) != (self.global_rank, self.world_size):
            raise RuntimeError(
                f"collie_ddp: collie's communicator is rank {self._collie_comm.rank} of "
                f"{self._collie_comm.size}; Lightning's is {self.global_rank} of {self.world_size}")
        return self._collie_comm

    # ---- the wrapper ----------------------------------------------------------

    def _setup_model(self, model):
        """collie's DistributedDataParallel over collie's communicator, with
        the DDP options given to the strategy."""
        comm = self._collie_communicator()
        log.debug(f"{type(self).__name__}: collie's DistributedDataParallel over {comm.backend}, "
                  f"options {self._ddp_kwargs}, comm_hook {self._comm_hook!r}")
        return DistributedDataParallel(module=model, comm=comm, comm_hook=self._comm_hook,
                                       **self._ddp_kwargs)

    def _register_ddp_hooks(self):
        # Lightning registers ddp_comm_hook on CUDA only, as PyTorch's DDP ran
        # hooks with NCCL alone; collie's reducer runs them on any device.
        # PyTorch's built-in hooks (with their state) map to collie's own.
        hook, state = self._ddp_comm_hook, self._ddp_comm_state
        if hook is None:
            return
        if self._ddp_comm_wrapper is not None:
            hook, state = _wrapped_spec(self._ddp_comm_wrapper, state, hook), None
        self.model.register_comm_hook(state, hook)

    def setup(self, trainer):
        super().setup(trainer)
        # Post-local SGD by name: DDPStrategy turns model averaging on only for
        # PyTorch's PostLocalSGDState; a collie spec takes start_iter from the
        # spec (collie's default, 100, as hooks/post_local_sgd.cc).
        if (self._model_averager is None and isinstance(self.model, DistributedDataParallel)
                and (self._comm_hook or "").partition(":")[0] == "post_local_sgd"):
            if self._model_averaging_period is None:
                raise ValueError("collie_ddp: comm_hook='post_local_sgd...' averages the model "
                                 "every model_averaging_period steps: give model_averaging_period")
            self._model_averager = PeriodicModelAverager(
                period=self._model_averaging_period,
                warmup_steps=_spec_int(self._comm_hook, "start_iter", 100),
                comm=self._collie_communicator())

    def _enable_model_averaging(self):
        # DDPStrategy's checks and PyTorch's averager, which would average over
        # torch.distributed; collie's averages over collie's communicator.
        super()._enable_model_averaging()
        self._model_averager = PeriodicModelAverager(
            period=self._model_averaging_period,
            warmup_steps=self._ddp_comm_state.start_localSGD_iter,
            comm=self._collie_communicator())

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        # Manual optimization: manual_backward runs inside training_step, that
        # is inside the wrapper's forward, before the wrapper has seen any
        # output, so no gradient would pass the node where collie's DDP starts
        # its backward (it ignores gradients outside one). DDPStrategy's
        # pre_backward does the same for PyTorch's DDP with
        # reducer.prepare_for_backward, and skips collie's wrapper.
        ddp = self.model
        if (_manual(ddp, self.lightning_module) and torch.is_grad_enabled()
                and isinstance(closure_loss, torch.Tensor) and closure_loss.requires_grad):
            closure_loss = _Sink.apply(ddp, closure_loss)[0]
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def teardown(self):
        # DDPStrategy unwraps only PyTorch's DDP: unwrap collie's, free its
        # reducer, then the averager and the communicator (which the next
        # fit connects anew).
        ddp = self.model
        if isinstance(ddp, DistributedDataParallel):
            self.model = self.lightning_module
            ddp.close()
        self._model_averager = None
        super().teardown()
        if self._collie_comm is not None:
            self._collie_comm.close()
            self._collie_comm = None

    def __getstate__(self):
        # Spawn pickles the strategy with the Trainer (before any connection;
        # a communicator never travels to another process).
        state = super().__getstate__()
        state["_collie_comm"] = None
        return state

    @classmethod
    def register_strategies(cls, strategy_registry):
        for name, start_method in _NAMES:
            strategy_registry.register(
                name, cls, description=f"collie's DDP with start_method '{start_method}'",
                override=True, start_method=start_method)


_DOC = """Lightning's DDPStrategy with collie.torch.DistributedDataParallel
    as the wrapper, over a collie communicator of the job's ranks.

    Takes DDPStrategy's arguments: the DDP options (bucket_cap_mb,
    find_unused_parameters, static_graph, gradient_as_bucket_view,
    broadcast_buffers, init_sync, and collie's first_bucket_cap_mb),
    ddp_comm_hook/ddp_comm_state (PyTorch's built-in hooks, run as collie's
    equivalents, on CPU too), ddp_comm_wrapper (PyTorch's fp16/bf16
    compress wrappers), model_averaging_period (post-local SGD, averaged
    with collie's PeriodicModelAverager), process_group_backend and timeout
    (torch.distributed's; a timeout given is collie's too), start_method;
    plus comm_hook, a collie hook by name ("fp16", "powersgd:rank=2",
    "post_local_sgd:start_iter=100" with model_averaging_period, ...).

    Lightning's torch.distributed process group is kept for Lightning's
    own collectives; collie's communicator carries the gradients, over
    the same ranks, rendezvoused through torch.distributed's store."""


# The Lightning versions this module has run against (tests/python/
# lightning_check.py, in CI): the oldest and the newest.
OLDEST, NEWEST = "2.1.4", "2.6.6"


def _version(text):
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


def _define(pkg, suffix=""):
    """The strategy (and its forward redirection) for one Lightning package,
    registered in its StrategyRegistry. Both classes get module-level names
    (spawn pickles the strategy with the Trainer)."""
    if _version(pkg.__version__) < _version(OLDEST)[:2]:
        raise ImportError(
            f"collie.lightning needs Lightning {OLDEST[:3]} or later ({OLDEST} to {NEWEST} are "
            f"tested); {pkg.__name__} is {pkg.__version__}. Upgrade it (pip install -U "
            "lightning), or use collie.torch.DistributedDataParallel without Lightning")
    ddp = importlib.import_module(pkg.__name__ + ".strategies.ddp")
    base = getattr(ddp, "_DDPForwardRedirection", None) or ddp._ForwardRedirection
    redirection = type("_Redirection" + suffix, (_Redirection, base), {"__module__": __name__})
    cls = type("CollieDDPStrategy" + suffix, (_CollieDDP, pkg.strategies.DDPStrategy),
               {"__doc__": _DOC, "__module__": __name__, "_redirection": redirection})
    globals()[redirection.__name__] = redirection
    globals()[cls.__name__] = cls
    cls.register_strategies(pkg.strategies.StrategyRegistry)
    return cls


# lightning.pytorch's, else pytorch_lightning's; with both installed, the
# second is CollieDDPStrategyPL.
STRATEGIES = {_PACKAGES[0].__name__: _define(_PACKAGES[0])}
CollieDDPStrategy = STRATEGIES[_PACKAGES[0].__name__]
if len(_PACKAGES) > 1:
    STRATEGIES[_PACKAGES[1].__name__] = _define(_PACKAGES[1], "PL")
    __all__.append("CollieDDPStrategyPL")
