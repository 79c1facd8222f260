// tests/survivor_probe.cc: a rank dies and the survivors carry on, in
// separate processes under a real launcher (collie-run --keep-going), where
// collie-run serves the store: rank 0 may be the one that dies.
//
//   survivor_probe --kill R          (under collie-run --keep-going -n W)
//
// Every rank all-reduces (rank + 1); rank R then kills itself (SIGKILL).
// The others' next all-reduce must fail with peer_lost naming rank R (or
// their first, if R finished it before they did and died at once); they
// shrink (finding by themselves who is gone, without waiting for it),
// all-gather their old ranks on the new communicator (every rank but R, in
// order) and all-reduce
// (old rank + 1) as f64: W (W + 1) / 2 - (R + 1), exactly.
//
// Prints, per survivor:  survivor: old rank 2 is rank 1 of 3, ranks 0 2 3, sum 9 (want 9)
// Exit status: 0 all as expected; 2 usage; 3 an operation failed otherwise
// than expected; 4 a wrong result.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collie/comm.h"

using namespace collie;

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "--kill") != 0) {
    std::fprintf(stderr, "usage: survivor_probe --kill RANK\n");
    return 2;
  }
  const int victim = std::atoi(argv[2]);
  std::unique_ptr<Communicator> c;
  try {
    c = connect();
    const int rank = c->rank(), world = c->size();
    // The victim dies once its first all-reduce is done, which may be
    // before a survivor's is: that survivor hears of the death in its first
    // all-reduce (every rank watches every connection), the others in their
    // second. Either is the expected failure; anything else is not.
    auto lost_the_victim = [&](const Error& e) {
      const std::string m = e.what();
      if (e.code() == ErrorCode::peer_lost &&
          m.find("rank " + std::to_string(victim)) != std::string::npos)
        return true;
      std::printf("FAILED: expected peer_lost naming rank %d, got %s: %s\n", victim,
                  std::string(to_string(e.code())).c_str(), m.c_str());
      return false;
    };
    double x = rank + 1;
    bool heard = false;
    try {
      c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
      if (x != world * (world + 1) / 2.0) {
        std::printf("first all-reduce WRONG: %g\n", x);
        return 4;
      }
    } catch (const Error& e) {
      if (rank == victim || !lost_the_victim(e)) return 3;
      heard = true;
    }
    std::fflush(stdout);
    if (rank == victim) raise(SIGKILL);
    if (!heard) {
      try {
        x = 1;
        c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
        std::printf("FAILED: the all-reduce ended without rank %d\n", victim);
        return 3;
      } catch (const Error& e) {
        if (!lost_the_victim(e)) return 3;
      }
    }
    // Told nothing, and willing to wait 10 minutes, far past the test's
    // limit: each survivor leaves out the rank it saw die at once, or
    // takes the decision of one that did.
    auto s = c->shrink({}, std::chrono::minutes(10));
    std::vector<int32_t> mine{rank}, all(s->size());
    s->allgather(view_of(mine.data(), 1), view_of(all.data(), all.size())).wait();
    std::vector<int32_t> want_ranks;
    for (int r = 0; r < world; ++r)
      if (r != victim) want_ranks.push_back(r);
    double sum = rank + 1;
    s->allreduce(view_of(&sum, 1), ReduceOp::sum).wait();
    const double want = world * (world + 1) / 2.0 - (victim + 1);
    std::string ranks;
    for (int32_t r : all) ranks += " " + std::to_string(r);
    std::printf("survivor: old rank %d is rank %d of %d, ranks%s, sum %g (want %g)\n", rank,
                s->rank(), s->size(), ranks.c_str(), sum, want);
    if (all != want_ranks || sum != want) return 4;
  } catch (const Error& e) {
    std::printf("FAILED: %s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    return 3;
  }
  return 0;
}
