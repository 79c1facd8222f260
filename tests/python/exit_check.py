"""A completion that arrives while the interpreter is finalizing must not
abort the process.

    collie-run -n 2 python3 exit_check.py DIR

Rank 0 starts an all-reduce with a completion callback and exits with it in
flight; an object that lives until the interpreter's teardown holds the
communicator and waits there until rank 1 has done its part. Rank 1 joins
the all-reduce only once rank 0 is finalizing (that object's teardown
writes a file in DIR). Before collie closed what is open at exit, the completion
then reached rank 0's continuation thread during finalization, Python ended
that thread with pthread_exit, and the forced unwind through collie's C++
frames aborted rank 0 ("terminate called without an active exception",
SIGABRT) after a job that had passed. Now rank 0 closes its communicator in
its exit handlers, before the interpreter finalizes, so rank 1's
all-reduce ends with rank 0 gone; that it completed instead (rank 0's
communicator still open while finalizing) fails the check. The abort itself
came about once in 25 runs of the backend's checks and is not reproduced
here; this checks that nothing of collie is left to call into Python then.
"""
import array
import os
import sys
import time

import collie

DEADLINE_S = 20


def wait_for(path):
    """Until `path` exists (the other rank's signal), or the deadline."""
    end = time.monotonic() + DEADLINE_S
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.01)


class HeldUntilTeardown:
    """Module state the interpreter clears while it finalizes (after every
    exit handler): holds the communicator, so that it outlives this, says
    that rank 0 is finalizing, and waits until rank 1 has done its
    all-reduce (or given up)."""

    def __init__(self, comm, finalizing, done):
        self.comm, self.finalizing, self.done = comm, finalizing, done
        # By then builtins and module globals may be gone: what __del__
        # calls is bound here.
        self.os, self.monotonic, self.sleep = os, time.monotonic, time.sleep

    def __del__(self):
        o = self.os
        o.close(o.open(self.finalizing, o.O_CREAT | o.O_WRONLY))
        end = self.monotonic() + DEADLINE_S
        while not o.path.exists(self.done) and self.monotonic() < end:
            self.sleep(0.01)


def main():
    # A directory of this job's own (collie-run's port is new every job).
    where = os.path.join(sys.argv[1], os.environ.get("COLLIE_MASTER_PORT", "job"))
    os.makedirs(where, exist_ok=True)
    finalizing, done = os.path.join(where, "rank0-finalizing"), os.path.join(where, "rank1-done")
    comm = collie.connect()
    buf = array.array("f", [1.0] * 1024)
    if comm.rank == 0:
        work = comm.allreduce(buf, async_op=True)
        work.on_complete(lambda err: None)
        global held
        held = HeldUntilTeardown(comm, finalizing, done)
        print("rank 0: exiting with an all-reduce in flight", flush=True)
        sys.exit(0)
    wait_for(finalizing)
    try:
        comm.allreduce(buf)
        completed = True
    except collie.Error as e:
        completed = False
        print(f"rank 1: its all-reduce ended, as it should: {str(e).splitlines()[0]}", flush=True)
    open(done, "w").close()
    comm.close()
    if completed:
        raise SystemExit("rank 1: its all-reduce completed: rank 0's communicator was still "
                         "open while its interpreter finalized")


if __name__ == "__main__":
    main()
