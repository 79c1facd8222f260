// bench/peers/mpi_alltoall.cc: Open MPI's MPI_Alltoall with collie-bench's
// schedule and statistic (bench/schedule.h), beside `collie-bench -C
// alltoall` in one run: per size, 5 warm-up operations, then -n samples of
// a barrier and a batch of back-to-back operations; the median sample of
// the slowest rank. The size is each rank's whole send buffer (n blocks),
// as nccl-tests and collie-bench count it; f32, out of place; element i of
// the block rank r sends rank j is r * 1e6 + j * 1e3 + (i mod 997), and
// every result is checked against it.
//   mpirun -n 2 mpi_alltoall [-b 8] [-e 64M] [-f 4] [-n 20]
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../schedule.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const bench::Sweep sweep = bench::Sweep::parse(argc, argv);
  const int iters = sweep.samples, warmup = 5;
  std::vector<float> in(sweep.max_bytes / 4 + static_cast<size_t>(n)), out(in.size());
  if (rank == 0) {
    std::printf("# mpi_alltoall: %d ranks, f32, out of place, MPI_Alltoall\n", n);
    std::printf(
        "# %d warm-up ops, then %d samples per size (a barrier and 10 back-to-back ops up to "
        "64 KiB, else 1); time = median sample of the slowest rank, best = fastest sample\n",
        warmup, iters);
    std::printf(
        "#         size        count   type  redop        time        best    algbw    busbw  "
        "#wrong\n");
  }
  auto value = [](int src, int dst, size_t i) {
    return static_cast<float>(src * 1e6 + dst * 1e3 + static_cast<double>(i % 997));
  };
  for (size_t bytes : sweep.sizes()) {
    const size_t block = std::max<size_t>(1, bytes / 4 / static_cast<size_t>(n));
    const size_t count = block * static_cast<size_t>(n);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i) in[j * block + i] = value(rank, j, i);
    auto op = [&] {
      MPI_Alltoall(in.data(), static_cast<int>(block), MPI_FLOAT, out.data(),
                   static_cast<int>(block), MPI_FLOAT, MPI_COMM_WORLD);
    };
    for (int w = 0; w < warmup; ++w) op();
    bench::Timing tm = bench::time_size(
        iters, bench::batch_for(count * 4), [] { MPI_Barrier(MPI_COMM_WORLD); }, op,
        [](std::vector<double>& t) {
          MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX,
                        MPI_COMM_WORLD);
        });
    long wrong = 0, all_wrong = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < block; ++i) wrong += out[q * block + i] != value(q, rank, i);
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    const double algbw = count * 4.0 / tm.median_us / 1e3, busbw = algbw * (n - 1) / n;
    if (rank == 0)
      std::printf("  %12zu %12zu %6s %6s %11.2f %11.2f %8.3f %8.3f %7ld\n", count * 4, count, "f32",
                  "none", tm.median_us, tm.best_us, algbw, busbw, all_wrong);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
