"""collie.torch's DistributedDataParallel with PyTorch's API, against
PyTorch's own DDP over Gloo (and serial references), on 2 or 3 ranks:

    collie-run -n 2 python3 torch_api_check.py [case ...]

  * join with PyTorch's signature (divide_by_initial_world_size either way,
    throw_on_early_termination), and PyTorch's Join driving the wrapper as
    a Joinable, against PyTorch's DDP in PyTorch's Join; no_sync
    micro-batches inside both;
  * buffers of every dtype (int8, bool, non-contiguous), byte for byte as
    PyTorch's DDP moves them: at construction, before forwards, in and
    after a join, and with broadcast_buffers=False;
  * Work.get_future(): its value, then() chains, and a comm hook written
    the way PyTorch's docs write them (an async all-reduce's future); a
    failed op's future handed straight to PyTorch's own DDP raises collie's
    error from backward;
  * errors: torch.distributed.DistError / DistBackendError where PyTorch
    has them, with collie's message naming the rank;
  * the constructor in PyTorch 2.x's positional order, and the options
    collie refuses;
  * bad input, each a clear error on the rank that made it, never a hang:
    a model that differs across ranks, a loss not computed through the
    wrapper's output, register_comm_hook after the first step, a hook that
    returns the wrong number of elements.
Prints one ok/FAIL line per case and rank, then "N passed, N failed".
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import check_cases
from check_cases import Failed, check
import collie
import collie.torch as ct

torch.set_num_threads(1)
dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
TORCH2 = hasattr(dist, "DistError")


def mlp(seed=3, hidden=16):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 2))


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


def train(model, steps, ctx=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with (ctx() if ctx else _null()):
        for step in range(steps):
            opt.zero_grad()
            x, y = batch(step, RANK)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def close(got, want, what, rtol=1e-5):
    for i, (a, b) in enumerate(zip(got, want)):
        err = ((a.double() - b.double()).norm() / (b.double().norm() + 1e-30)).item()
        check(err <= rtol, f"{what}: parameter {i} is {err:.2e} (relative) from PyTorch's")


def same_everywhere(params, what):
    flat = torch.cat([p.reshape(-1) for p in params])
    everyone = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(everyone, flat)
    check(all(torch.equal(e, flat) for e in everyone), f"{what}: the ranks' models differ")


def expect_error(fn, words, what, kinds=(collie.Error,)):
    try:
        fn()
    except kinds as e:
        msg = str(e)
        check(all(w in msg for w in words), f"{what}: the error does not say {words}: {msg}")
        return msg
    raise Failed(f"{what}: no error")


# ---- the cases -------------------------------------------------------------------

def case_join():
    """Rank r has 2 + 2r batches. collie's join() and PyTorch's Join driving
    collie's wrapper, against PyTorch's DDP in PyTorch's Join, dividing by
    the initial world and by the ranks still training."""
    steps = 2 + 2 * RANK
    for divide in (True, False):
        a = TorchDDP(mlp())
        want = train(a, steps, lambda: Join([a], divide_by_initial_world_size=divide))
        b = ct.DistributedDataParallel(mlp())
        got = train(b, steps, lambda: b.join(divide_by_initial_world_size=divide))
        close(got, want, f"ddp.join(divide_by_initial_world_size={divide})")
        same_everywhere(got, "ddp.join")
        b.close()
        c = ct.DistributedDataParallel(mlp())
        got = train(c, steps, lambda: Join([c], divide_by_initial_world_size=divide))
        close(got, want, f"Join([collie's DDP], divide_by_initial_world_size={divide})")
        c.close()
    # Positional, as PyTorch's: join(False) is divide_by_initial_world_size=False.
    d = ct.DistributedDataParallel(mlp())
    got = train(d, steps, lambda: d.join(False))
    close(got, want, "ddp.join(False)")
    d.close()
    return "join() and PyTorch's Join over collie's wrapper match PyTorch's, both divisors"


class Buffered(torch.nn.Module):
    """The MLP with buffers of the dtypes models carry (BatchNorm's float
    statistics and int64 step count, an int8 code, a bool mask, and a
    non-contiguous one), which every forward changes by rank."""

    def __init__(self, mask_dtype=torch.bool):
        super().__init__()
        self.net = mlp()
        self.register_buffer("mean", torch.full((6,), float(RANK)))
        self.register_buffer("count", torch.tensor(10 * RANK))
        self.register_buffer("codes", torch.full((5,), 120 - RANK, dtype=torch.int8))
        self.register_buffer("mask", (torch.arange(6) % (RANK + 2) == 0).to(mask_dtype))
        self.register_buffer("grid", torch.full((2, 3), float(RANK)).t())

    def forward(self, x):
        out = self.net(x + 0.1 * self.mean)  # the parameters learn which rank's buffers came
        with torch.no_grad():
            self.mean.mul_(0.5).add_(x.mean(0))
            self.count += 1 + RANK
            self.codes.add_(3 + RANK)  # wraps past 127
            self.mask ^= x[0] > 0
            self.grid.add_(x[:3, :2])
        return out


def buffers_of(module):
    return [(name, t.detach().clone()) for name, t in module.named_buffers()]


def gloo_mask_dtype():
    """bool where Gloo moves bools; uint8 (the same bytes) on 1.13's."""
    try:
        dist.broadcast(torch.zeros(1, dtype=torch.bool), 0)
        return torch.bool
    except RuntimeError:
        return torch.uint8


