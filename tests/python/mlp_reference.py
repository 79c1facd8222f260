"""The small MLP, each rank's batches and the float64 serial reference of
a step's averaged gradient that the CUDA checks (cuda_ddp_check.py,
backend_cuda_check.py) compare every step's gradients with: computed by
one process on the CPU, no collective involved."""
import torch


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def reference_grads(weights, step, world):
    """The average of every rank's gradient for this step, in float64."""
    m = model().double()
    with torch.no_grad():
        for p, w in zip(m.parameters(), weights):
            p.copy_(w.double())
    total = [torch.zeros_like(p) for p in m.parameters()]
    for r in range(world):
        m.zero_grad()
        x, y = batch(r, step)
        torch.nn.functional.mse_loss(m(x.double()), y.double()).backward()
        for t, p in zip(total, m.parameters()):
            t += p.grad
    return [t / world for t in total]
