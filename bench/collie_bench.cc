// bench/collie_bench.cc: collie-bench, a bandwidth sweep of one collective
// in the form users know from nccl-tests (all_reduce_perf, ...).
//
//   collie-run -n 2 collie-bench [-C allreduce] [-b 8] [-e 256M] [-f 4] [-n 20]
//                                [-w 5] [-c 1] [-d f32] [-o sum] [-i 0|1]
//                                [-a auto|ring|rd] [-B backend] [--plot out.png]
//                                [--csv | --json]
//
// For each size: -w warm-up ops, then -n timed samples, each a barrier and a
// batch of back-to-back ops (10 up to 64 KiB, else 1); a sample's time is the
// slowest rank's, and the table shows the median sample and the best
// (bench/schedule.h, shared with the peers in bench/peers/). Sizes and bus
// bandwidth as nccl-tests
// define them: size is the all-reduce's buffer, the all-gather's output, the
// reduce-scatter's input, the broadcast's buffer, the bytes each rank sends
// in sendrecv (to rank + 1, from rank - 1); algbw = size / time; busbw =
// algbw x 2(n-1)/n (all-reduce), x (n-1)/n (all-gather, reduce-scatter),
// x 1 (broadcast, sendrecv): what each rank's link carries, comparable across
// rank counts. cpu is the process's CPU time (every thread) per op over the
// samples (barriers included), the largest of any rank, and cpu% that over
// the wall time: what a rank costs its core while it communicates or waits. With -c 1 every size
// is checked after the timed ops against the known answer (rank r
// contributes (r + 1) + (i mod 13), exact in every dtype). --plot draws
// busbw and time against size with gnuplot; --csv and --json print the
// table in those forms instead.
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/cuda_api.h"
#include "base/element.h"
#include "base/reduce.h"
#include "base/topology.h"
#include "bench/bench_args.h"
#include "bench/bench_tune.h"
#include "collie/comm.h"
#include "schedule.h"

