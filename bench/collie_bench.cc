// bench/collie_bench.cc: collie-bench, an all-reduce bandwidth sweep in the
// form users know from nccl-tests' all_reduce_perf.
//
//   collie-run -n 2 collie-bench [-b 8] [-e 256M] [-f 4] [-n 20] [-w 5] [-c 1]
//                                [-d f32] [-o sum] [-i 0|1] [-a auto|ring|rd]
//
// For each size: -w warm-up ops, then -n timed ops back to back; the time of
// one op is the slowest rank's mean. algbw = size / time; busbw = algbw x
// 2(n-1)/n, the bytes each rank's link carries, comparable across rank counts.
// With -c 1 every size is checked after the timed ops against the known
// answer (rank r contributes (r + 1) + (i mod 13), exact in every dtype).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collie/comm.h"
#include "comm/core/element.h"

namespace {

struct Args {
  size_t min_bytes = 8;
  size_t max_bytes = 256ull << 20;
  size_t factor = 4;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int in_place = 0;
  collie::DType dtype = collie::DType::f32;
  collie::ReduceOp op = collie::ReduceOp::sum;
  std::string algo;
  std::string backend = "auto";
};

[[noreturn]] void usage(const char* msg) {
  if (msg) std::fprintf(stderr, "collie-bench: %s\n", msg);
  std::fprintf(stderr,
               "usage: collie-run -n N collie-bench [-b minbytes] [-e maxbytes] [-f factor]\n"
               "         [-n iters] [-w warmup] [-c check 0|1] [-d dtype] [-o op]\n"
               "         [-i in-place 0|1] [-a auto|ring|rd] [-B backend]\n"
               "sizes take K, M, G suffixes; dtypes f32 f64 f16 bf16 i32 i64 u8;\n"
               "ops sum avg min max prod\n");
  std::exit(2);
}

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v < 0) usage("bad size");
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    case '\0':
      break;
    default:
      usage("bad size suffix");
  }
  return static_cast<size_t>(v);
}

int parse_int(const char* s) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (*end != '\0' || v < 0) usage("bad number");
  return static_cast<int>(v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") usage(nullptr);
    if (i + 1 >= argc) usage(("missing value for " + f).c_str());
    const char* v = argv[++i];
    if (f == "-b")
      a.min_bytes = parse_size(v);
    else if (f == "-e")
      a.max_bytes = parse_size(v);
    else if (f == "-f")
      a.factor = parse_size(v);
    else if (f == "-n")
      a.iters = std::max(1, parse_int(v));
    else if (f == "-w")
      a.warmup = parse_int(v);
    else if (f == "-c")
      a.check = parse_int(v);
    else if (f == "-i")
      a.in_place = parse_int(v);
    else if (f == "-a")
      a.algo = v;
    else if (f == "-B")
      a.backend = v;
    else if (f == "-d") {
      auto d = collie::parse_dtype(v);
      if (!d) usage("unknown dtype");
      a.dtype = *d;
    } else if (f == "-o") {
      auto o = collie::parse_reduce_op(v);
      if (!o) usage("unknown op");
      a.op = *o;
    } else {
      usage(("unknown flag " + f).c_str());
    }
  }
  if (a.factor < 2) usage("-f must be at least 2");
  return a;
}

double contribution(int r, size_t i) {
  return (r + 1) + static_cast<double>(i % 13);
}

