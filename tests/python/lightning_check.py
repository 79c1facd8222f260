"""collie.lightning against Lightning's own DDP, on two CPU ranks.

    /usr/bin/python3 lightning_check.py          # Lightning's script launcher (collie_ddp vs ddp)
    /usr/bin/python3 lightning_check.py spawn    # collie_ddp_spawn, _fork and _notebook vs ddp_spawn
    /usr/bin/python3 lightning_check.py backend  # DDPStrategy(process_group_backend="collie")

Each case trains the same LightningModule (an MLP with BatchNorm), from the
same seed, on the same data, with Trainer(strategy="ddp"...) and with
collie's strategy, and checks on every rank that the parameters and
buffers, and each step's averaged gradients, agree within 1e-5 relative;
that the DDP options reach collie's wrapper (static_graph, bucket views,
gradient accumulation through no_sync, manual optimization); that comm
hooks named ("fp16", "powersgd:...") or given as PyTorch's functions run
(fp16 within fp16 rounding of the exact average); and that post-local SGD
averages with collie's averager; that self.log(sync_dist=True) logs the
mean over ranks; and that a checkpoint saved at step 3 and resumed to the
end gives Lightning's ddp's model doing the same. Exits non-zero when any check failed on
any rank.

Without Lightning it checks that importing collie.lightning says Lightning
is needed, and exits 77 (skipped).
"""
import importlib.util
import os
import sys
import traceback

LIGHTNING = any(importlib.util.find_spec(m) for m in ("lightning", "pytorch_lightning"))
if __name__ == "__main__" and not LIGHTNING:
    try:
        import collie.lightning  # noqa: F401
    except ImportError as e:
        if "Lightning" not in str(e) or "pip install lightning" not in str(e):
            sys.exit(f"FAIL: importing collie.lightning without Lightning said: {e}")
        print(f"collie.lightning without Lightning: ImportError, as it should be ({e})")
        print("skipped: Lightning is not installed for this Python; the GPU machine runs this "
              "(bench/RESULTS.md)")
        sys.exit(77)
    sys.exit("FAIL: collie.lightning imported without Lightning installed")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

import collie  # noqa: E402
from check_cases import exit_cleanly  # noqa: E402 - ends a rank without finalizing Python
import collie.lightning as cl  # noqa: E402
import collie.torch as ct  # noqa: E402

Collie = cl.STRATEGIES[pl.__name__]  # CollieDDPStrategy for the Lightning imported here
torch.set_num_threads(1)
STEPS = 6
LR = 0.05
failures = []
verdicts = []
children = []  # the ranks Lightning's script launcher started (rank 0 waits for them)


class Failed(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


# ---- the model and the data ---------------------------------------------------

class Net(pl.LightningModule):
    def __init__(self, manual=False):
        super().__init__()
        torch.manual_seed(7)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(12, 24), torch.nn.BatchNorm1d(24), torch.nn.Tanh(),
            torch.nn.Linear(24, 24), torch.nn.Tanh(), torch.nn.Linear(24, 6))
        self.automatic_optimization = not manual

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        # Which wrapper trained (rank 0's word reaches a spawn's main process).
        self.log("collie_wrapper", float(isinstance(self.trainer.strategy.model,
                                                    ct.DistributedDataParallel)))
        # Lightning's mean over the ranks (its torch.distributed group),
        # and this rank's own, which Record gathers for the check.
        self.log("loss_synced", loss.detach(), sync_dist=True)
        self.log("loss_local", loss.detach())
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)


N_PARAMS = len(list(Net().parameters()))


def data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 12, generator=g)
    return DataLoader(TensorDataset(x, x @ torch.randn(12, 6, generator=g)
                                    + 0.1 * torch.randn(64, 6, generator=g)), batch_size=4)


