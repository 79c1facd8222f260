// bench/bench_args.h: collie-bench's command line: the collectives it
// sweeps (with nccl-tests' bus-bandwidth factors), its options and their
// usage text, and the parser, which throws UsageError naming the flag.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "collie/comm.h"

namespace bench {

enum class Coll { allreduce, allgather, reduce_scatter, broadcast, sendrecv, alltoall };

const char* name(Coll c);
bool reduces(Coll c);
// nccl-tests' bus bandwidth factors.
double bus_factor(Coll c, int n);

enum class Format { text, csv, json };

struct Args {
  Coll coll = Coll::allreduce;
  Format format = Format::text;
  size_t min_bytes = 8;
  size_t max_bytes = 256ull << 20;
  size_t factor = 4;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int in_place = 0;
  int comm_memory = 0;  // buffers from Communicator::allocate
  int work = 0;         // time issue + Work::wait instead of the blocking calls
  bool cuda = false;    // --device cuda: buffers in device memory
  collie::DType dtype = collie::DType::f32;
  collie::ReduceOp op = collie::ReduceOp::sum;
  std::string algo = "auto";
  std::string backend = "auto";
  std::string plot;
  std::string tune;  // --tune FILE
  bool help = false;
};

extern const char* const kUsage;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Args parse(int argc, char** argv);

}  // namespace bench
