"""What the python checks that run named cases on every rank share
(backend_check.py, torch_api_check.py, fsdp_check.py): one ok/FAIL line
per case and rank, then "N passed, N failed" from rank 0, with the count
of failures on all ranks agreed by an all-reduce, and the exit status."""
import atexit
import os
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
    exit_cleanly(1 if int(flag) else 0)


def exit_cleanly(status):
    """Ends this rank with `status` without finalizing the interpreter:
    destroys the process groups, runs the atexit handlers (collie's, the
    temporary folders'), flushes, and leaves with os._exit.

    destroy_process_group() only forgets a group; its Gloo worker threads
    live as long as anything references it, and a test process holds many
    (groups kept in globals and as default arguments, FSDP's meshes, and
    PyTorch itself: importing torch.distributed.optim after
    init_process_group, as Lightning does to average models, binds the
    default group as a default argument of ZeRO's _broadcast_object). A
    worker that drops a Work while Python finalizes ends in std::terminate
    (see finish()): a core from issue 34's CI run of bad94d1 showed exactly
    that, after every case had passed. Chasing every reference cannot be
    made sure; not finalizing can. The exit path of an ordinary interpreter
    is still run by the checks that do not use this one (ddp_parity.py,
    the tutorial's, the launchers')."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