class Record(pl.Callback):
    """Each step's averaged gradients, and what the wrapper was."""

    def __init__(self):
        self.grads, self.in_buckets, self.stats = [], [], []
        self.wrapper = self.static_graph = self.bucket_view = self.find_unused = None
        self.averager = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append([p.grad.detach().clone() for p in pl_module.parameters()])
        ddp = trainer.strategy.model
        self.wrapper = type(ddp).__module__ + "." + type(ddp).__name__
        averager = type(getattr(trainer.strategy, "_model_averager", None))
        self.averager = averager.__module__ + "." + averager.__name__
        if isinstance(ddp, ct.DistributedDataParallel):
            self.static_graph, self.bucket_view = ddp._static_graph, ddp._bucket_view
            self.find_unused = ddp._find_unused
            self.in_buckets.append(ddp._bucket_view and all(
                p.grad.data_ptr() == v.data_ptr() for p, v in zip(ddp._params, ddp._views)))
            self.stats.append(ddp.reducer_stats())


def fit(strategy, manual=False, accumulate=1, steps=STEPS, devices=2, ckpt_path=None,
        save_to=None):
    rec = Record()
    model = Net(manual)
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_steps=steps,
                         accumulate_grad_batches=accumulate, callbacks=[rec], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, data(), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    children.extend(getattr(trainer.strategy.launcher, "procs", None) or [])
    check(trainer.state.finished, f"the fit with {strategy!r} did not finish: {trainer.state}")
    # The parameters, then the BatchNorm statistics (which differ between
    # ranks: each updates them with its own batch after rank 0's arrive).
    state = [t.detach().clone() for t in model.parameters()]
    state += [t.detach().clone() for t in model.buffers() if t.is_floating_point()]
    return state, rec, trainer


# ---- comparison ---------------------------------------------------------------

def assert_close(got, want, what, rtol=1e-5, floor=None):
    """Each element within rtol of its reference, or within `floor` times
    the largest reference value (default rtol / 100) for elements near 0."""
    floor = rtol * 1e-2 if floor is None else floor
    check(len(got) == len(want), f"{what}: {len(got)} tensors against {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = a.double(), b.double()
        scale = b.abs().max().item() + 1e-12
        err = ((a - b).abs() - rtol * b.abs()).max().item()
        check(err <= floor * scale,
              f"{what}: tensor {i} differs by {(a - b).abs().max().item():.3g} "
              f"(largest value {scale:.3g}, tolerance {rtol:g} relative)")


def assert_steps_close(got, want, what, rtol=1e-5):
    check(len(got.grads) == len(want.grads),
          f"{what}: {len(got.grads)} optimizer steps against {len(want.grads)}")
    for step, (a, b) in enumerate(zip(got.grads, want.grads)):
        assert_close(a, b, f"{what}, step {step}'s gradients", rtol)


def assert_same_on_every_rank(state, what):
    """The parameters (not the buffers) of every rank to the bit."""
    flat = torch.cat([t.reshape(-1).double() for t in state[:N_PARAMS]])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    for r, other in enumerate(everyone):
        check(torch.equal(other, flat), f"{what}: rank {r}'s model differs from this rank's")


def is_collie(rec, what):
    check(rec.wrapper == "collie.torch.DistributedDataParallel",
          f"{what}: the model was wrapped in {rec.wrapper}, not collie's DistributedDataParallel")


_reference = {}


def reference():
    """Lightning's own DDP over Gloo, the default options (computed once)."""
    if "ddp" not in _reference:
        _reference["ddp"] = fit("ddp")
    return _reference["ddp"]


# ---- the cases (Lightning's script launcher) -------------------------------------

def case_registry():
    reg = pl.strategies.StrategyRegistry
    for name, method in (("collie_ddp", "popen"), ("collie_ddp_spawn", "spawn"),
                         ("collie_ddp_fork", "fork"), ("collie_ddp_notebook", "fork")):
        check(name in reg, f"{name} is not in Lightning's StrategyRegistry")
        check(reg[name]["strategy"] is Collie and
              reg[name]["init_params"] == {"start_method": method},
              f"{name} is registered as {reg[name]}")
    for bad, kwargs in (("an option collie's DDP does not take",
                         {"skip_all_reduce_unused_params": True}),
                        ("a torch process group", {"process_group": object()}),
                        ("a callable comm_hook", {"comm_hook": default_hooks.fp16_compress_hook}),
                        ("both comm hooks", {"comm_hook": "fp16",
                                             "ddp_comm_hook": default_hooks.fp16_compress_hook})):
        try:
            Collie(**kwargs)
        except (TypeError, ValueError) as e:
            check("collie_ddp" in str(e), f"{bad}: refused without saying who ({e})")
        else:
            raise Failed(f"{bad}: CollieDDPStrategy({kwargs}) was accepted")
    return ("collie_ddp, collie_ddp_spawn, collie_ddp_fork, collie_ddp_notebook registered; "
            "bad options refused")


def case_plain():
    want, want_rec, _ = reference()
    got, rec, trainer = fit("collie_ddp")
    check(isinstance(trainer.strategy, Collie),
          f"strategy='collie_ddp' gave {type(trainer.strategy).__name__}")
    is_collie(rec, "collie_ddp")
    check(trainer.strategy.model is trainer.lightning_module, "teardown left the wrapper in place")
    assert_same_on_every_rank(got, "collie_ddp")
    assert_steps_close(rec, want_rec, "collie_ddp against ddp")
    assert_close(got, want, "collie_ddp against ddp, the trained model")
    _reference["collie"] = (got, rec)
    return f"{STEPS} steps: every gradient and the model within 1e-5 of Lightning's ddp"


def case_sync_dist():
    """self.log(..., sync_dist=True) under collie_ddp: the mean of the ranks'
    losses (Lightning reduces it over its process group), equal to
    Lightning's own ddp's and to the mean of every rank's own loss."""
    _, _, ref = fit("ddp")
    _, _, trainer = fit("collie_ddp")
    got = trainer.callback_metrics["loss_synced"].double()
    want = ref.callback_metrics["loss_synced"].double()
    local = trainer.callback_metrics["loss_local"].double().reshape(1).float()
    everyone = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, local)
    mean = torch.cat(everyone).double().mean()
    check(abs(got - want) <= 1e-6 * abs(want), f"synced loss {got.item()} against ddp's "
                                                f"{want.item()}")
    check(abs(got - mean) <= 1e-6 * abs(mean), f"synced loss {got.item()} against the mean of "
                                                f"the ranks' own, {mean.item()}")
    return f"sync_dist=True logs the mean over ranks ({got.item():.6f}), as ddp does"


