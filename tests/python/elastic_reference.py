"""The two elastic DDP checks' shared ground (elastic_ddp.py, by hand;
elastic_reform.py, by ddp.reform()): the fixed dataset, the two-layer
float64 model, and serial full-batch training on one process that every
rank's final parameters are compared with. At step i the global batch is
the samples i * 16 .. i * 16 + 15, rank r of the world of 4 taking a
quarter by its rank; rank 1 kills itself at step KILL_AT."""
import torch

STEPS, KILL_AT, PER_RANK, LR = 12, 5, 4, 0.1


def data():
    g = torch.Generator().manual_seed(3)
    n = STEPS * 4 * PER_RANK
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    y = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return x, y


def model(seed=11):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2)).double()


def serial(x, y, momentum=0.0):
    """The parameters after STEPS steps of SGD (with `momentum`) on the
    whole global batch, in one process."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=momentum)
    for i in range(STEPS):
        b = slice(i * 4 * PER_RANK, (i + 1) * 4 * PER_RANK)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x[b]), y[b]).backward()
        opt.step()
    return [p.detach() for p in m.parameters()]
