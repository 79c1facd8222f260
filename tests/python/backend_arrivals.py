"""Which rank arrived last, through the torch.distributed backend "collie":
the last rank sleeps 20 ms before each of 10 dist.all_reduce calls, and
collie.distributed.arrivals() must name it on every rank, about 20 ms after
the first. At the end the process group is destroyed, and collie-run names
the same rank from the account it left (tests/launch/arrivals_report.sh
reads collie-run's line).

    collie-run -n 3 python3 backend_arrivals.py
"""
import sys
import time

import torch
import torch.distributed as dist

import collie.distributed as cd

torch.set_num_threads(1)
cd.init_process_group("collie")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
LATE, DELAY_MS, CALLS = WORLD - 1, 20, 10

cd.arrivals()  # what came before (the rendezvous) is not this test's
x = torch.ones(4096)
for _ in range(CALLS):
    if RANK == LATE:
        time.sleep(DELAY_MS / 1000)
    dist.all_reduce(x)
a = cd.arrivals()
print(f"rank {RANK}: {a['summary']}", flush=True)
bad = []
if a["collectives"] != CALLS + 1:  # and the first comparison's all-gather
    bad.append(f"compared {a['collectives']} collectives, not {CALLS + 1}")
if a["last"][LATE] < CALLS - 1:
    bad.append(f"rank {LATE} was last at only {a['last'][LATE]}")
if not 0.8 * DELAY_MS <= a["median_late_ms"][LATE] <= 5 * DELAY_MS:
    bad.append(f"rank {LATE} came {a['median_late_ms'][LATE]} ms after the first, "
               f"not about {DELAY_MS}")
try:
    cd.arrivals(dist.new_group(backend="gloo"))
    bad.append("a gloo group's arrivals were asked without an error")
except ValueError:
    pass
dist.destroy_process_group()
if bad:
    print(f"rank {RANK}: FAILED: " + "; ".join(bad), flush=True)
    sys.exit(1)
print(f"rank {RANK}: arrivals passed", flush=True)