double expected(collie::ReduceOp op, int n, size_t i) {
  double acc = contribution(0, i);
  for (int r = 1; r < n; ++r) {
    double x = contribution(r, i);
    switch (op) {
      case collie::ReduceOp::sum:
      case collie::ReduceOp::avg:
        acc += x;
        break;
      case collie::ReduceOp::prod:
        acc *= x;
        break;
      case collie::ReduceOp::min:
        acc = std::min(acc, x);
        break;
      case collie::ReduceOp::max:
        acc = std::max(acc, x);
        break;
    }
  }
  return op == collie::ReduceOp::avg ? acc / n : acc;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (!a.algo.empty()) setenv("COLLIE_ALLREDUCE_ALGO", a.algo.c_str(), 1);
  try {
    collie::Options opt;
    opt.backend = a.backend;
    auto comm = collie::connect(opt);
    const int n = comm->size(), rank = comm->rank();
    const size_t es = collie::dtype_size(a.dtype);
    if (rank == 0) {
      std::printf("# collie-bench: allreduce, %d ranks, backend %s, %s, %s, %s\n", n,
                  comm->backend().c_str(), std::string(collie::to_string(a.dtype)).c_str(),
                  std::string(collie::to_string(a.op)).c_str(),
                  a.in_place ? "in place" : "out of place");
      std::printf("# %d warm-up and %d timed iterations per size; time = slowest rank's mean\n#\n",
                  a.warmup, a.iters);
      std::printf("# %12s %12s %6s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop",
                  "time", "algbw", "busbw", "#wrong");
      std::printf("# %12s %12s %6s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)",
                  "(GB/s)", "(GB/s)", "");
      std::fflush(stdout);
    }
    std::vector<uint8_t> in(a.max_bytes / es * es + es), out(in.size());
    double bw_sum = 0;
    int bw_count = 0;
    // The x-factor ladder from -b, plus -e itself when the ladder misses it
    // (8 x 4^k never lands on 256 MiB).
    std::vector<size_t> sizes;
    for (size_t b = std::max<size_t>(a.min_bytes, 1); b <= a.max_bytes; b *= a.factor) {
      sizes.push_back(b);
      if (b > a.max_bytes / a.factor) break;
    }
    if (sizes.empty() || sizes.back() != a.max_bytes) sizes.push_back(a.max_bytes);
    for (size_t bytes : sizes) {
      size_t count = std::max<size_t>(1, bytes / es);
      size_t nbytes = count * es;
      for (size_t i = 0; i < count; ++i)
        collie::put_element(a.dtype, in.data(), i, contribution(rank, i));
      collie::TensorView vin{in.data(), a.dtype, count, collie::Device::cpu()};
      collie::TensorView vout{a.in_place ? in.data() : out.data(), a.dtype, count,
                              collie::Device::cpu()};
      for (int w = 0; w < a.warmup; ++w) comm->allreduce(vin, vout, a.op).wait();
      comm->barrier().wait();
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < a.iters; ++it) comm->allreduce(vin, vout, a.op).wait();
      double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          a.iters;
      comm->allreduce(collie::view_of(&us, 1), collie::ReduceOp::max).wait();

      int64_t wrong = 0;
      if (a.check) {
        for (size_t i = 0; i < count; ++i)
          collie::put_element(a.dtype, in.data(), i, contribution(rank, i));
        comm->allreduce(vin, vout, a.op).wait();
        const void* res = vout.data;
        for (size_t i = 0; i < count; ++i) {
          double want = expected(a.op, n, i);
          double tol = collie::is_floating(a.dtype) && a.op == collie::ReduceOp::avg
                           ? std::abs(want) * (a.dtype == collie::DType::bf16 ? 8e-3 : 1e-3)
                           : 0;
          if (std::abs(collie::get_element(a.dtype, res, i) - want) > tol) ++wrong;
        }
        comm->allreduce(collie::view_of(&wrong, 1), collie::ReduceOp::sum).wait();
      }
      double algbw = nbytes / us / 1e3;
      double busbw = algbw * 2.0 * (n - 1) / n;
      bw_sum += busbw;
      ++bw_count;
      if (rank == 0) {
        std::printf("  %12zu %12zu %6s %6s %11.1f %8.3f %8.3f %7s\n", nbytes, count,
                    std::string(collie::to_string(a.dtype)).c_str(),
                    std::string(collie::to_string(a.op)).c_str(), us, algbw, busbw,
                    a.check ? std::to_string(wrong).c_str() : "N/A");
        std::fflush(stdout);
      }
    }
    if (rank == 0)
      std::printf("# Avg bus bandwidth    : %.3f GB/s\n", bw_sum / std::max(1, bw_count));
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "collie-bench: %s error: %s\n",
                 std::string(collie::to_string(e.code())).c_str(), e.what());
    return 1;
  }
  return 0;
}
