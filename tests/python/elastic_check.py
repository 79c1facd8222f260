"""tests/python/elastic_check.py: tests/elastic_probe.cc in Python, through
collie's Python package: a training loop that loses a rank and goes on with
a replacement, under collie-run --elastic (tests/launch/elastic.sh runs it
and says what it checks).

    python3 elastic_check.py [--steps N] [--kill-rank R --kill-at S] [--floats K]

The "model" is K floats; at step i, rank r's "gradient" element j is
(r + 1) * ((i + j) % 7 + 1), all-reduced (sum) and added. Rank R, in its
first life, SIGKILLs itself before step S's all-reduce; the others get
peer_lost, shrink(), grow() by the rank collie-run starts again
(COLLIE_JOIN=1, so its collie.connect() joins), and rank 0 broadcasts the
step and the model to it. Every rank's final model is compared exactly
with the serial sum."""
import argparse
import os
import signal
import sys
import time
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import collie  # noqa: E402


def share_state(comm, step, model):
    s = array("q", [step])
    comm.broadcast(s, 0)
    comm.broadcast(model, 0)
    return s[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--floats", type=int, default=4096)
    a = p.parse_args()
    first_life = os.environ.get("COLLIE_RESTART_COUNT", "0") == "0"
    joining = os.environ.get("COLLIE_JOIN") == "1"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = array("f", [0.0] * a.floats)
    step = 0
    again = False
    comm = collie.connect()
    born = comm.rank
    if joining:
        print(f"joined as rank {comm.rank} of {comm.size}", flush=True)
        step = share_state(comm, step, model)
    while step < a.steps:
        if first_life and not joining and born == a.kill_rank and step == a.kill_at:
            print(f"killed at step {step} epoch={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        r = comm.rank
        grad = array("f", ((r + 1) * ((step + j) % 7 + 1) for j in range(a.floats)))
        try:
            comm.allreduce(grad)
        except collie.Error as e:
            if e.code != "peer_lost":
                raise
            print(f"step {step}: {e}", flush=True)
            comm = comm.shrink()
            comm = comm.grow(world - comm.size)
            step = share_state(comm, step, model)
            again = True
            continue
        if again and comm.rank == 0:
            print(f"step {step} again with {comm.size} ranks epoch={time.time():.3f}", flush=True)
        again = False
        for j in range(a.floats):
            model[j] += grad[j]
        step += 1
    ranks_sum = comm.size * (comm.size + 1) // 2
    for j in range(a.floats):
        want = sum(ranks_sum * ((i + j) % 7 + 1) for i in range(a.steps))
        if model[j] != want:
            print(f"WRONG element {j}: got {model[j]}, want {want}")
            return 4
    print(f"done: {a.steps} steps, model exact, rank {comm.rank} of {comm.size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
