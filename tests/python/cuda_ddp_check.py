"""collie.torch on CUDA tensors: two ranks on one GPU (NCCL told they are on
different hosts through NCCL_HOSTID), a small MLP trained for a few steps
with collie's DistributedDataParallel in bucket-view and copy modes and with
the fp16 hook; after every step each rank's gradients are compared with the
average over both ranks' data computed in float64 on the CPU by one process
(a serial reference, no collective involved).

    collie-run -n 2 python3 tests/python/cuda_ddp_check.py

Prints one ok/FAIL line per case and rank and ends with "N passed, N failed".
Exits 77 (skipped) without a GPU or without torch.cuda.
"""
import os
import sys

os.environ.setdefault("NCCL_HOSTID", "collie-cuda-check-" + os.environ.get("COLLIE_RANK", "0"))

import torch  # noqa: E402

if not torch.cuda.is_available():
    print("no GPU: skipped")
    sys.exit(77)

import collie  # noqa: E402
import collie.torch  # noqa: E402
from mlp_reference import batch, model, reference_grads  # noqa: E402


def run_case(comm, name, tol, **kw):
    dev = torch.device("cuda", 0)
    net = model().to(dev)
    ddp = collie.torch.DistributedDataParallel(net, comm=comm, **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    worst = 0.0
    for step in range(5):
        before = [p.detach().cpu().clone() for p in net.parameters()]
        x, y = batch(comm.rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
        ref = reference_grads(before, step, comm.size)
        for p, r in zip(net.parameters(), ref):
            err = ((p.grad.double().cpu() - r).norm() / r.norm()).item()
            worst = max(worst, err)
        opt.step()
    ddp.close()
    ok = worst <= tol
    print(f"{'ok' if ok else 'FAIL'} rank {comm.rank}: {name}: worst relative error {worst:.2e} "
          f"(tolerance {tol:.0e})", flush=True)
    return ok


def main():
    comm = collie.connect()
    cases = [("bucket view", 1e-5, dict(gradient_as_bucket_view=True)),
             ("copy", 1e-5, dict()),
             ("fp16 hook", 2e-3, dict(comm_hook="fp16")),
             ("small buckets", 1e-5, dict(bucket_cap_mb=0.001, first_bucket_cap_mb=0.001))]
    passed = failed = 0
    for name, tol, kw in cases:
        try:
            good = run_case(comm, name, tol, **kw)
        except Exception as e:  # noqa: BLE001 - reported as a failed case
            print(f"FAIL rank {comm.rank}: {name}: {type(e).__name__}: {e}", flush=True)
            good = False
        passed += good
        failed += not good
    print(f"{passed} passed, {failed} failed", flush=True)
    comm.close()
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
