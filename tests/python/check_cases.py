"""What the python checks that run named cases on every rank share
(backend_check.py, torch_api_check.py, fsdp_check.py): one ok/FAIL line
per case and rank, then "N passed, N failed" from rank 0, with the count
of failures on all ranks agreed by an all-reduce, and the exit status."""
import sys
import traceback

import torch
import torch.distributed as dist


class Failed(AssertionError):
    """A case's own check failed (its message says what)."""


def check(cond, what):
    if not cond:
        raise Failed(what)


def run(cases, names, failed_type, rank, world, group=None):
    """Runs cases[name]() for each name: its return value is the ok line's
    text; failed_type (the check's own assertion) fails it with its
    message, any other exception with its traceback. Then finish()."""
    failed = 0
    for name in names:
        try:
            verdict = f"ok   {name}: {cases[name]()}"
        except failed_type as e:
            verdict, failed = f"FAIL {name}: {e}", failed + 1
        except Exception:  # noqa: BLE001 - a crashed case fails with its traceback
            verdict, failed = f"FAIL {name}: {traceback.format_exc()}", failed + 1
        print(f"[rank {rank} of {world}] {verdict}", flush=True)
    finish(failed, len(names), rank, group)


def finish(failed, total, rank, group=None):
    """Sums the failures over the ranks (on `group`), prints the summary on
    rank 0, destroys the process groups and exits 1 if any rank failed.

    The groups go before the interpreter does: Gloo's worker thread drops
    the Work of the last all-reduce (and with it the Python tensor) after
    wait() returns, and a thread that takes the GIL while Python finalizes
    is ended by pthread_exit inside a noexcept destructor: "terminate called
    without an active exception", SIGABRT, after every case passed
    (pytorch/pytorch#190489; PyTorch's docs ask for destroy_process_group)."""
    flag = torch.tensor([failed])
    dist.all_reduce(flag, group=group)
    if rank == 0:
        print(f"{total - failed} passed, {failed} failed (torch {torch.__version__}; "
              f"{int(flag)} failures on all ranks)", flush=True)
    exit_cleanly()
    sys.exit(1 if int(flag) else 0)


def exit_cleanly():
    """Destroys every process group of this process, if there is one, so
    that no Gloo worker thread outlives the interpreter (see finish())."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
