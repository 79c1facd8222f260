// tests/trace/trace_job.cc: a job whose COLLIE_TRACE timeline
// tests/trace/check_trace.py knows in advance, run under collie-run:
//
//   trace_job collectives          a fixed sequence of every collective, a
//                                  burst issued before any wait, a send and
//                                  receive around the ring, a split, and a
//                                  mismatch that fails the communicator
//   trace_job reducer STEPS N...   a reducer over float parameters of N
//                                  elements each, STEPS steps, gradients
//                                  marked ready last to first
//   trace_job die                  four all-reduces (the last after a pause
//                                  longer than the trace's write interval),
//                                  then _exit: no destructor, no atexit
//
// Each rank checks its results against what the ranks contributed, prints
// "rank R: ok" and exits 0; anything else exits 1.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

using namespace collie;

namespace {

[[noreturn]] void fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  std::exit(1);
}

void expect(bool ok, int rank, const std::string& what) {
  if (!ok) fail(rank, what);
}

std::string error_of(const Work& w) {
  try {
    w.wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The sequence check_trace.py expects, with n >= 2 ranks.
void collectives(Communicator& c) {
  const int r = c.rank(), n = c.size();
  std::vector<float> one{static_cast<float>(r + 1)};
  c.allreduce(view_of(one.data(), 1), ReduceOp::sum).wait();
  expect(one[0] == n * (n + 1) / 2.0f, r, "allreduce of one float");

  std::vector<float> big(100000, static_cast<float>(r));
  c.allreduce(view_of(big.data(), big.size()), ReduceOp::avg).wait();
  expect(big[99999] == (n - 1) / 2.0f, r, "average of 100000 floats");

  std::vector<int64_t> mx(7, r);
  c.allreduce(view_of(mx.data(), mx.size()), ReduceOp::max).wait();
  expect(mx[6] == n - 1, r, "max of int64s");

  std::vector<double> bc(10, r == n - 1 ? 2.5 : 0.0);
  c.broadcast(view_of(bc.data(), bc.size()), n - 1).wait();
  expect(bc[9] == 2.5, r, "broadcast from the last rank");

  std::vector<int32_t> mine(5, r), all(5 * static_cast<size_t>(n));
  c.allgather(view_of(mine.data(), 5), view_of(all.data(), all.size())).wait();
  expect(all[5 * static_cast<size_t>(n - 1)] == n - 1, r, "allgather");

  std::vector<float> rs_in(4 * static_cast<size_t>(n), 1.0f), rs_out(4);
  c.reduce_scatter(view_of(rs_in.data(), rs_in.size()), view_of(rs_out.data(), 4), ReduceOp::sum)
      .wait();
  expect(rs_out[3] == static_cast<float>(n), r, "reduce_scatter");

  c.barrier().wait();

  std::vector<float> out(3, static_cast<float>(r)), in(3, -1.0f);
  Work s = c.send(view_of(out.data(), 3), (r + 1) % n, 7);
  Work v = c.recv(view_of(in.data(), 3), (r + n - 1) % n, 7);
  wait_all({s, v});
  expect(in[0] == static_cast<float>((r + n - 1) % n), r, "receive from the previous rank");

  // Issued together: the second and third queue behind the first.
  std::vector<std::vector<float>> burst(3, std::vector<float>(1000, 1.0f));
  std::vector<Work> ws;
  for (auto& b : burst) ws.push_back(c.allreduce(view_of(b.data(), b.size()), ReduceOp::sum));
  wait_all(ws);
  expect(burst[2][999] == static_cast<float>(n), r, "burst of all-reduces");

  {
    auto sub = c.split(r % 2, r);
    std::vector<float> x(2, 1.0f);
    sub->allreduce(view_of(x.data(), 2), ReduceOp::sum).wait();
    expect(x[1] == static_cast<float>(sub->size()), r, "allreduce on the split");
  }

  // Rank 1 disagrees on the count: every rank fails, and the next call is
  // refused at once.
  std::vector<float> m(5, 1.0f);
  std::string e1 = error_of(c.allreduce(view_of(m.data(), r == 1 ? 5 : 4), ReduceOp::sum));
  expect(!e1.empty(), r, "the mismatched allreduce did not fail");
  std::string e2 = error_of(c.allreduce(view_of(m.data(), 4), ReduceOp::sum));
  expect(e2.find("failed earlier") != std::string::npos, r,
         "the allreduce after the failure: '" + e2 + "'");
}

void reducer(Communicator& c, int steps, const std::vector<size_t>& sizes) {
  const int r = c.rank(), n = c.size();
  std::vector<std::vector<float>> w(sizes.size()), g(sizes.size());
  std::vector<Parameter> params;
  for (size_t i = 0; i < sizes.size(); ++i) {
    w[i].assign(sizes[i], 0.0f);
    g[i].assign(sizes[i], 0.0f);
    params.push_back({view_of(w[i].data(), sizes[i]), view_of(g[i].data(), sizes[i])});
  }
  ReducerOptions opt;
  opt.first_bucket_bytes = 2048;  // several buckets, so that some overlap backward
  opt.bucket_bytes = 4096;
  Reducer red(c, params, opt);
  for (int step = 0; step < steps; ++step) {
    red.prepare_for_backward();
    for (size_t i = sizes.size(); i-- > 0;) {
      for (float& x : g[i]) x = static_cast<float>(r + step + i);
      red.mark_grad_ready(i);
    }
    red.finalize_backward();
    for (size_t i = 0; i < sizes.size(); ++i)
      expect(g[i][0] == (n - 1) / 2.0f + static_cast<float>(step + i), r,
             "averaged gradient " + std::to_string(i) + " at step " + std::to_string(step));
  }
}

void die(Communicator& c) {
  std::vector<float> x(16, 1.0f);
  for (int i = 0; i < 3; ++i) c.allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  c.allreduce(view_of(x.data(), x.size()), ReduceOp::sum).wait();
  // Both ranks end the same way whatever the other does now.
  (void)error_of(c.barrier());
  std::printf("rank %d: ok\n", c.rank());
  std::fflush(stdout);
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto comm = connect();
  const int r = comm->rank();
  if (mode == "collectives") {
    if (comm->size() < 2) fail(r, "collectives needs 2 ranks or more");
    collectives(*comm);
  } else if (mode == "reducer" && argc > 3) {
    std::vector<size_t> sizes;
    for (int i = 3; i < argc; ++i) sizes.push_back(std::strtoul(argv[i], nullptr, 10));
    reducer(*comm, std::atoi(argv[2]), sizes);
  } else if (mode == "die") {
    die(*comm);
  } else {
    fail(r, "usage: trace_job collectives | reducer STEPS N... | die");
  }
  std::printf("rank %d: ok\n", r);
  return 0;
}