def same_buffers(got, want, what):
    """got: a module; want: a module or buffers_of one."""
    want = want if isinstance(want, list) else buffers_of(want)
    for (name, a), (_, b) in zip(got.named_buffers(), want):
        bytes_of = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        check(a.dtype in (b.dtype, torch.bool) and torch.equal(bytes_of(a), bytes_of(b)),
              f"{what}: buffer {name} ({a.dtype}) is {a.tolist()}, PyTorch's {b.tolist()}")


def case_buffers():
    """Buffers of every dtype move as PyTorch's DDP moves them: rank 0's at
    construction and before each forward; in a join (rank r has 2 + 2(n-1-r)
    batches, so rank 0 trains longest), the highest training rank's, then
    the longest-training rank's at the end, and the highest rank's after
    it; with broadcast_buffers=False (2.x), none. The forward reads a
    buffer, so the parameters differ where a buffer came from another rank.
    Compared byte for byte with PyTorch's DDP's (whose Gloo on 1.13 does
    not take bools: a uint8 mask there)."""
    theirs = gloo_mask_dtype()
    a, b = TorchDDP(Buffered(theirs)), ct.DistributedDataParallel(Buffered())
    same_buffers(b.module, a.module, "after construction")
    close(train(b, 3), train(a, 3), "training with buffers")
    same_buffers(b.module, a.module, "after 3 steps")
    b.close()
    steps = 2 + 2 * (WORLD - 1 - RANK)
    a = TorchDDP(Buffered(theirs))
    want = train(a, steps, lambda: Join([a]))
    want_buffers = buffers_of(a.module)
    want_after = train(a, 2)  # still in the Join's config: the highest rank's buffers
    want_buffers_after = buffers_of(a.module)
    for how in ("ddp.join()", "Join([collie's DDP])"):
        b = ct.DistributedDataParallel(Buffered())
        got = train(b, steps, (lambda: b.join()) if how == "ddp.join()" else (lambda: Join([b])))
        close(got, want, how)
        same_buffers(b.module, want_buffers, how)
        close(train(b, 2), want_after, f"2 steps after {how}")
        same_buffers(b.module, want_buffers_after, f"2 steps after {how}")
        b.close()
    if TORCH2:  # 1.13's DDP sends buffers at construction whatever the flag
        a = TorchDDP(Buffered(theirs), broadcast_buffers=False)
        b = ct.DistributedDataParallel(Buffered(), broadcast_buffers=False)
        same_buffers(b.module, a.module, "broadcast_buffers=False, after construction")
        close(train(b, 2), train(a, 2), "broadcast_buffers=False")
        same_buffers(b.module, a.module, "broadcast_buffers=False, after 2 steps")
        b.close()
    return "float32, int64, int8, bool and non-contiguous buffers as PyTorch's DDP moves them"