def case_checkpoint_resume():
    """A checkpoint saved after 3 steps (trainer.save_checkpoint, which
    Lightning writes from rank 0) and a new Trainer resumed from it to step
    6, with collie_ddp and with Lightning's ddp doing the same: the same
    model within 1e-5, on every rank."""
    root = os.environ["COLLIE_LIGHTNING_CHECK_DIR"]
    out = {}
    for name in ("ddp", "collie_ddp"):
        path = os.path.join(root, f"{name}.ckpt")
        fit(name, steps=3, save_to=path)
        dist.barrier()
        check(os.path.exists(path), f"{name}: no checkpoint at {path}")
        out[name], rec, trainer = fit(name, steps=STEPS, ckpt_path=path)
        check(len(rec.grads) == STEPS - 3,
              f"{name}: the resumed fit took {len(rec.grads)} steps, not {STEPS - 3}")
        if name == "collie_ddp":
            is_collie(rec, "checkpoint_resume")
    assert_same_on_every_rank(out["collie_ddp"], "collie_ddp resumed")
    assert_close(out["collie_ddp"], out["ddp"], "collie_ddp resumed against ddp resumed")
    return "saved at step 3, resumed to 6: within 1e-5 of Lightning's ddp doing the same"


def case_static_graph_bucket_view():
    opts = {"static_graph": True, "gradient_as_bucket_view": True}
    want, want_rec, _ = fit(pl.strategies.DDPStrategy(**opts))
    got, rec, _ = fit(Collie(find_unused_parameters=False, **opts))
    is_collie(rec, "static_graph")
    check(rec.static_graph is True and rec.bucket_view is True and rec.find_unused is False,
          f"the options did not reach collie's wrapper: static_graph={rec.static_graph}, "
          f"gradient_as_bucket_view={rec.bucket_view}, find_unused_parameters={rec.find_unused}")
    check(len(rec.in_buckets) == STEPS and all(rec.in_buckets),
          f"param.grad was not a view of its bucket at every step: {rec.in_buckets}")
    assert_steps_close(rec, want_rec, "static_graph + bucket views against ddp's")
    assert_close(got, want, "static_graph + bucket views against ddp's, the trained model")
    return ("static_graph and gradient_as_bucket_view reach the wrapper (grads are bucket "
            "views); within 1e-5 of ddp's")


