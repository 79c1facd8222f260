"""collie.torch's DDP under COLLIE_DETERMINISTIC: trains a small MLP and
prints, on rank 0, a checksum of the final parameters' bytes, which
tests/launch/deterministic_train.sh compares across backends.

    COLLIE_DETERMINISTIC=1 collie-run -n 4 python3 deterministic_ddp.py
"""
import hashlib

import torch

import collie.torch as ct

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
ddp = ct.DistributedDataParallel(model, bucket_cap_mb=0.004, first_bucket_cap_mb=0.002)
rank = ddp.comm.rank
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
for step in range(20):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
if rank == 0:
    print(f"final parameters sha256 {digest.hexdigest()[:16]}")
ddp.close()
