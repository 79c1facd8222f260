// bench/peers/gloo_allreduce.cc: Gloo's all-reduce (gloo::allreduce, its
// ring, over its TCP transport) with collie-bench's schedule and statistic
// (bench/schedule.h), so that bench/compare.sh puts it beside collie and
// Open MPI: per size, 5 warm-up operations, then -n samples of a barrier
// and a batch of back-to-back operations; the median sample of the slowest
// rank; f32 sum, out of place; rank r contributes (r + 1) + (i mod 1021) and
// every result is checked against the known answer.
//   collie-run -n 2 gloo_allreduce [-b 8] [-e 256M] [-f 4] [-n 20] [-C alltoall]
// -C alltoall: gloo::alltoall instead, the size each rank's whole send
// buffer (as collie-bench -C alltoall counts it); element i of the block
// rank r sends rank j is r * 1e6 + j * 1e3 + (i mod 997), checked.
// Launched by collie-run (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the
// ranks meet through a gloo FileStore in a directory named after the
// launcher's process and port (or GLOO_PEER_DIR: several hosts' ranks on
// one file system, bench/hosts_compare.sh), which rank 0 removes at the
// end. Each rank listens on the address its host reaches MASTER_ADDR from.
#include <arpa/inet.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../schedule.h"

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    std::fprintf(stderr, "gloo_allreduce: %s is not set: launch it with collie-run\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <class T>
void allreduce(const std::shared_ptr<gloo::Context>& ctx, const T* in, T* out, size_t count,
               ReduceFn fn) {
  gloo::AllreduceOptions o(ctx);
  o.setInput(const_cast<T*>(in), count);
  o.setOutput(out, count);
  o.setReduceFunction(fn);
  gloo::allreduce(o);
}

// This host's address on the way to `master` (a UDP socket's connect sends
// nothing: it only picks the route): 127.0.0.1 on one host, the veth's
// address between network namespaces.
std::string address_towards(const char* master) {
  if (!master || !*master) return "127.0.0.1";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  if (inet_pton(AF_INET, master, &to.sin_addr) != 1) return "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  char text[INET_ADDRSTRLEN] = "127.0.0.1";
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0)
    inet_ntop(AF_INET, &me.sin_addr, text, sizeof text);
  if (fd >= 0) close(fd);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = env_int("RANK"), n = env_int("WORLD_SIZE"), port = env_int("MASTER_PORT");
  const bench::Sweep sweep = bench::Sweep::parse(argc, argv);
  const int samples = sweep.samples, warmup = 5;
  bool alltoall = false;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "-C") alltoall = std::string(argv[i + 1]) == "alltoall";
  const char* shared_dir = std::getenv("GLOO_PEER_DIR");
  const std::string dir =
      shared_dir && *shared_dir
          ? std::string(shared_dir)
          : (std::filesystem::temp_directory_path() /
             ("collie-gloo-peer-" + std::to_string(getppid()) + "-" + std::to_string(port)))
                .string();
  mkdir(dir.c_str(), 0700);  // every rank; the first one wins
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  {
    gloo::transport::tcp::attr attr;
    attr.hostname = address_towards(std::getenv("MASTER_ADDR"));
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    ctx->setTimeout(std::chrono::seconds(300));
    ctx->connectFullMesh(store, dev);
  }
  std::vector<float> in(sweep.max_bytes / 4 + static_cast<size_t>(n)), out(in.size());
  if (rank == 0) {
    std::printf("# gloo_allreduce: %d ranks, %s, f32, out of place\n", n,
                alltoall ? "gloo::alltoall (tcp)" : "gloo::allreduce (ring, tcp), sum");
    std::printf(
        "# %d warm-up ops, then %d samples per size (a barrier and 10 back-to-back ops up to "
        "64 KiB, else 1); time = median sample of the slowest rank, best = fastest sample\n",
        warmup, samples);
    std::printf(
        "#         size        count   type  redop        time        best    algbw    busbw  "
        "#wrong\n");
  }
  auto barrier = [&] {
    gloo::BarrierOptions o(ctx);
    gloo::barrier(o);
  };
  auto routed = [](int src, int dst, size_t i) {
    return static_cast<float>(src * 1e6 + dst * 1e3 + static_cast<double>(i % 997));
  };
  for (size_t bytes : sweep.sizes()) {
    const size_t block = std::max<size_t>(1, bytes / 4 / static_cast<size_t>(n));
    const size_t count = alltoall ? block * static_cast<size_t>(n) : std::max<size_t>(1, bytes / 4);
    for (size_t i = 0; i < count; ++i)
      in[i] = alltoall ? routed(rank, static_cast<int>(i / block), i % block)
                       : static_cast<float>((rank + 1) + (i % 1021));
    auto op = [&] {
      if (alltoall) {
        gloo::AlltoallOptions o(ctx);
        o.setInput(in.data(), count);
        o.setOutput(out.data(), count);
        gloo::alltoall(o);
        return;
      }
      allreduce(ctx, in.data(), out.data(), count, static_cast<ReduceFn>(&gloo::sum<float>));
    };
    for (int w = 0; w < warmup; ++w) op();
    bench::Timing tm = bench::time_size(samples, bench::batch_for(count * 4), barrier, op,
                                        [&](std::vector<double>& t) {
                                          std::vector<double> mine = t;
                                          allreduce(ctx, mine.data(), t.data(), t.size(),
                                                    static_cast<ReduceFn>(&gloo::max<double>));
                                        });
    double wrong = 0, all_wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += out[i] != (alltoall ? routed(static_cast<int>(i / block), rank, i % block)
                                   : static_cast<float>(n * (n + 1) / 2 + n * (i % 1021)));
    allreduce(ctx, &wrong, &all_wrong, 1, static_cast<ReduceFn>(&gloo::sum<double>));
    double algbw = count * 4.0 / tm.median_us / 1e3;
    double busbw = algbw * (alltoall ? 1.0 : 2.0) * (n - 1) / n;
    if (rank == 0)
      std::printf("  %12zu %12zu %6s %6s %11.2f %11.2f %8.3f %8.3f %7.0f\n", count * 4, count,
                  "f32", alltoall ? "none" : "sum", tm.median_us, tm.best_us, algbw, busbw,
                  all_wrong);
    std::fflush(stdout);
  }
  barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
  return 0;
}
