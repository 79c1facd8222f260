// comm/mpi/mpi_backend.h: collie over MPI (Open MPI), for clusters launched
// with mpirun or srun, where the MPI library carries the interconnect.
//
// Every collie communicator is its own MPI communicator (a dup of
// MPI_COMM_WORLD; split is MPI_Comm_split), so collie's traffic never meets
// the program's own MPI calls. Operations run on a HostExecutor, as tcp's
// and shm's do: issued non-blocking (MPI_Iallreduce, ...) and tested by the
// thread that waits for them, or by the executor's thread, until they end,
// the deadline passes, or a peer aborts. All-reduce picks Open MPI's
// non-blocking algorithm per call (COLLIE_MPI_ALGORITHMS=0 leaves it to
// MPI). With each collective the ranks check that they all issue the same
// one (through shared memory where they share a host, else one 16-byte
// all-reduce beside it; COLLIE_MPI_CHECK=0 skips it), since MPI with
// different counts on different ranks hangs or fails.
//
// MPI is initialised here (MPI_THREAD_MULTIPLE) unless the program did it
// first, and then finalised at exit, unless an operation never finished
// (MPI cannot cancel a collective: finalising would hang; mpirun then ends
// the job when the process exits). Built only with -Dmpi (COLLIE_HAVE_MPI);
// without it the registry's line says how to get it.
#pragma once

#include "comm/backend.h"

namespace collie::mpi {

// The registry's line for this backend.
BackendEntry backend_entry();

}  // namespace collie::mpi