def case_fp16():
    exact, exact_rec = _reference["collie"] if "collie" in _reference else fit("collie_ddp")[:2]
    got, rec, _ = fit(Collie(comm_hook="fp16"))
    got_torch, _, _ = fit(Collie(ddp_comm_hook=default_hooks.fp16_compress_hook))
    _, rec_wrap, _ = fit(Collie(ddp_comm_hook=default_hooks.allreduce_hook,
                                ddp_comm_wrapper=default_hooks.fp16_compress_wrapper))
    is_collie(rec, "fp16")
    world = dist.get_world_size()
    eps = 2.0 ** -11  # fp16's unit roundoff
    for what, r in (("comm_hook='fp16'", rec), ("fp16_compress_wrapper(allreduce_hook)", rec_wrap)):
        # The first step starts from the same model: its averaged gradient
        # is the exact one within fp16 rounding (each rank's contribution
        # rounded once, the sum once more), plus fp16's subnormal spacing.
        for k, (g16, g) in enumerate(zip(r.grads[0], exact_rec.grads[0])):
            bound = (world + 1) * eps * g.abs().max().item() + 6e-8 * world
            err = (g16 - g).abs().max().item()
            check(err <= bound, f"{what}, step 0, gradient {k}: {err:.3g} from the exact "
                                f"average (bound {bound:.3g})")
        check(any(not torch.equal(a, b) for a, b in zip(r.grads[0], exact_rec.grads[0])),
              f"{what}: the gradients are the uncompressed ones to the bit: the hook did not run")
        s = r.stats[-1]
        check(s["hook_bytes"] * 2 <= s["gradient_bytes"] + 64,
              f"{what} sent {s['hook_bytes']} bytes for {s['gradient_bytes']} of gradients")
    # Later steps drift apart by fp16 rounding compounded by training.
    assert_close(got, exact, "fp16 against the uncompressed run, the trained model", rtol=1e-2)
    # PyTorch's fp16_compress_hook as ddp_comm_hook is collie's fp16, on CPU too.
    assert_close(got_torch, got, "ddp_comm_hook=fp16_compress_hook against comm_hook='fp16'",
                 rtol=0, floor=0)
    return ("comm_hook='fp16' and ddp_comm_wrapper=fp16_compress_wrapper within fp16 rounding "
            "of the exact average; ddp_comm_hook=fp16_compress_hook the same as 'fp16' to the bit")


def case_powersgd():
    spec = "powersgd:rank=2,start_iter=2,min_compression_rate=1"
    try:
        got, rec, _ = fit(Collie(comm_hook=spec))
    except collie.Error as e:
        if e.code == "unavailable":
            return f"not run: this libcollie has no PowerSGD ({e})"
        raise
    assert_same_on_every_rank(got, "powersgd")
    is_collie(rec, "powersgd")
    s = rec.stats[-1]
    check(0 < s["hook_bytes"] < s["gradient_bytes"] / 2,
          f"{spec} sent {s['hook_bytes']} bytes for {s['gradient_bytes']} of gradients after "
          "start_iter")
    check(all(torch.isfinite(t).all() for t in got), "powersgd: the model is not finite")
    return (f"comm_hook='{spec}' compresses ({s['hook_bytes']} of {s['gradient_bytes']} bytes); "
            "ranks agree")


