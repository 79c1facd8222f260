// tests/link_fault_probe.cc: all-reduces in a loop, every result checked
// exactly, one line per op with the time, while tests/launch/link_faults.sh
// shapes, cuts or restores the link between two hosts under it.
//
//   link_fault_probe [--ops N] [--seconds S] [--mib M] [--stop-rank R --stop-at I]
//                                                            (under collie-run)
//
// Each op all-reduces (sum) M MiB of f32 (default 4). Rank r's element j of
// op i is (r + 1) * ((i + j) % 1024 + 1): integers, so the sum over W ranks,
// W (W + 1) / 2 * ((i + j) % 1024 + 1), is exact in f32 and compared bit for
// bit. The run ends after N ops (default 20) or, with --seconds, at the first
// op after any rank has run S seconds: every op carries one more element,
// each rank's vote to stop (0 or 1), so that all ranks stop after the same op.
//
// Prints, per op:   op 12 ok t=3.412 took=0.041
// and at the end:   done: 40 ops, every result exact
// With --stop-rank, rank R stops itself (SIGSTOP) before op I, after it
// prints "rank R stopped before op I epoch=..." (tests/launch/stall_times.sh
// times the others' errors and the job's end from that).
// t is seconds since connect() returned; epoch= on an error line is the
// wall clock (CLOCK_REALTIME), which the script compares with the moment it
// injected the fault. COLLIE_EXPECT_BACKEND, when set, is the backend the
// communicator must run on.
//
// Exit status: 0 all ok; 2 usage, or another backend; 3 an op failed
// ("op 13 FAILED t=... epoch=... took=... code=timeout: <message>");
// 4 a result was wrong ("op 13 WRONG element j: got X, want Y").
#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collie/comm.h"

using namespace collie;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double epoch_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "link_fault_probe: %s\nusage: link_fault_probe [--ops N] [--seconds S] [--mib M] "
               "[--stop-rank R --stop-at I]\n",
               why);
  std::exit(2);
}

double number(const char* flag, const char* v, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (!*v || *end || !(x >= lo && x <= hi))
    usage((std::string(flag) + " takes a number in " + std::to_string(lo) + ".." +
           std::to_string(hi) + ", not '" + v + "'")
              .c_str());
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  long ops = 20;
  double seconds = 0, mib = 4;
  long stop_rank = -1, stop_at = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--ops")
      ops = static_cast<long>(number("--ops", v, 1, 1e9));
    else if (a == "--seconds")
      seconds = number("--seconds", v, 0.001, 1e6);
    else if (a == "--mib")
      mib = number("--mib", v, 0.001, 1024);
    else if (a == "--stop-rank")
      stop_rank = static_cast<long>(number("--stop-rank", v, 0, 1e6));
    else if (a == "--stop-at")
      stop_at = static_cast<long>(number("--stop-at", v, 0, 1e9));
    else
      usage(("unknown option " + a).c_str());
  }
  if (seconds > 0) ops = 1000000000;  // the time decides
  const size_t n = static_cast<size_t>(mib * 1024 * 1024 / sizeof(float));

  auto comm = connect();
  const int me = comm->rank(), w = comm->size();
  // The multi-host tests say which backend `auto` must have picked.
  const char* want = std::getenv("COLLIE_EXPECT_BACKEND");
  if (want && *want && comm->backend() != want) {
    std::printf("rank %d: the communicator runs on '%s', the test expects '%s'\n", me,
                comm->backend().c_str(), want);
    return 2;
  }
  const auto t0 = Clock::now();
  std::printf("rank %d of %d, backend %s, %zu floats per op\n", me, w, comm->backend().c_str(), n);
  std::fflush(stdout);
  const float ranks_sum = static_cast<float>(w) * static_cast<float>(w + 1) / 2;
  std::vector<float> buf(n + 1);
  for (long i = 0; i < ops; ++i) {
    for (size_t j = 0; j < n; ++j)
      buf[j] = static_cast<float>(me + 1) * static_cast<float>((i + j) % 1024 + 1);
    buf[n] = seconds > 0 && since(t0) >= seconds ? 1.0f : 0.0f;
    if (me == stop_rank && i == stop_at) {
      std::printf("rank %d stopped before op %ld epoch=%.3f\n", me, i, epoch_now());
      std::fflush(stdout);
      ::raise(SIGSTOP);
    }
    const auto start = Clock::now();
    try {
      comm->allreduce(view_of(buf.data(), buf.size()), ReduceOp::sum).wait();
    } catch (const Error& e) {
      std::printf("op %ld FAILED t=%.3f epoch=%.3f took=%.3f code=%s: %s\n", i, since(t0),
                  epoch_now(), since(start), std::string(to_string(e.code())).c_str(), e.what());
      std::fflush(stdout);
      return 3;
    }
    const double took = since(start);
    for (size_t j = 0; j < n; ++j) {
      const float want = ranks_sum * static_cast<float>((i + j) % 1024 + 1);
      if (std::memcmp(&buf[j], &want, sizeof want) != 0) {
        std::printf("op %ld WRONG element %zu: got %.9g, want %.9g\n", i, j, buf[j], want);
        std::fflush(stdout);
        return 4;
      }
    }
    const float votes = buf[n];
    if (!(votes >= 0 && votes <= static_cast<float>(w) &&
          votes == static_cast<float>(int(votes)))) {
      std::printf("op %ld WRONG element %zu (the stop votes): got %.9g, want 0..%d\n", i, n, votes,
                  w);
      std::fflush(stdout);
      return 4;
    }
    std::printf("op %ld ok t=%.3f took=%.3f\n", i, since(t0), took);
    std::fflush(stdout);
    if (votes > 0) {
      ops = i + 1;
      break;
    }
  }
  std::printf("done: %ld ops, every result exact\n", ops);
  return 0;
}