namespace {

using namespace bench;

// Whether this process is the job's rank 0, from the launcher's variables,
// before connecting: usage and errors about the command line are printed by
// rank 0 alone, not once per rank.
bool leads() {
  try {
    return collie::config::resolve_launch(collie::Options{}, collie::config::process_env()).rank ==
           0;
  } catch (const collie::Error&) {
    return true;  // the launch variables are wrong: connect() will say how
  }
}

struct Row {
  size_t bytes, count;
  double us, best, algbw, busbw, cpu, cpu_pct;
  int64_t wrong;  // -1: not checked
};

// Draws busbw and time against size into `path` (PNG) with gnuplot: two
// panels, log-scaled sizes. Returns an empty string or what went wrong.
std::string plot(const std::string& path, const std::vector<Row>& rows, const std::string& title) {
  std::string script = "set terminal pngcairo size 1000,800 font ',10'\n";
  script += "set output '" + path + "'\n";
  script += "set multiplot layout 2,1 title '" + title + "'\n";
  script += "set logscale x 2\nset grid\nset key off\nset xlabel 'size (bytes)'\n";
  script += "set format x '%.0b%BB'\n";  // 1024-based: 64KiB, 1MiB
  auto data = [&](bool busbw) {
    std::string d;
    for (const Row& r : rows)
      d += std::to_string(r.bytes) + " " + std::to_string(busbw ? r.busbw : r.us) + "\n";
    return d + "e\n";
  };
  script +=
      "set ylabel 'busbw (GB/s)'\nplot '-' using 1:2 with linespoints lw 2 pt 7\n" + data(true);
  script +=
      "set logscale y 10\nset ylabel 'time (us)'\n"
      "plot '-' using 1:2 with linespoints lw 2 pt 7\n" +
      data(false);
  script += "unset multiplot\n";
  FILE* g = popen("gnuplot 2>&1", "w");
  if (!g) return "cannot start gnuplot";
  std::fwrite(script.data(), 1, script.size(), g);
  int status = pclose(g);
  if (status != 0)
    return "gnuplot failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  return "";
}

bool have_gnuplot() {
  return std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

double contribution(int r, size_t i) {
  return (r + 1) + static_cast<double>(i % 13);
}

// One reduction of the ranks' contributions at element i, in A.
template <typename A>
A fold(collie::ReduceOp op, int n, size_t i) {
  A acc = static_cast<A>(contribution(0, i));
  for (int r = 1; r < n; ++r) {
    const A x = static_cast<A>(contribution(r, i));
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
  return acc;
}

// The known answer at element i as dtype t holds it: floats in double;
// integers in uint64_t, whose sums and products wrap as every narrower
// integer's do (a u8 or i8 product of 3 ranks already wraps), narrowed.
double expected(collie::DType t, collie::ReduceOp op, int n, size_t i) {
  if (collie::is_floating(t)) {
    const double acc = fold<double>(op, n, i);
    return op == collie::ReduceOp::avg ? acc / n : acc;
  }
  const uint64_t x = fold<uint64_t>(op, n, i);
  switch (t) {
    case collie::DType::i32:
      return static_cast<int32_t>(x);
    case collie::DType::u8:
      return static_cast<uint8_t>(x);
    case collie::DType::i8:
      return static_cast<int8_t>(x);
    default:
      return static_cast<double>(static_cast<int64_t>(x));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool lead = leads();
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const UsageError& e) {
    if (lead) std::fprintf(stderr, "collie-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  if (a.help) {
    if (lead) std::fputs(kUsage, stdout);
    return 0;
  }
  setenv("COLLIE_ALLREDUCE_ALGO", a.algo.c_str(), 1);  // the library reads -a here
  if (!a.tune.empty()) return tune(a.tune);
  try {
    collie::Options opt;
    opt.backend = a.backend;
    auto comm = collie::connect(opt);
    // The bookkeeping (header, timings, checks) moves host memory: a backend
    // that moves device memory only (nccl) gets a host communicator beside it.
    std::unique_ptr<collie::Communicator> host_comm;
    if (a.backend == "nccl") {
      collie::Options host;
      host.backend = "auto";
      host_comm = collie::connect(host);
    }
    collie::Communicator* ctl = host_comm ? host_comm.get() : comm.get();
    const int n = comm->size(), rank = comm->rank();
    const size_t es = collie::dtype_size(a.dtype);
    // Rank 0 draws the plot: it checks for gnuplot now, not after the sweep,
    // and every rank learns the answer, so that all stop together.
    if (!a.plot.empty()) {
      int32_t ok = rank == 0 ? have_gnuplot() : 1;
      ctl->broadcast(collie::view_of(&ok, 1), 0).wait();
      if (!ok) {
        if (rank == 0)
          std::fprintf(stderr,
                       "collie-bench: --plot needs gnuplot, which is not installed here "
                       "(apt-get install gnuplot-nox)\n");
        return 2;
      }
    }
    if (a.coll == Coll::sendrecv && n < 2) {
      if (rank == 0) std::fprintf(stderr, "collie-bench: -C sendrecv needs at least 2 ranks\n");
      return 2;
    }
    const std::string dtype = std::string(collie::to_string(a.dtype));
    const std::string redop = reduces(a.coll) ? std::string(collie::to_string(a.op)) : "none";
    std::vector<Row> rows;
    // Every rank's CPUs (COLLIE_BIND), for the header.
    char mine[64] = {0};
    std::snprintf(mine, sizeof mine, "%s", collie::topology::binding().c_str());
    std::vector<char> cpus(sizeof mine * n);
    ctl->allgather(collie::view_of(reinterpret_cast<uint8_t*>(mine), sizeof mine),
                   collie::view_of(reinterpret_cast<uint8_t*>(cpus.data()), cpus.size()))
        .wait();
    std::string bindings;
    for (int r = 0; r < n; ++r)
      bindings += (r ? ", " : "") + std::to_string(r) + ": " + std::string(&cpus[r * sizeof mine]);
    if (rank == 0 && a.format == Format::text) {
      std::printf("# host: %s; COLLIE_BIND=%s; CPUs per rank: %s\n",
                  collie::topology::describe_host().c_str(),
                  collie::config::bind(collie::config::process_env()).c_str(), bindings.c_str());
      std::printf(
          "# collie-bench: %s, %d ranks, backend %s%s, %s, %s, %s, %s\n", name(a.coll), n,
          comm->backend().c_str(), a.cuda ? ", CUDA buffers" : "", dtype.c_str(), redop.c_str(),
          a.in_place ? (a.comm_memory ? "in place, communicator memory" : "in place")
                     : (a.comm_memory ? "out of place, communicator memory" : "out of place"),
          a.work || a.coll == Coll::sendrecv ? "issued, then waited for" : "blocking calls");
      std::printf(
          "# %d warm-up ops, then %d samples per size (a barrier and 10 back-to-back ops up to "
          "64 KiB, else 1); time = median sample of the slowest rank, best = fastest sample; "
          "cpu = the busiest rank's CPU time per op (all its threads)\n#\n",
          a.warmup, a.iters);
      std::printf("# %12s %12s %6s %6s %11s %11s %8s %8s %9s %5s %7s\n", "size", "count", "type",
                  "redop", "time", "best", "algbw", "busbw", "cpu", "cpu%", "#wrong");
      std::printf("# %12s %12s %6s %6s %11s %11s %8s %8s %9s %5s %7s\n", "(B)", "(elements)", "",
                  "", "(us)", "(us)", "(GB/s)", "(GB/s)", "(us)", "", "");
      std::fflush(stdout);
    } else if (rank == 0 && a.format == Format::csv) {
      std::printf(
          "collective,backend,ranks,size_bytes,count,dtype,redop,in_place,time_us,best_us,"
          "algbw_gbps,busbw_gbps,cpu_us,cpu_pct,wrong\n");
    }
    // Room for the largest size, and for n elements at the smallest.
    const size_t room = std::max(a.max_bytes / es, static_cast<size_t>(n)) * es + es;
    std::vector<uint8_t> in_vec, out_vec;
    std::shared_ptr<void> in_mem, out_mem;
    uint8_t *in, *out;
    // --device cuda: the buffers on the device; in_vec and out_vec mirror
    // them on the host, for filling and checking (outside the timing).
    collie::Device device = collie::Device::cpu();
    std::shared_ptr<collie::cuda::Api> gpu;
    if (a.cuda) {
      gpu = collie::cuda::device_api();
      if (!gpu)
        throw collie::Error(collie::ErrorCode::unavailable,
                            "--device cuda: this build of collie has no CUDA");
      std::string why;
      const int devices = gpu->device_count(&why);
      if (devices <= 0)
        throw collie::Error(collie::ErrorCode::unavailable,
                            "--device cuda: no GPU can be used: " + why);
      device = collie::Device::cuda(rank % devices);
      gpu->set_device(device.index);
      collie::cuda::Api* g = gpu.get();
      in_mem = std::shared_ptr<void>(g->device_alloc(room), [g](void* p) { g->device_free(p); });
      out_mem = std::shared_ptr<void>(g->device_alloc(room), [g](void* p) { g->device_free(p); });
      in = static_cast<uint8_t*>(in_mem.get());
      out = static_cast<uint8_t*>(out_mem.get());
      in_vec.resize(room);
      out_vec.resize(room);
    } else if (a.comm_memory) {
      in_mem = comm->allocate(room);
      out_mem = comm->allocate(room);
      in = static_cast<uint8_t*>(in_mem.get());
      out = static_cast<uint8_t*>(out_mem.get());
    } else {
      in_vec.resize(room);
      out_vec.resize(room);
      in = in_vec.data();
      out = out_vec.data();
    }
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    double bw_sum = 0;
    int bw_count = 0;
    // The x-factor ladder from -b, plus -e itself when the ladder misses it
    // (8 x 4^k never lands on 256 MiB).
    const std::vector<size_t> sizes = bench::Sweep{a.min_bytes, a.max_bytes, a.factor}.sizes();
    auto cpu_us_now = [] {
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec +
             u.ru_stime.tv_usec;
    };
    for (size_t bytes : sizes) {
      // count: the elements of the size; block: each rank's share where the
      // collective splits the size among the ranks.
      const bool split =
          a.coll == Coll::allgather || a.coll == Coll::reduce_scatter || a.coll == Coll::alltoall;
      const size_t block = split ? std::max<size_t>(1, bytes / es / n) : 0;
      const size_t count = split ? block * n : std::max<size_t>(1, bytes / es);
      const size_t nbytes = count * es;
      auto view = [&](uint8_t* v, size_t first, size_t len) {
        return collie::TensorView{v + first * es, a.dtype, len, device};
      };
      // The host mirror of a view's memory (the view itself on the CPU).
      auto host_of = [&](const collie::TensorView& t) -> uint8_t* {
        auto* p = static_cast<uint8_t*>(t.data);
        if (!a.cuda) return p;
        return p >= out && p < out + room ? out_vec.data() + (p - out) : in_vec.data() + (p - in);
      };
      auto to_device = [&](const collie::TensorView& t) {
        if (!a.cuda) return;
        gpu->copy_async(t.data, host_of(t), t.nbytes(), nullptr);
        gpu->synchronize(nullptr);
      };
      auto to_host = [&](const collie::TensorView& t) {
        if (!a.cuda) return;
        gpu->copy_async(host_of(t), t.data, t.nbytes(), nullptr);
        gpu->synchronize(nullptr);
      };
      // Where this rank's input is and where its result lands, in place
      // (nccl-tests' layout: the all-gather's input is this rank's block of
      // the output, the reduce-scatter's output this rank's block of the
      // input) or not.
      const collie::TensorView source = a.coll != Coll::allgather ? view(in, 0, count)
                                        : a.in_place              ? view(out, rank * block, block)
                                                                  : view(in, 0, block);
      collie::TensorView result = view(out, 0, count);
      if (a.coll == Coll::broadcast || (a.coll == Coll::allreduce && a.in_place))
        result = view(in, 0, count);
      if (a.coll == Coll::reduce_scatter)
        result = a.in_place ? view(in, rank * block, block) : view(out, 0, block);
      // The inputs: each rank's contribution(rank, i) at element i.
      auto fill = [&] {
        for (size_t i = 0; i < source.numel; ++i)
          collie::put_element(a.dtype, host_of(source), i, contribution(rank, i));
        to_device(source);
      };
      auto run_once = [&]() -> collie::Work {
        switch (a.coll) {
          case Coll::allreduce:
            return comm->allreduce(source, result, a.op);
          case Coll::allgather:
            return comm->allgather(source, result);
          case Coll::reduce_scatter:
            return comm->reduce_scatter(source, result, a.op);
          case Coll::broadcast:
            return comm->broadcast(source, 0);
          case Coll::alltoall:
            return comm->alltoall(source, result);
          case Coll::sendrecv: {
            collie::Work s = comm->send(source, next);
            collie::Work r = comm->recv(result, prev);
            s.wait();
            return r;
          }
        }
        return collie::Work();
      };
      // The blocking forms (sends and receives have none).
      auto run_blocking = [&] {
        switch (a.coll) {
          case Coll::allreduce:
            return comm->allreduce(source, result, a.op, collie::blocking);
          case Coll::allgather:
            return comm->allgather(source, result, collie::blocking);
          case Coll::reduce_scatter:
            return comm->reduce_scatter(source, result, a.op, collie::blocking);
          case Coll::broadcast:
            return comm->broadcast(source, 0, collie::blocking);
          case Coll::alltoall:
            return comm->alltoall(source, result, collie::blocking);
          case Coll::sendrecv:
            return run_once().wait();
        }
      };
      auto timed_op = [&] { a.work ? run_once().wait() : run_blocking(); };
      fill();
      for (int w = 0; w < a.warmup; ++w) timed_op();
      const int batch = bench::batch_for(nbytes);
      const double cpu0 = cpu_us_now();
      bench::Timing tm = bench::time_size(
          a.iters, batch, [&] { comm->barrier().wait(); }, timed_op,
          [&](std::vector<double>& t) {
            ctl->allreduce(collie::view_of(t.data(), t.size()), collie::ReduceOp::max).wait();
          });
      const double cpu_total = cpu_us_now() - cpu0;
      double stats[2] = {cpu_total / (static_cast<double>(a.iters) * batch),
                         100.0 * cpu_total / std::max(tm.wall_us, 1e-9)};
      ctl->allreduce(collie::view_of(stats, 2), collie::ReduceOp::max).wait();
      const double us = tm.median_us, cpu = stats[0], cpu_pct = stats[1];

      int64_t wrong = 0;
      if (a.check) {
        fill();
        timed_op();
        to_host(result);
        // What this rank must hold at element i of its result.
        auto want_at = [&](size_t i) -> double {
          switch (a.coll) {
            case Coll::allreduce:
              return expected(a.dtype, a.op, n, i);
            case Coll::allgather:
              return contribution(static_cast<int>(i / block), i % block);
            case Coll::reduce_scatter:
              return expected(a.dtype, a.op, n, rank * block + i);
            case Coll::broadcast:
              return contribution(0, i);
            case Coll::sendrecv:
              return contribution(prev, i);
            case Coll::alltoall:  // block q from rank q: its block `rank`
              return contribution(static_cast<int>(i / block), rank * block + i % block);
          }
          return 0;
        };
        for (size_t i = 0; i < result.numel; ++i) {
          double want = want_at(i);
          double tol =
              reduces(a.coll) && collie::is_floating(a.dtype) && a.op == collie::ReduceOp::avg
                  ? std::abs(want) * (a.dtype == collie::DType::bf16 ? 8e-3 : 1e-3)
                  : 0;
          if (std::abs(collie::get_element(a.dtype, host_of(result), i) - want) > tol) ++wrong;
        }
        ctl->allreduce(collie::view_of(&wrong, 1), collie::ReduceOp::sum).wait();
      }
      double algbw = nbytes / us / 1e3;
      double busbw = algbw * bus_factor(a.coll, n);
      bw_sum += busbw;
      ++bw_count;
      rows.push_back(
          {nbytes, count, us, tm.best_us, algbw, busbw, cpu, cpu_pct, a.check ? wrong : -1});
      if (rank == 0 && a.format == Format::text) {
        std::printf("  %12zu %12zu %6s %6s %11.2f %11.2f %8.3f %8.3f %9.1f %5.0f %7s\n", nbytes,
                    count, dtype.c_str(), redop.c_str(), us, tm.best_us, algbw, busbw, cpu, cpu_pct,
                    a.check ? std::to_string(wrong).c_str() : "N/A");
        std::fflush(stdout);
      } else if (rank == 0 && a.format == Format::csv) {
        std::printf("%s,%s,%d,%zu,%zu,%s,%s,%d,%.3f,%.3f,%.4f,%.4f,%.3f,%.1f,%s\n", name(a.coll),
                    comm->backend().c_str(), n, nbytes, count, dtype.c_str(), redop.c_str(),
                    a.in_place, us, tm.best_us, algbw, busbw, cpu, cpu_pct,
                    a.check ? std::to_string(wrong).c_str() : "");
        std::fflush(stdout);
      }
    }
    if (rank == 0 && a.format == Format::text)
      std::printf("# Avg bus bandwidth    : %.3f GB/s\n", bw_sum / std::max(1, bw_count));
    if (rank == 0 && a.format == Format::json) {
      std::printf(
          "{\"collective\": \"%s\", \"backend\": \"%s\", \"ranks\": %d, \"dtype\": \"%s\", "
          "\"redop\": \"%s\", \"in_place\": %s, \"warmup\": %d, \"samples\": %d, \"rows\": [",
          name(a.coll), comm->backend().c_str(), n, dtype.c_str(), redop.c_str(),
          a.in_place ? "true" : "false", a.warmup, a.iters);
      for (size_t k = 0; k < rows.size(); ++k) {
        const Row& r = rows[k];
        std::printf(
            "%s\n  {\"size_bytes\": %zu, \"count\": %zu, \"time_us\": %.3f, \"best_us\": %.3f, "
            "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"cpu_us\": %.3f, \"cpu_pct\": %.1f, "
            "\"wrong\": %s}",
            k ? "," : "", r.bytes, r.count, r.us, r.best, r.algbw, r.busbw, r.cpu, r.cpu_pct,
            r.wrong < 0 ? "null" : std::to_string(r.wrong).c_str());
      }
      std::printf("\n]}\n");
    }
    if (rank == 0 && !a.plot.empty()) {
      std::string title = "collie-bench: " + std::string(name(a.coll)) + ", " + std::to_string(n) +
                          " ranks, " + comm->backend() + ", " + dtype +
                          (reduces(a.coll) ? " " + redop : "");
      if (std::string err = plot(a.plot, rows, title); !err.empty()) {
        std::fprintf(stderr, "collie-bench: --plot %s: %s\n", a.plot.c_str(), err.c_str());
        return 1;
      }
      if (a.format == Format::text) std::printf("# plot: %s\n", a.plot.c_str());
    }
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "collie-bench: %s error: %s\n",
                 std::string(collie::to_string(e.code())).c_str(), e.what());
    return 1;
  }
  return 0;
}