def case_accumulate():
    calls = {"n": 0}
    original = ct.DistributedDataParallel.no_sync

    def counting(self):
        calls["n"] += 1
        return original(self)

    want, want_rec, _ = fit("ddp", accumulate=2, steps=3)
    ct.DistributedDataParallel.no_sync = counting
    try:
        got, rec, _ = fit("collie_ddp", accumulate=2, steps=3)
    finally:
        ct.DistributedDataParallel.no_sync = original
    is_collie(rec, "accumulate_grad_batches=2")
    check(calls["n"] == 3,
          f"Lightning entered no_sync {calls['n']} times in 3 accumulation windows")
    assert_steps_close(rec, want_rec, "accumulate_grad_batches=2 against ddp's")
    assert_close(got, want, "accumulate_grad_batches=2 against ddp's, the trained model")
    return "accumulate_grad_batches=2: one no_sync micro-batch per step; within 1e-5 of ddp's"


def case_manual():
    want, want_rec, _ = fit("ddp", manual=True)
    got, rec, _ = fit("collie_ddp", manual=True)
    is_collie(rec, "manual optimization")
    assert_steps_close(rec, want_rec, "manual optimization against ddp's")
    assert_close(got, want, "manual optimization against ddp's, the trained model")
    return "manual optimization (manual_backward inside training_step): within 1e-5 of ddp's"


COLLIE_AVERAGER = "collie.averaging.PeriodicModelAverager"


def case_post_local_sgd():
    # On one host collie's default subgroup (the host's ranks) is every rank:
    # the gradients are averaged as without the hook, and averaging equal
    # models changes nothing, so the result is plain DDP's.
    want, _, _ = reference()
    state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None,
                                                 start_localSGD_iter=2)
    got, rec, _ = fit(Collie(ddp_comm_state=state, model_averaging_period=2,
                                           ddp_comm_hook=post_localSGD_hook.post_localSGD_hook))
    check(rec.averager == COLLIE_AVERAGER and rec.wrapper.startswith("collie."),
          f"post-local SGD: wrapper {rec.wrapper}, averager {rec.averager}")
    assert_close(got, want, "post_localSGD_hook on one host against ddp")
    named, rec2, trainer = fit(Collie(comm_hook="post_local_sgd:start_iter=2",
                                                    model_averaging_period=2))
    check(rec2.averager == COLLIE_AVERAGER,
          f"comm_hook='post_local_sgd...': averager {rec2.averager}")
    assert_close(named, want, "comm_hook='post_local_sgd:start_iter=2' on one host against ddp")
    check(trainer.strategy._model_averager is None, "teardown kept the averager")
    return ("PyTorch's post_localSGD_hook and comm_hook='post_local_sgd' average with collie's "
            "averager")


CASES = {
    "registry": case_registry,
    "plain": case_plain,
    "static_graph_bucket_view": case_static_graph_bucket_view,
    "fp16": case_fp16,
    "powersgd": case_powersgd,
    "accumulate": case_accumulate,
    "manual": case_manual,
    "post_local_sgd": case_post_local_sgd,
    "sync_dist": case_sync_dist,
    "checkpoint_resume": case_checkpoint_resume,
}


def run(name, fn, rank):
    try:
        verdict = f"ok   {name}: {fn()}"
    except Failed as e:
        verdict = f"FAIL {name}: {e}"
        failures.append(name)
    except Exception:  # noqa: BLE001 - a case that crashed fails, with its traceback
        verdict = f"FAIL {name}: {traceback.format_exc()}"
        failures.append(name)
    print(f"[rank {rank()}] {verdict}", flush=True)
    return verdict