def train_accumulating(model, steps, ctx):
    """Gradients accumulated over two micro-batches, the first under
    no_sync; then a step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctx():
        for step in range(steps):
            x, y = batch(step, RANK)
            with (model.no_sync() if step % 2 == 0 else _null()):
                torch.nn.functional.mse_loss(model(x), y).backward()
            if step % 2 == 1:
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def case_join_no_sync():
    """no_sync micro-batches inside a join (rank r has 2 + 2r): the ranks
    that joined shadow only the synchronising steps, as PyTorch's DDP's do,
    and the parameters match PyTorch's DDP in PyTorch's Join."""
    steps = 2 + 2 * RANK
    a = TorchDDP(Buffered(gloo_mask_dtype()))
    want = train_accumulating(a, steps, lambda: Join([a]))
    for how in ("ddp.join()", "Join([collie's DDP])"):
        b = ct.DistributedDataParallel(Buffered())
        got = train_accumulating(b, steps, (lambda: b.join()) if how == "ddp.join()"
                                 else (lambda: Join([b])))
        close(got, want, f"no_sync in {how}")
        same_buffers(b.module, a.module, f"no_sync in {how}")
        b.close()
    return "no_sync micro-batches in ddp.join() and in PyTorch's Join match PyTorch's DDP"


def case_join_throw():
    """throw_on_early_termination: every rank raises once rank 0 (the one
    with fewest batches) runs out, none hangs."""
    b = ct.DistributedDataParallel(mlp())
    steps = 2 + 2 * RANK
    msg = expect_error(lambda: train(b, steps, lambda: b.join(throw_on_early_termination=True)),
                       ["exhausted all inputs"], "join(throw_on_early_termination=True)")
    b.close()
    return f"every rank raised: {msg[:70]}..."


def case_future():
    comm = collie.default_communicator()
    t = torch.full((5,), float(RANK + 1))
    fut = comm.allreduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    want = float(WORLD * (WORLD + 1) / 2)
    check(torch.equal(fut.wait()[0], torch.full((5,), want)), f"future value {fut.wait()}")
    check(torch.equal(doubled.wait(), torch.full((5,), 2 * want)), "then() did not chain")

    # A hook as PyTorch's docs write one: an async all-reduce's future,
    # divided in then().
    def hook(state, bucket):
        buf = bucket.buffer()
        return comm.allreduce(buf, async_op=True).get_future().then(
            lambda f: f.value()[0].div_(WORLD))
    a = ct.DistributedDataParallel(mlp())
    want_params = train(a, 3)
    b = ct.DistributedDataParallel(mlp())
    b.register_comm_hook(None, hook)
    close(train(b, 3), want_params, "a comm hook returning Work.get_future().then(...)", 1e-6)
    a.close()
    b.close()
    return "get_future(): value, then(), and a PyTorch-style hook on it"


def case_future_error():
    """PyTorch's own DDP with a comm hook returning collie's future of an
    op that fails (counts that differ across ranks, on a communicator of
    its own): backward raises collie's error on every rank. get_future()
    used to fail its future with set_exception, which a Python Future
    keeps as its value: PyTorch's C++ reducer read that as tensors
    ("Unable to cast ..." on 2.15; a SIGSEGV in the backend's twin)."""
    sub = collie.default_communicator().split(0, RANK)

    def hook(state, bucket):
        buf = bucket.buffer()
        part = buf[:buf.numel() - RANK]  # a different count on every rank
        return sub.allreduce(part, async_op=True).get_future()  # straight to PyTorch's C++
    net = TorchDDP(mlp())
    net.register_comm_hook(None, hook)
    x, y = batch(0, RANK)
    msg = expect_error(
        lambda: torch.nn.functional.mse_loss(net(x), y).backward(), ["called allreduce", "rank"],
        "a hook's failed collie future", (RuntimeError,))
    check("Unable to cast" not in msg, f"PyTorch read the error as the future's value: {msg}")
    return f"backward raised: {msg.splitlines()[0][:90]}"


def case_errors():
    comm = collie.default_communicator()
    kinds = (dist.DistError,) if TORCH2 else (RuntimeError,)
    msg = expect_error(lambda: comm.allreduce(torch.zeros(3, dtype=torch.complex64)),
                       ["complex64"], "a complex tensor", kinds)
    err = None
    try:
        comm.allreduce(torch.zeros(3, dtype=torch.complex64))
    except collie.Error as e:
        err = e
    check(err is not None and err.code == "invalid_argument", f"code {getattr(err, 'code', None)}")
    if TORCH2:
        check(issubclass(ct.DistBackendError, dist.DistBackendError)
              and issubclass(ct.DistBackendError, collie.Error),
              "collie.torch.DistBackendError is not both errors")
    return f"{'DistError' if TORCH2 else 'RuntimeError'} carrying collie's message: {msg[:60]}"


def case_constructor():
    # PyTorch 2.x's order: module, device_ids, output_device, dim,
    # broadcast_buffers, init_sync, process_group, bucket_cap_mb, ...
    m = ct.DistributedDataParallel(mlp(), None, None, 0, True, True, None, 1, False, False, True)
    check(m._bucket_view is True, "gradient_as_bucket_view (11th positional) did not arrive")
    close(train(m, 2), train(TorchDDP(mlp(), bucket_cap_mb=1, gradient_as_bucket_view=True), 2),
          "positional construction")
    m.close()
    for name, value in (("mixed_precision", object()), ("device_mesh", object()),
                        ("skip_all_reduce_unused_params", True)):
        expect_error(lambda: ct.DistributedDataParallel(mlp(), **{name: value}),
                     [name, "does not take"], f"{name}=...")
    return "PyTorch 2.x's positional order; mixed_precision, device_mesh, ... refused by name"


def case_model_differs():
    """Rank 1 (the last rank) builds a wider hidden layer: the constructor
    fails on every rank, naming the mismatch, instead of reducing
    gradients of different layouts."""
    hidden = 17 if RANK == WORLD - 1 else 16
    msg = expect_error(lambda: ct.DistributedDataParallel(mlp(hidden=hidden)),
                       ["rank"], "a model that differs across ranks")
    return f"refused on every rank: {msg[:90]}"


def case_loss_not_through_wrapper():
    """A forward through the wrapper whose output is dropped, then the loss
    computed from .module: PyTorch's DDP still reduces (the forward armed its
    hooks), and so must collie's, rather than step on a local gradient."""
    def steps(model, module):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            x, y = batch(step, RANK)
            model(x)
            torch.nn.functional.mse_loss(module(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    a = TorchDDP(mlp())
    want = steps(a, a.module)
    b = ct.DistributedDataParallel(mlp())
    got = steps(b, b.module)
    close(got, want, "a loss computed from .module after a forward through the wrapper")
    same_everywhere(got, "loss from .module")
    b.close()
    return "reduced as PyTorch's DDP reduces it"


def case_hook_after_first_step():
    b = ct.DistributedDataParallel(mlp())
    train(b, 1)
    msg = expect_error(lambda: b.register_comm_hook(None, "fp16"),
                       ["register_comm_hook", "rank"], "register_comm_hook after the first step")
    b.close()
    return f"refused: {msg[:90]}"


def case_hook_wrong_shape():
    b = ct.DistributedDataParallel(mlp())
    b.register_comm_hook(None, lambda state, bucket: torch.zeros(bucket.buffer().numel() + 1))
    msg = expect_error(lambda: train(b, 1), ["elements", "rank"],
                       "a hook returning the wrong number of elements")
    b.close()
    return f"an error naming the rank: {msg[:90]}"


def case_compile():
    """torch.compile of the wrapper (PyTorch 2.x): the same parameters as
    the eager wrapper after 3 steps, with several buckets. Compiled with
    aot_eager: what touches collie (Dynamo's trace of the wrapper, the
    backward AOTAutograd makes, whose gradients fire the reducer's hooks)
    is the same as under inductor, whose kernels g++ compiled for 10-16 s
    of each run (collie's DDP under inductor: bench/torch_ddp_bench.py
    --compile)."""
    if not hasattr(torch, "compile"):
        return "skipped: this PyTorch has no torch.compile"
    small = dict(bucket_cap_mb=0.0005, first_bucket_cap_mb=0.0005)
    eager = ct.DistributedDataParallel(mlp(hidden=32), **small)
    want = train(eager, 3)
    b = ct.DistributedDataParallel(mlp(hidden=32), **small)
    compiled = torch.compile(b, backend="aot_eager")
    opt = torch.optim.SGD(b.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, RANK)
        torch.nn.functional.mse_loss(compiled(x), y).backward()
        opt.step()
    got = [p.detach().clone() for p in b.parameters()]
    close(got, want, "torch.compile(collie's DDP) against the eager wrapper")
    same_everywhere(got, "torch.compile")
    buckets = b.reducer_stats()["num_buckets"]
    check(buckets > 1, f"one bucket only ({buckets}): the case checks nothing about buckets")
    eager.close()
    b.close()
    return f"torch.compile(ddp): the eager wrapper's parameters, {buckets} buckets"


def case_bucket_order():
    """Buckets follow backward's order after the first step's rebuild: the
    last layer's bucket first, sent while earlier layers are still in
    backward. (collie.torch once marked the first step's gradients at its
    end in registration order, and the rebuild put the first layer's
    bucket first: every bucket then waited for the end of backward.)"""
    torch.manual_seed(5)
    layers = [torch.nn.Linear(64, 64) for _ in range(6)]
    model = torch.nn.Sequential(*layers)
    b = ct.DistributedDataParallel(model, bucket_cap_mb=0.01, first_bucket_cap_mb=0.01)
    layer_of = {p.data_ptr(): k for k, layer in enumerate(layers) for p in layer.parameters()}
    events = []

    def hook(state, bucket):
        events.append(("bucket", bucket.index(),
                       sorted({layer_of[p.data_ptr()] for p in bucket.parameters()})))
        bucket.comm.allreduce(bucket.buffer())
        bucket.buffer().div_(bucket.comm.size)

    b.register_comm_hook(None, hook)
    # The first layer's weight gradient comes last in backward.
    layers[0].weight.register_hook(lambda g: events.append(("first layer's gradient",)))
    x = torch.randn(4, 64)
    for _ in range(3):
        events.clear()
        b(x).sum().backward()
    buckets = [e for e in events if e[0] == "bucket"]
    order = [e[2] for e in buckets]
    check(len(buckets) >= 4, f"{len(buckets)} buckets: the case needs several: {order}")
    check(order[0] == [5], f"bucket 0 holds layers {order[0]}, not the last layer's")
    flat = [k for layers_in in order for k in layers_in]
    check(flat == sorted(flat, reverse=True), f"buckets hold layers in this order: {order}")
    first_grad = events.index(("first layer's gradient",))
    check(events.index(buckets[0]) < first_grad,
          f"bucket 0 left after backward reached the first layer: {events}")
    b.close()
    return f"buckets after the rebuild hold layers {order}, the first sent during backward"


def case_no_gradient():
    """A parameter the forward never uses, without find_unused_parameters:
    an error at the end of that backward naming it and the rank; with
    find_unused_parameters the same model trains, its gradient left None."""
    def make():
        torch.manual_seed(4)
        m = torch.nn.ModuleDict({"used": torch.nn.Linear(6, 2), "idle": torch.nn.Linear(6, 2)})
        m.forward = lambda x: m["used"](x)
        return m
    b = ct.DistributedDataParallel(make())
    x, y = batch(0, RANK)
    msg = expect_error(lambda: torch.nn.functional.mse_loss(b(x), y).backward(),
                       ["idle.weight", "idle.bias", "received no gradient", f"rank {RANK}",
                        "find_unused_parameters"], "a parameter with no gradient")
    b.close()
    b = ct.DistributedDataParallel(make(), find_unused_parameters=True)
    for step in range(2):
        torch.nn.functional.mse_loss(b(x), y).backward()
    check(b.module["idle"].weight.grad is None, "an unused parameter got a gradient")
    check(b.module["used"].weight.grad is not None, "a used parameter got no gradient")
    b.close()
    return f"an error naming them: {msg[:100]}"


def case_late_gradient():
    """A step that gives a parameter more gradients than the first step did
    (reentrant checkpointing of a layer used twice), after its bucket has
    left: an error naming it, on every rank, and the next step is in step."""
    torch.manual_seed(6)
    head, body = torch.nn.Linear(6, 8), torch.nn.Linear(8, 8)
    model = torch.nn.ModuleList([head, body])
    b = ct.DistributedDataParallel(model, bucket_cap_mb=0.0002, first_bucket_cap_mb=0.0002)
    from torch.utils.checkpoint import checkpoint

    def twice(h):
        h = checkpoint(body, h, use_reentrant=True)
        return checkpoint(body, h, use_reentrant=True)
    b.module.forward = lambda x, again=False: (twice if again else body)(head(x))
    x = torch.randn(4, 6)
    for _ in range(2):
        b(x).sum().backward()
    msg = expect_error(lambda: b(x, again=True).sum().backward(),
                       ["1.weight", "after theirs had been reduced", f"rank {RANK}"],
                       "a gradient that arrives after its bucket left")
    b(x).sum().backward()  # the ranks are still in step
    b.close()
    return f"an error naming it: {msg[:100]}"


def case_check_nonfinite():
    """check_nonfinite=True: a NaN that the last rank's backward leaves in one
    element of one gradient (a tensor hook, as a bad kernel would) is named
    on every rank, with the rank, parameter, element and iteration, before
    it is averaged; the next step trains on in step."""
    model = ct.DistributedDataParallel(mlp(), check_nonfinite=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model.module[2].weight  # [2, 16]: element (1, 5) is 21 in its flat order

    def poison(g):
        g = g.clone()
        g[1, 5] = float("nan")
        return g
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, RANK)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step != 1:
            loss.backward()
            opt.step()
            continue
        handle = weight.register_hook(poison) if RANK == WORLD - 1 else None
        expect_error(loss.backward,
                     ["non-finite gradients at iteration 1, found before averaging: "
                      f"rank {WORLD - 1}: parameter 2.weight has NaN at element 21 "
                      "(1 non-finite element in 1 parameter)"], "a NaN on one rank")
        if handle:
            handle.remove()
    params = list(model.module.parameters())
    check(all(bool(torch.isfinite(p).all()) for p in params), "the model is not finite")
    same_everywhere(params, "after the step that failed")
    model.close()


def case_check_replicas():
    """check_replicas=2: one ulp added to one element of the last rank's
    model between steps is found at the next check, naming that rank, the
    parameter, the element and both values, on every rank."""
    model = ct.DistributedDataParallel(mlp(), check_replicas=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        x, y = batch(step, RANK)
        if step == 2:
            bias = model.module[0].bias
            ref = float(bias[3].item())
            moved = float(torch.nextafter(bias[3], torch.tensor(float("inf"))).item())
            if RANK == WORLD - 1:
                with torch.no_grad():
                    bias[3] = moved
            others = ", ".join(str(r) for r in range(WORLD - 1))
            words = [f"replicas disagree at iteration 2: rank {WORLD - 1} holds parameters that "
                     f"differ from those of rank{'s' if WORLD > 2 else ''} {others}; the first "
                     f"parameter that differs is 0.bias (16 f32); rank {WORLD - 1}: element 3 is "
                     f"{moved:.9g} where rank 0's is {ref:.9g}, largest difference "
                     f"{moved - ref:.9g} (element 3)"]
            expect_error(lambda: torch.nn.functional.mse_loss(model(x), y).backward(), words,
                         "one ulp on one rank")
            return
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    raise Failed("no check at iteration 2")


CASES = {"future_error": case_future_error, "bucket_order": case_bucket_order, "no_gradient": case_no_gradient,
         "late_gradient": case_late_gradient, "join": case_join, "compile": case_compile, "join_throw": case_join_throw, "future": case_future,
         "errors": case_errors, "constructor": case_constructor,
         "model_differs": case_model_differs,
         "loss_not_through_wrapper": case_loss_not_through_wrapper,
         "hook_after_first_step": case_hook_after_first_step,
         "hook_wrong_shape": case_hook_wrong_shape, "check_nonfinite": case_check_nonfinite,
         "check_replicas": case_check_replicas, "buffers": case_buffers,
         "join_no_sync": case_join_no_sync}


def main():
    check_cases.run(CASES, sys.argv[1:] or list(CASES), Failed, RANK, WORLD)


if __name__ == "__main__":
    os.environ.setdefault("COLLIE_TIMEOUT", "60")
    main()
