// comm/algorithms/choose.h: the one place collie picks a collective algorithm.
//
// A cost model in the style of NCCL's tuner: each candidate's time is
// latency x message steps + bytes on the critical path / bandwidth + bytes
// reduced / reduction throughput, with the three constants from
// config::TcpTuning (COLLIE_TCP_LATENCY_US, COLLIE_TCP_GBPS,
// COLLIE_REDUCE_GBPS). COLLIE_ALLREDUCE_ALGO=ring|rd forces a choice.
#pragma once

#include <cstddef>

#include "base/config.h"

namespace collie::algo {

enum class AllreduceAlgo { ring, recursive_doubling };
enum class BroadcastAlgo { chain, binomial_tree };

// Modelled time in microseconds.
double allreduce_cost(AllreduceAlgo a, size_t bytes, int ranks, const config::TcpTuning& t);
double broadcast_cost(BroadcastAlgo a, size_t bytes, int ranks, const config::TcpTuning& t);

AllreduceAlgo choose_allreduce(size_t bytes, int ranks, const config::TcpTuning& t);
BroadcastAlgo choose_broadcast(size_t bytes, int ranks, const config::TcpTuning& t);

}  // namespace collie::algo
