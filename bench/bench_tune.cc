// bench/bench_tune.cc: collie-bench --tune.
#include "bench/bench_tune.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/reduce.h"
#include "base/topology.h"
#include "collie/comm.h"

namespace bench {

// --tune: what the TCP cost model (comm/algorithms/choose.cc) assumes,
// measured here, between ranks 0 and 1 of a tcp communicator (the others
// wait), each figure the median of several tries:
//  * COLLIE_TCP_LATENCY_US: half the round trip of an 8 B send and receive;
//  * COLLIE_TCP_GBPS: bytes per second each way while both ranks send 64 MiB
//    to each other at once (as a ring step does);
//  * COLLIE_REDUCE_GBPS: the f32 sum kernel over 64 MiB, bytes of output
//    per second.
int tune(const std::string& path) {
  using Clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  try {
    collie::Options opt;
    opt.backend = "tcp";
    auto comm = collie::connect(opt);
    const int n = comm->size(), rank = comm->rank();
    if (n < 2) {
      std::fprintf(stderr, "collie-bench: --tune needs 2 ranks or more (collie-run -n 2)\n");
      return 2;
    }
    const int peer = rank == 0 ? 1 : 0;
    const bool pair = rank < 2;
    double lat = 0, gbps = 0;
    std::vector<float> small(2), big((64u << 20) / 4, 1.0f), got(big.size());
    std::vector<double> tries;
    for (int t = 0; t < 7 && pair; ++t) {
      const int rounds = 200;
      auto t0 = Clock::now();
      for (int i = 0; i < rounds; ++i) {
        if (rank == 0) {
          comm->send(collie::view_of(small.data(), 2), peer).wait();
          comm->recv(collie::view_of(small.data(), 2), peer).wait();
        } else {
          comm->recv(collie::view_of(small.data(), 2), peer).wait();
          comm->send(collie::view_of(small.data(), 2), peer).wait();
        }
      }
      tries.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                      rounds / 2);
    }
    if (pair) lat = median(tries);
    tries.clear();
    for (int t = 0; t < 5 && pair; ++t) {
      auto t0 = Clock::now();
      collie::Work s = comm->send(collie::view_of(big.data(), big.size()), peer);
      comm->recv(collie::view_of(got.data(), got.size()), peer).wait();
      s.wait();
      tries.push_back(big.size() * 4.0 /
                      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 1e3);
    }
    if (pair) gbps = median(tries);
    tries.clear();
    for (int t = 0; t < 5; ++t) {
      auto t0 = Clock::now();
      collie::kernels::reduce(collie::DType::f32, collie::ReduceOp::sum, got.data(), got.data(),
                              big.data(), big.size());
      tries.push_back(big.size() * 4.0 /
                      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 1e3);
    }
    double reduce_gbps = median(tries);
    comm->barrier().wait();
    if (rank != 0) return 0;
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "collie-bench: --tune %s: cannot write it: %s\n", path.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "# collie tuning profile (collie-bench --tune): %d ranks, tcp between ranks 0 "
                 "and 1; host: %s\n"
                 "# read by collie when COLLIE_TUNING_FILE names this file; the environment "
                 "overrides it\n"
                 "COLLIE_TCP_LATENCY_US=%.2f\nCOLLIE_TCP_GBPS=%.3f\nCOLLIE_REDUCE_GBPS=%.3f\n",
                 n, collie::topology::describe_host().c_str(), lat, gbps, reduce_gbps);
    std::fclose(f);
    std::printf(
        "# collie-bench --tune: tcp latency %.2f us per message, %.3f GB/s each way, f32 sum "
        "%.3f GB/s; written to %s (use it with COLLIE_TUNING_FILE=%s)\n",
        lat, gbps, reduce_gbps, path.c_str(), path.c_str());
    return 0;
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "collie-bench: %s error: %s\n",
                 std::string(collie::to_string(e.code())).c_str(), e.what());
    return 1;
  }
}

}  // namespace bench
