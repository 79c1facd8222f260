"""collie.torch.DistributedDataParallel against PyTorch's DDP over Gloo, side
by side in one run: step time, the all-reduce alone, exposed communication.

    collie-run -n 2 /usr/bin/python3 bench/torch_ddp_bench.py [--batch 2 16]
        [--layers 3] [--width 4096] [--iters 5] [--rounds 3] [--no-fp16] [--compile]
        [--backend] [--cpp] [--checks]

--backend adds PyTorch's own DDP over the torch.distributed backend
"collie" (collie.distributed), against the same over Gloo (with the fp16
rows, also with collie.distributed.fp16_compress_hook in place of
PyTorch's); where PyTorch's
DDP takes its buckets' memory from the backend (2.15; not 1.13, 2.1), also over
"collie_plain", the same backend offering none (its buckets in PyTorch's
memory). --cpp adds it
over "collie_cpp", the backend written as a C++ extension
(bench/c10d_ext/: all_reduce, broadcast, barrier only; no fp16 hook run).

The model is `layers` x Linear(width, width) with ReLU between (3 x 4096:
50 M parameters, 201 MB of f32 gradients). A step is forward, backward and
SGD's update. Each configuration runs `iters` timed steps per round after a
warm-up, the configurations interleaved round by round so that drift in the
machine's speed falls on all of them alike; the figure is the median over
every timed step (rank 0's clock, the ranks synchronised by a barrier before
each step). "local" is the same step with no communication at all;
"exposed" is a configuration's step minus local's: the communication that
backward did not hide. "all-reduce alone" is one blocking all-reduce of the
whole gradient (f32, sum), Gloo's and collie's, timed the same way.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import collie.distributed
import collie.torch as ct


def make_model(layers, width):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fp16", action="store_true", help="leave out the fp16 hook runs")
    ap.add_argument("--compile", action="store_true",
                    help="also both wrappers under torch.compile (PyTorch 2.x)")
    ap.add_argument("--backend", action="store_true",
                    help="also PyTorch's DDP over the torch.distributed backend 'collie'")
    ap.add_argument("--cpp", action="store_true",
                    help="also PyTorch's DDP over the C++ extension backend 'collie_cpp'")
    ap.add_argument("--noop", action="store_true",
                    help="also collie with the noop hook: the reducer's own cost, no communication")
    ap.add_argument("--checks", action="store_true",
                    help="also collie with the replica check at every step (the cost of one "
                         "check; every N steps costs 1/N of it) and with the non-finite check")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hooks = [False] if args.no_fp16 else [False, True]
    collie_group = dist.new_group(backend="collie") if args.backend else None
    plain_group = None
    if args.backend and collie_group._memory is not None:
        # The same backend offering PyTorch's DDP no memory of collie's: its
        # buckets in PyTorch's, all-reduced through process_vm_readv on shm.
        class Plain(collie.distributed.ProcessGroupCollie):
            def _offer_memory(self):
                self._memory = None

        dist.Backend.register_backend("collie_plain", lambda *a: Plain(*a[:4]), devices=["cpu"])
        plain_group = dist.new_group(backend="collie_plain")
    if args.cpp:
        import os
        import sys
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "c10d_ext"))
        import register
        register.register()
    cpp_group = dist.new_group(backend="collie_cpp") if args.cpp else None

    def build(kind, fp16):
        m = make_model(args.layers, args.width)
        if kind.endswith("+compile"):
            ddp, opt = build(kind[:-len("+compile")], fp16)
            return torch.compile(ddp), opt
        if kind == "torch":
            m = TorchDDP(m, gradient_as_bucket_view=True)
            if fp16:
                m.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif kind == "torch@collie":
            m = TorchDDP(m, gradient_as_bucket_view=True, process_group=collie_group)
            if fp16:
                m.register_comm_hook(collie_group, default_hooks.fp16_compress_hook)
        elif kind == "torch@collie+hook":
            m = TorchDDP(m, gradient_as_bucket_view=True, process_group=collie_group)
            m.register_comm_hook(collie_group, collie.distributed.fp16_compress_hook)
        elif kind == "torch@collie_plain":
            m = TorchDDP(m, gradient_as_bucket_view=True, process_group=plain_group)
            if fp16:
                m.register_comm_hook(plain_group, default_hooks.fp16_compress_hook)
        elif kind == "torch@collie_cpp":
            m = TorchDDP(m, gradient_as_bucket_view=True, process_group=cpp_group)
        elif kind == "collie":
            m = ct.DistributedDataParallel(m, gradient_as_bucket_view=True,
                                           comm_hook="fp16" if fp16 else None)
        elif kind == "collie+replicas@1":
            m = ct.DistributedDataParallel(m, gradient_as_bucket_view=True, check_replicas=1)
        elif kind == "collie+nonfinite":
            m = ct.DistributedDataParallel(m, gradient_as_bucket_view=True, check_nonfinite=True)
        elif kind == "noop":
            m = ct.DistributedDataParallel(m, gradient_as_bucket_view=True, comm_hook="noop")
        return m, torch.optim.SGD(m.parameters(), lr=1e-6)

    configs = [("local", False)] + [(k, h) for h in hooks for k in ("torch", "collie")]
    if args.compile:
        configs += [("torch+compile", False), ("collie+compile", False)]
    if args.noop:
        configs.append(("noop", False))
    if args.checks:
        configs += [("collie+replicas@1", False), ("collie+nonfinite", False)]
    if args.backend:
        configs += [("torch@collie", h) for h in hooks]
        if True in hooks:
            configs.append(("torch@collie+hook", True))
        if plain_group is not None:
            configs += [("torch@collie_plain", h) for h in hooks]
    if args.cpp:
        configs.append(("torch@collie_cpp", False))
    models = {c: build(*c) for c in configs}
    n_params = sum(p.numel() for p in models[configs[0]][0].parameters())
    grad = torch.ones(n_params)
    samples = {}  # (batch, config) -> step seconds

    def step(model, opt, x):
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    comm = models[("collie", False)][0].comm
    for rnd in range(args.rounds):
        for batch in args.batch:
            x = torch.randn(batch, args.width, generator=torch.Generator().manual_seed(rank))
            for c in configs:
                model, opt = models[c]
                for i in range(args.iters + (2 if rnd == 0 else 0)):
                    t = timed(lambda: step(model, opt, x))
                    if rnd > 0 or i >= 2:
                        samples.setdefault((batch, c), []).append(t)
        for name, fn in (("gloo", lambda: dist.all_reduce(grad)),
                         ("collie", lambda: comm.allreduce(grad))):
            for i in range(args.iters + (1 if rnd == 0 else 0)):
                t = timed(fn)
                if rnd > 0 or i >= 1:
                    samples.setdefault(("allreduce", name), []).append(t)

    if rank == 0:
        ms = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
        print(f"# {world} ranks, {args.layers} x Linear({args.width}, {args.width}): "
              f"{n_params / 1e6:.1f} M parameters, {4 * n_params / 1e6:.0f} MB of f32 gradients; "
              f"medians of {args.rounds * args.iters} steps; gradient_as_bucket_view on both")
        g, c = ms[("allreduce", "gloo")], ms[("allreduce", "collie")]
        print(f"all-reduce alone ({4 * n_params / 1e6:.0f} MB f32): Gloo {g:.1f} ms, "
              f"collie {c:.1f} ms ({g / c:.2f} x)")
        print(f"{'batch':>5}  {'hook':<5} {'local ms':>9} {'torch ms':>9} {'collie ms':>10} "
              f"{'speed-up':>8}  {'torch exposed':>13} {'collie exposed':>14}")
        for batch in args.batch:
            local = ms[(batch, ("local", False))]
            for h in hooks:
                t, c = ms[(batch, ("torch", h))], ms[(batch, ("collie", h))]
                print(f"{batch:>5}  {'fp16' if h else '-':<5} {local:>9.1f} {t:>9.1f} {c:>10.1f} "
                      f"{t / c:>7.2f}x  {t - local:>11.1f}ms {c - local:>12.1f}ms")
                if args.backend:
                    b = ms[(batch, ("torch@collie", h))]
                    print(f"{batch:>5}  {'fp16' if h else '-':<5} {local:>9.1f} {t:>9.1f} {b:>10.1f} "
                          f"{t / b:>7.2f}x  {t - local:>11.1f}ms {b - local:>12.1f}ms   "
                          "PyTorch's DDP over the collie backend")
                if args.backend and h:
                    b = ms[(batch, ("torch@collie+hook", h))]
                    print(f"{batch:>5}  {'fp16':<5} {local:>9.1f} {t:>9.1f} {b:>10.1f} "
                          f"{t / b:>7.2f}x  {t - local:>11.1f}ms {b - local:>12.1f}ms   "
                          "the same, collie.distributed.fp16_compress_hook")
                if plain_group is not None:
                    b = ms[(batch, ("torch@collie_plain", h))]
                    print(f"{batch:>5}  {'fp16' if h else '-':<5} {local:>9.1f} {t:>9.1f} "
                          f"{b:>10.1f} {t / b:>7.2f}x  {t - local:>11.1f}ms {b - local:>12.1f}ms"
                          "   the same, its buckets in PyTorch's memory")
                if args.cpp and not h:
                    b = ms[(batch, ("torch@collie_cpp", h))]
                    print(f"{batch:>5}  {'-':<5} {local:>9.1f} {t:>9.1f} {b:>10.1f} "
                          f"{t / b:>7.2f}x  {t - local:>11.1f}ms {b - local:>12.1f}ms   "
                          "PyTorch's DDP over the C++ extension backend collie_cpp")
            if args.compile:
                t, c = ms[(batch, ("torch+compile", False))], ms[(batch, ("collie+compile", False))]
                print(f"{batch:>5}  {'-':<5} {local:>9.1f} {t:>9.1f} {c:>10.1f} {t / c:>7.2f}x  "
                      f"{t - local:>11.1f}ms {c - local:>12.1f}ms   torch.compile(ddp)")
            if args.checks:
                c = ms[(batch, ("collie", False))]
                r = ms[(batch, ("collie+replicas@1", False))]
                n = ms[(batch, ("collie+nonfinite", False))]
                print(f"{batch:>5}  checks: replicas at every step {r:.1f} ms ({r - c:+.1f} ms a "
                      f"check: every 100 steps {100 * (r - c) / 100 / c:+.2f} % of a step); "
                      f"non-finite {n:.1f} ms ({100 * (n - c) / c:+.1f} % of a step)")
            if args.noop:
                n = ms[(batch, ("noop", False))]
                print(f"{batch:>5}  noop: collie with no communication {n:.1f} ms "
                      f"({n - local:+.1f} ms over local)")
    for c in configs:
        if c[0] in ("collie", "noop", "collie+replicas@1", "collie+nonfinite"):
            models[c][0].close()
    if args.compile:
        models[("collie+compile", False)][0]._orig_mod.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
