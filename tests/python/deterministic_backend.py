"""The torch.distributed backend "collie" with deterministic=True: all_reduce
(sum, avg where PyTorch has it) and reduce_scatter_tensor of float32,
float16 and bfloat16 tensors give bit for bit the serial sum in rank order,
computed here from every rank's input (each rank makes every rank's, from
seeds) in float32 for the 16-bit types, rounded once; and without the mode
the same inputs give other bits at 3 ranks (so the check can fail).

    collie-run -n 3 python3 deterministic_backend.py
"""
import sys

import torch
import torch.distributed as dist

import collie.distributed as cd

torch.set_num_threads(1)
cd.init_process_group("collie", deterministic=True)
RANK, WORLD = dist.get_rank(), dist.get_world_size()


def inputs(dtype, count, seed):
    out = []
    for r in range(WORLD):
        g = torch.Generator().manual_seed(seed * 100 + r)
        scale = torch.pow(2.0, torch.randint(-8, 9, (count,), generator=g).float())
        out.append((torch.rand(count, generator=g) * 2 - 1) * scale)
    return [x.to(dtype) for x in out]


def rank_order(xs, avg=False):
    acc = xs[0].float()
    for q in range(1, len(xs)):
        acc = acc + xs[q].float()
        if avg and q == len(xs) - 1:
            acc = acc / len(xs)
    return acc.to(xs[0].dtype)


def same_bits(a, b):
    return torch.equal(a.view(torch.uint8 if a.element_size() == 1 else
                              {2: torch.int16, 4: torch.int32}[a.element_size()]),
                       b.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[b.element_size()]))


failures = []
avg = getattr(dist.ReduceOp, "AVG", None)
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for count in (5, 1000, 300001):
        xs = inputs(dtype, count, count)
        for op in [dist.ReduceOp.SUM] + ([avg] if avg is not None else []):
            t = xs[RANK].clone()
            dist.all_reduce(t, op=op)
            if not same_bits(t, rank_order(xs, op == avg)):
                failures.append(f"all_reduce {dtype} x {count} {op}")
        if count % WORLD == 0 or count > 1000:
            n = count - count % WORLD
            out = torch.empty(n // WORLD, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[RANK][:n].clone())
            want = rank_order([x[:n] for x in xs]).chunk(WORLD)[RANK]
            if not same_bits(out, want):
                failures.append(f"reduce_scatter_tensor {dtype} x {n}")
# Without the mode: another group over the same ranks.
cd._options["deterministic"] = False
plain = dist.new_group(backend="collie")
xs = inputs(torch.float32, 300001, 7)
t = xs[RANK].clone()
dist.all_reduce(t, group=plain)
plain_same = same_bits(t, rank_order(xs))
if WORLD >= 3 and plain_same:
    failures.append("without the mode the sum was the rank-order one too: this check proves nothing")
print(f"[rank {RANK}] {'ok' if not failures else 'FAIL: ' + '; '.join(failures)}")
dist.destroy_process_group()
sys.exit(1 if failures else 0)