def script_launcher(names):
    for name in names:
        run(name, CASES[name], lambda: dist.get_rank() if dist.is_initialized()
            else os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():  # no fit got as far as torch.distributed
        sys.exit(f"FAIL: {len(failures)} of {len(names)} cases failed before any rank met "
                 "the others")
    flag = torch.tensor([len(failures)])
    dist.all_reduce(flag)
    rank = dist.get_rank()
    for p in children:  # rank 0 started the others: their exit statuses count too
        if p.wait() != 0:
            print(f"[rank 0] rank of pid {p.pid} exited with status {p.returncode}", flush=True)
            flag += 1
    if rank == 0:
        print(f"collie.lightning ({pl.__name__} {pl.__version__}, torch {torch.__version__}): "
              f"{len(names) - len(failures)} passed, {len(failures)} failed on rank 0; "
              f"{int(flag)} failures on all ranks", flush=True)
    exit_cleanly(1 if int(flag) else 0)


def spawned():
    """collie_ddp_spawn and collie_ddp_notebook (fork) against ddp_spawn: the
    model the main process gets back from rank 0."""
    want, _, ref = fit("ddp_spawn")
    if ref.callback_metrics.get("collie_wrapper") != 0.0:
        sys.exit(f"FAIL: ddp_spawn's ranks said {ref.callback_metrics}: the check cannot tell "
                 "the wrappers apart")
    for name in ("collie_ddp_spawn", "collie_ddp_fork", "collie_ddp_notebook"):
        def one(name=name):
            got, _, trainer = fit(name)
            check(isinstance(trainer.strategy, Collie),
                  f"{name} gave {type(trainer.strategy).__name__}")
            check(trainer.callback_metrics.get("collie_wrapper") == 1.0,
                  f"{name}: rank 0 trained without collie's wrapper ({trainer.callback_metrics})")
            assert_close(got, want, f"{name} against ddp_spawn")
            return f"within 1e-5 of ddp_spawn ({trainer.strategy._start_method})"
        run(name, one, lambda: "main")
    print(f"collie.lightning spawned ({pl.__name__} {pl.__version__}): "
          f"{3 - len(failures)} passed, {len(failures)} failed", flush=True)
    sys.exit(1 if failures else 0)


def case_backend():
    """Lightning's own DDP with torch.distributed on collie's backend
    (DDPStrategy(process_group_backend="collie"), the knob Lightning's docs
    name): the group is collie's, the wrapper PyTorch's, and the model
    within 1e-5 of collie_ddp's in the same job (which the script
    launcher's run checks against Lightning's ddp over Gloo). A process
    keeps its first process group, so this runs in a job of its own."""
    from torch.nn.parallel import DistributedDataParallel as TorchDDP
    strategy = pl.strategies.DDPStrategy(process_group_backend="collie")
    got, rec, trainer = fit(strategy)
    check(dist.get_backend() == "collie", f"the process group's backend is {dist.get_backend()}")
    check(rec.wrapper == TorchDDP.__module__ + "." + TorchDDP.__name__,
          f"the model was wrapped in {rec.wrapper}, not PyTorch's DDP")
    assert_same_on_every_rank(got, "ddp over the collie backend")
    want, want_rec, _ = fit("collie_ddp")
    assert_steps_close(rec, want_rec, "ddp over the collie backend against collie_ddp")
    assert_close(got, want, "ddp over the collie backend against collie_ddp, the trained model")
    return f"{STEPS} steps on backend collie: within 1e-5 of collie_ddp"


def main():
    args = sys.argv[1:]
    if args == ["spawn"]:
        spawned()
    if args == ["backend"]:
        import collie.torch  # noqa: F401 - registers the backend "collie" (in every rank)
        run("backend", case_backend, lambda: dist.get_rank() if dist.is_initialized()
            else os.environ.get("LOCAL_RANK", 0))
        flag = torch.tensor([len(failures)])
        if dist.is_initialized():
            dist.all_reduce(flag)
        for p in children:
            if p.wait() != 0:
                flag += 1
        exit_cleanly(1 if int(flag) else 0)
    names = args or list(CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"unknown case '{n}': {', '.join(CASES)} (or 'spawn' alone)")
    script_launcher(names)


if __name__ == "__main__":
    os.environ.setdefault("COLLIE_TIMEOUT", "120")
    # One folder for every rank (Lightning's script launcher starts the
    # others from rank 0, with its environment).
    # The process that made it (rank 0, or spawn's main process) removes it
    # at exit (atexit: exit_cleanly runs it too), after the ranks it started
    # have ended.
    if "COLLIE_LIGHTNING_CHECK_DIR" not in os.environ:
        import atexit
        import shutil
        import tempfile
        os.environ["COLLIE_LIGHTNING_CHECK_DIR"] = tempfile.mkdtemp(prefix="collie-lightning-")
        atexit.register(shutil.rmtree, os.environ["COLLIE_LIGHTNING_CHECK_DIR"], ignore_errors=True)
    main()
