// comm/launch/collie_run.cc: collie-run, the launcher.
//
//   collie-run -n N [--nnodes K --node-rank R --master-addr A --master-port P]
//              [--max-restarts M [--elastic [--spares K]] | --keep-going]
//              [--grace-seconds S] [--log-dir D] [--no-prefix] prog args...
//
// Starts N local ranks of a K-node job with collie's and torchrun's launch
// variables, prefixes every output line with the rank, forwards SIGINT,
// SIGTERM and SIGHUP. When one rank fails, the others get a moment to report
// their own error (collie's ranks fail within milliseconds of a peer, naming
// it), then are stopped (SIGTERM, then SIGKILL after the grace period); the
// job exits with the first failing rank's status, and a summary names that
// rank, how it ended and its last lines of output, and what became of the
// others.
//
// With --max-restarts M, a failure instead stops the whole group in the same
// way and starts every rank again, up to M times, as torchrun does: the ranks
// that had finished too, and with a fresh rendezvous (a new store socket on
// a new port, and a new secret unless the user gave one), so that nothing of
// the old round can join the new one. The ranks see the count in
// COLLIE_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT and
// TORCHELASTIC_MAX_RESTARTS), and resume from their own checkpoint.
//
// On several nodes the launchers agree through the store node 0's launcher
// serves for the whole job (as torchrun's agents do through their
// rendezvous): a launcher whose rank fails writes the round's failure key
// (the first writer is the job's root cause) and every other launcher,
// which looks for it every 200 ms, stops its own ranks; once a node's ranks
// have all ended, its launcher says so, and when every node has, all of
// them restart (or all stop: no restarts left, or one was told to stop).
// The ranks of round r put their keys under "round<r>/"
// (COLLIE_STORE_PREFIX), so nothing of an earlier round meets them.
//
// With --elastic (and --max-restarts M), a failed rank is started again
// alone by its node's launcher, up to M times in the whole job (on several
// nodes the launchers draw from one count in the store), while the others
// go on: with
// COLLIE_JOIN=1 its connect() joins the running job, whose ranks grow their
// communicator by it (Communicator::grow); every rank sees COLLIE_ELASTIC=1,
// and COLLIE_RESTART_COUNT counts the ranks started again. With --spares
// K, K more processes start with the ranks and wait in their join
// (COLLIE_SPARE=<id>): a grow takes one at once, past its start-up, and
// another starts in its place (job_spares.cc).
//
// With --keep-going, a failed rank is reported and the others go on: for
// programs whose survivors shrink the communicator and carry on
// (Communicator::shrink). The job then fails only if a rank exits with a
// non-zero status, or no rank finishes; ranks killed by a signal are named
// as lost.
//
// Node 0's launcher serves the rendezvous store itself (as torchrun's agent
// does), on a socket it binds before any rank starts (on the given port, or
// one the kernel picks): no other process can take the port between choosing
// it and using it, and the store outlives every rank, rank 0 included, so
// that survivors can still agree through it and the stall inspector can
// still report. The ranks see COLLIE_LAUNCHER_STORE=1, and rank 0 connects
// as one more client.
#include "comm/launch/args.h"
#include "comm/launch/job.h"

int main(int argc, char** argv) {
  collie::launch::Job job(collie::launch::parse_args(argc, argv));
  return job.run();
}
