// tests/mpi_faults.cc: one rank misbehaves on the mpi backend, under mpirun;
// tests/mpi_faults.sh runs each case and checks what every rank reports and
// that the job ends within the deadline.
//
//   mpi_faults CASE [own-init]     (COLLIE_BACKEND=mpi, under mpirun)
//
// Cases (rank 1 misbehaves; the others issue a 1M-element f32 all-reduce):
//   mismatch  rank 1 all-reduces 5 elements where the others pass 4
//   p2p       rank 0 sends 8 floats; rank 1 receives 4
//   abort     rank 1 aborts its communicator instead of calling the op
//   stall     rank 1 sleeps past the deadline before calling the op
//   stop      rank 1 stops itself (SIGSTOP) before calling the op
//   kill      rank 1 is killed (SIGKILL) before calling the op
// Each rank prints "rank R: ERR <code>: <message>" for the error it gets,
// or "rank R: OK", and exits 0 (the job's own fate is the script's to judge).
// With own-init the program initialises MPI itself, as mpi4py does: collie
// must leave MPI, and MPI_COMM_WORLD's error handler, to the program, which
// finalises it and prints "rank R: the program finalised MPI".
// With MPI_FAULTS_DONE=DIR, each rank of mismatch, p2p and abort waits after
// its report until every rank has reported (a file each in DIR): a rank
// that ends without MPI_Finalize makes mpirun end the others, and a slow
// rank's report was lost that way (rank 2's, once, in CI).
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"

using namespace collie;

namespace {

// Marks this rank's report done, then waits (at most a minute) until all
// `n` ranks have: the explicit signal is each rank's file in
// MPI_FAULTS_DONE. Without that variable it returns at once.
void wait_for_every_report(int me, int n) {
  const char* dir = std::getenv("MPI_FAULTS_DONE");
  if (!dir || !*dir) return;
  namespace fs = std::filesystem;
  std::ofstream(fs::path(dir) / ("rank" + std::to_string(me))) << "done\n";
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  for (;;) {
    int seen = 0;
    for (int r = 0; r < n; ++r) seen += fs::exists(fs::path(dir) / ("rank" + std::to_string(r)));
    if (seen == n) return;
    if (std::chrono::steady_clock::now() > limit) {
      std::printf("rank %d: only %d of %d ranks reported within a minute\n", me, seen, n);
      std::fflush(stdout);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: mpi_faults mismatch|p2p|abort|stall|stop|kill [own-init]\n");
    return 2;
  }
  const std::string what = argv[1];
  const bool own_init = argc == 3 && std::string(argv[2]) == "own-init";
  if (own_init) {
    int level = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  }
  auto comm = connect();
  const int me = comm->rank();
  const int n = comm->size();
  const bool all_report = what == "mismatch" || what == "p2p" || what == "abort";
  // One good all-reduce first: every rank is in and MPI is warm.
  std::vector<float> warm(16, 1.0f);
  comm->allreduce(view_of(warm.data(), warm.size()), ReduceOp::sum).wait();
  std::vector<float> big(1 << 20, 1.0f);
  try {
    if (what == "mismatch") {
      comm->allreduce(view_of(big.data(), me == 1 ? 5 : 4), ReduceOp::sum).wait();
    } else if (what == "p2p") {
      if (me == 0) comm->send(view_of(big.data(), 8), 1).wait();
      if (me == 1) comm->recv(view_of(big.data(), 4), 0).wait();
    } else {
      if (me == 1) {
        if (what == "abort") {
          comm->abort("rank 1 gives up on purpose");
          std::printf("rank 1: aborted\n");
          std::fflush(stdout);
          wait_for_every_report(me, n);
          return 0;
        }
        if (what == "stall") std::this_thread::sleep_for(std::chrono::seconds(60));
        if (what == "stop") ::raise(SIGSTOP);
        if (what == "kill") ::raise(SIGKILL);
      }
      comm->allreduce(view_of(big.data(), big.size()), ReduceOp::sum).wait();
    }
    std::printf("rank %d: OK\n", me);
  } catch (const Error& e) {
    std::printf("rank %d: ERR %s: %s\n", me, std::string(to_string(e.code())).c_str(), e.what());
  }
  std::fflush(stdout);
  if (all_report) wait_for_every_report(me, n);
  if (own_init) {
    comm.reset();
    int finalized = 1;
    MPI_Finalized(&finalized);
    MPI_Errhandler world;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world);
    if (!finalized && world == MPI_ERRORS_ARE_FATAL && MPI_Finalize() == MPI_SUCCESS)
      std::printf("rank %d: the program finalised MPI\n", me);
    else
      std::printf("rank %d: MPI was %s by collie\n", me,
                  finalized ? "finalised" : "given another error handler");
  }
  std::fflush(stdout);
  return 0;
}
