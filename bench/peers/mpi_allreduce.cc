// bench/peers/mpi_allreduce.cc: Open MPI's MPI_Allreduce with collie-bench's
// schedule and statistic (bench/schedule.h), so the two can be compared in
// one run (bench/compare.sh): per size, 5 warm-up operations, then -n
// samples of a barrier and a batch of back-to-back operations; the median
// sample of the slowest rank; f32 sum, out of place; rank r contributes
// (r + 1) + (i mod 1021) and every result is checked against the known
// answer.
//   mpirun -n 2 mpi_allreduce [-b 8] [-e 256M] [-f 4] [-n 20] [-I 1] [-C alltoall]
// -I 1: MPI_Iallreduce tested in a tight loop instead of MPI_Allreduce, the
// form collie's mpi backend uses (Open MPI runs it in libnbc, not tuned).
// -C alltoall: MPI_Alltoall instead, beside collie-bench -C alltoall: the
// size each rank's whole send buffer (as nccl-tests counts it); element i
// of the block rank r sends rank j is r * 1e6 + j * 1e3 + (i mod 997),
// checked.
// The C API only: Open MPI's deprecated C++ bindings do not build with -Werror.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../schedule.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const bench::Sweep sweep = bench::Sweep::parse(argc, argv);
  bool nonblocking = false, alltoall = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "-I") nonblocking = std::atoi(argv[i + 1]) != 0;
    if (std::string(argv[i]) == "-C") alltoall = std::string(argv[i + 1]) == "alltoall";
  }
  const int iters = sweep.samples, warmup = 5;
  std::vector<float> in(sweep.max_bytes / 4 + static_cast<size_t>(n)), out(in.size());
  if (rank == 0) {
    std::printf("# mpi_allreduce: %d ranks, f32, out of place, %s\n", n,
                alltoall      ? "MPI_Alltoall"
                : nonblocking ? "sum, MPI_Iallreduce + MPI_Test"
                              : "sum, MPI_Allreduce");
    std::printf(
        "# %d warm-up ops, then %d samples per size (a barrier and 10 back-to-back ops up to "
        "64 KiB, else 1); time = median sample of the slowest rank, best = fastest sample\n",
        warmup, iters);
    std::printf(
        "#         size        count   type  redop        time        best    algbw    busbw  "
        "#wrong\n");
  }
  auto routed = [](int src, int dst, size_t i) {
    return static_cast<float>(src * 1e6 + dst * 1e3 + static_cast<double>(i % 997));
  };
  for (size_t bytes : sweep.sizes()) {
    const size_t block = std::max<size_t>(1, bytes / 4 / static_cast<size_t>(n));
    const size_t count = alltoall ? block * static_cast<size_t>(n) : std::max<size_t>(1, bytes / 4);
    for (size_t i = 0; i < count; ++i)
      in[i] = alltoall ? routed(rank, static_cast<int>(i / block), i % block)
                       : static_cast<float>((rank + 1) + (i % 1021));
    auto blocking = [&] {
      if (alltoall)
        MPI_Alltoall(in.data(), static_cast<int>(block), MPI_FLOAT, out.data(),
                     static_cast<int>(block), MPI_FLOAT, MPI_COMM_WORLD);
      else
        MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
    };
    for (int w = 0; w < warmup; ++w) blocking();
    bench::Timing tm = bench::time_size(
        iters, bench::batch_for(count * 4), [] { MPI_Barrier(MPI_COMM_WORLD); },
        [&] {
          if (alltoall || !nonblocking) return blocking();
          MPI_Request r;
          MPI_Iallreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &r);
          for (int done = 0; !done;) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        },
        [](std::vector<double>& t) {
          MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX,
                        MPI_COMM_WORLD);
        });
    const double slowest = tm.median_us;
    long wrong = 0, all_wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += out[i] != (alltoall ? routed(static_cast<int>(i / block), rank, i % block)
                                   : static_cast<float>(n * (n + 1) / 2 + n * (i % 1021)));
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    const double algbw = count * 4.0 / slowest / 1e3;
    const double busbw = algbw * (alltoall ? 1.0 : 2.0) * (n - 1) / n;
    if (rank == 0)
      std::printf("  %12zu %12zu %6s %6s %11.2f %11.2f %8.3f %8.3f %7ld\n", count * 4, count, "f32",
                  alltoall ? "none" : "sum", slowest, tm.best_us, algbw, busbw, all_wrong);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
