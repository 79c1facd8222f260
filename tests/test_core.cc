// tests/test_core.cc: unit tests of the pieces under the communicator:
// dtype conversions and reduction kernels against float64 references, launch
// variable resolution against a fake environment, and Work's completion, chaining and timeout
// semantics.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "base/config.h"
#include "base/reduce.h"
#include "base/spin.h"
#include "base/topology.h"
#include "base/trace.h"
#include "collie/work.h"
#include "collie_build_config.h"
#include "comm/backend.h"
#include "comm/front/front.h"
#include "comm/front/shrink.h"
#include "mp_common.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

TEST(Half, KnownEncodings) {
  EXPECT_EQ(kernels::float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(kernels::float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(kernels::float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(kernels::float_to_half(65520.0f), 0x7c00);         // rounds up to inf
  EXPECT_EQ(kernels::float_to_half(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(kernels::float_to_half(0x1p-25f), 0x0000);         // ties to even: 0
  EXPECT_EQ(kernels::float_to_half(1.0f + 0x1p-11f), 0x3c00);  // tie, to even
  EXPECT_EQ(kernels::float_to_half(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);
  EXPECT_TRUE(std::isnan(kernels::half_to_float(kernels::float_to_half(NAN))));
  EXPECT_EQ(kernels::half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(kernels::half_to_float(0x7bff), 65504.0f);
}

TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = kernels::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(kernels::float_to_half(f), h) << std::hex << h;
  }
}

TEST(Half, RoundingIsToNearestAgainstDoubleReference) {
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-70000.f, 70000.f);
  for (int k = 0; k < 200000; ++k) {
    float f = d(g) * (k % 3 == 0 ? 1e-6f : 1.0f);
    float r = kernels::half_to_float(kernels::float_to_half(f));
    if (std::isinf(r)) {
      EXPECT_GE(std::abs(f), 65520.0f);
      continue;
    }
    // No representable half is nearer: check the neighbours.
    uint16_t h = kernels::float_to_half(f);
    for (int delta : {-1, 1}) {
      float nb = kernels::half_to_float(static_cast<uint16_t>(h + delta));
      if (std::isnan(nb) || std::isinf(nb) || ((h + delta) & 0x7fff) == 0x7fff) continue;
      EXPECT_LE(std::abs(double(r) - f), std::abs(double(nb) - f) + 1e-30) << f;
    }
  }
}

TEST(BFloat16, KnownEncodingsAndRounding) {
  EXPECT_EQ(kernels::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(kernels::float_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(kernels::float_to_bf16(1.0f + 0x1p-8f), 0x3f80);            // tie, to even
  EXPECT_EQ(kernels::float_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);  // tie, to even
  EXPECT_EQ(kernels::bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(kernels::bf16_to_float(kernels::float_to_bf16(NAN))));
}

TEST(Kernels, EveryDtypeAndOpAgainstDoubleReference) {
  const size_t n = 3001;  // not a multiple of the f16 block
  for (int ti = 0; ti < kNumDTypes; ++ti)
    for (int oi = 0; oi < kNumReduceOps; ++oi) {
      DType t = static_cast<DType>(ti);
      ReduceOp op = static_cast<ReduceOp>(oi);
      if (!supports(op, t)) continue;
      size_t es = dtype_size(t);
      std::vector<uint8_t> a(n * es), b(n * es), out(n * es);
      for (size_t i = 0; i < n; ++i) {
        testing::put(t, a.data(), i, testing::exact_value(op, 0, i, 3));
        testing::put(t, b.data(), i, testing::exact_value(op, 1, i, 3));
      }
      int divisor = op == ReduceOp::avg ? 2 : 0;
      kernels::reduce(t, op, out.data(), a.data(), b.data(), n, divisor);
      for (size_t i = 0; i < n; ++i) {
        double want =
            testing::combine(op, testing::get(t, a.data(), i), testing::get(t, b.data(), i));
        if (divisor) want = testing::rounded(t, want / divisor);
        ASSERT_EQ(testing::get(t, out.data(), i), want)
            << to_string(t) << " " << to_string(op) << " at " << i;
      }
    }
}

// Integer sum and prod wrap around as the unsigned type of the same width
// does (two's complement), as NCCL's and MPI's integer reductions do in
// practice; signed overflow in C++ is undefined behaviour (UBSan's "signed
// integer overflow: 1 + 2147483647" before the fix).
TEST(Kernels, IntegerSumAndProdWrapAroundWithoutUndefinedBehaviour) {
  const int32_t a32[] = {INT32_MAX, INT32_MIN, INT32_MAX, -7};
  const int32_t b32[] = {1, -1, 2, 3};
  int32_t d32[4];
  kernels::reduce(DType::i32, ReduceOp::sum, d32, a32, b32, 4);
  EXPECT_EQ(d32[0], INT32_MIN);
  EXPECT_EQ(d32[1], INT32_MAX);
  EXPECT_EQ(d32[2], INT32_MIN + 1);
  EXPECT_EQ(d32[3], -4);
  kernels::reduce(DType::i32, ReduceOp::prod, d32, a32, b32, 4);
  EXPECT_EQ(d32[0], INT32_MAX);
  EXPECT_EQ(d32[1], INT32_MIN);  // -2^31 x -1 wraps to itself
  EXPECT_EQ(d32[2], -2);
  EXPECT_EQ(d32[3], -21);
  const int64_t a64[] = {INT64_MAX, INT64_MIN, INT64_MAX};
  const int64_t b64[] = {1, -1, 2};
  int64_t d64[3];
  kernels::reduce(DType::i64, ReduceOp::sum, d64, a64, b64, 3);
  EXPECT_EQ(d64[0], INT64_MIN);
  EXPECT_EQ(d64[1], INT64_MAX);
  EXPECT_EQ(d64[2], INT64_MIN + 1);
  kernels::reduce(DType::i64, ReduceOp::prod, d64, a64, b64, 3);
  EXPECT_EQ(d64[0], INT64_MAX);
  EXPECT_EQ(d64[1], INT64_MIN);
  EXPECT_EQ(d64[2], -2);
  const uint8_t a8[] = {255, 16}, b8[] = {1, 16};
  uint8_t d8[2];
  kernels::reduce(DType::u8, ReduceOp::sum, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], 0);
  EXPECT_EQ(d8[1], 32);
  kernels::reduce(DType::u8, ReduceOp::prod, d8, a8, b8, 2);
  EXPECT_EQ(d8[0], 255);
  EXPECT_EQ(d8[1], 0);  // 256 wraps
}

TEST(Kernels, MinMaxPropagateNanWhicheverSideItIsOn) {
  float a[2] = {NAN, 1.0f}, b[2] = {1.0f, NAN}, o[2];
  for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    kernels::reduce(DType::f32, op, o, a, b, 2);
    EXPECT_TRUE(std::isnan(o[0]) && std::isnan(o[1])) << to_string(op);
  }
}

// The kernel may use the F16C instructions; they must agree bit for bit with
// the portable conversion (round to nearest even) on every finite input.
TEST(Kernels, HalfKernelAgreesWithPortableConversion) {
  std::vector<uint16_t> a, b;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf and nan
    a.push_back(static_cast<uint16_t>(h));
    b.push_back(static_cast<uint16_t>((h * 40503u) & 0xfbff));
  }
  std::vector<uint16_t> out(a.size());
  kernels::reduce(DType::f16, ReduceOp::sum, out.data(), a.data(), b.data(), a.size());
  size_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    float sum = kernels::half_to_float(a[i]) + kernels::half_to_float(b[i]);
    wrong += out[i] != kernels::float_to_half(sum);
  }
  EXPECT_EQ(wrong, 0u);
}

// convert (the compression hooks' kernel) agrees with the scalar reference
// for every pair of float types, with and without a divisor.
TEST(Kernels, ConvertMatchesScalarReference) {
  const size_t n = 2500;
  std::mt19937 g(5);
  std::uniform_real_distribution<float> d(-300.f, 300.f);
  std::vector<float> src32(n);
  for (auto& x : src32) x = d(g);
  for (DType st : {DType::f32, DType::f16, DType::bf16, DType::f64})
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64})
      for (int div : {1, 3}) {
        std::vector<uint8_t> src(n * 8), dst(n * 8);
        for (size_t i = 0; i < n; ++i) testing::put(st, src.data(), i, src32[i]);
        kernels::convert(st, src.data(), dt, dst.data(), n, div);
        size_t wrong = 0;
        for (size_t i = 0; i < n; ++i) {
          double v = testing::get(st, src.data(), i);
          // In f32 (or f64 when either side is f64), then rounded once.
          double want = (st == DType::f64 || dt == DType::f64)
                            ? testing::rounded(dt, v / div)
                            : testing::rounded(dt, static_cast<float>(v) / static_cast<float>(div));
          wrong += testing::get(dt, dst.data(), i) != want;
        }
        EXPECT_EQ(wrong, 0u) << to_string(st) << " -> " << to_string(dt) << " / " << div;
      }
}

config::Env fake(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
  return "no error";
}

TEST(Config, SourcesInPrecedenceOrder) {
  Options none;
  auto l = config::resolve_launch(none, fake({{"RANK", "1"},
                                              {"WORLD_SIZE", "4"},
                                              {"MASTER_ADDR", "node0"},
                                              {"MASTER_PORT", "29500"},
                                              {"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "8"}}));
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.master_addr, "node0");
  EXPECT_EQ(l.master_port, 29500);

  l = config::resolve_launch(none, fake({{"COLLIE_RANK", "2"},
                                         {"COLLIE_WORLD_SIZE", "3"},
                                         {"RANK", "0"},
                                         {"WORLD_SIZE", "3"},
                                         {"COLLIE_MASTER_PORT", "1234"}}));
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.master_port, 1234);
  EXPECT_EQ(l.master_addr, "127.0.0.1");  // all ranks local: loopback

  l = config::resolve_launch(none, fake({{"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                         {"MASTER_ADDR", "n0"},
                                         {"OMPI_MCA_ess_base_jobid", "12345"}}));
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world_size, 2);
  EXPECT_GE(l.master_port, 20000);  // derived from the job id
  // ... below the kernel's ephemeral ports (32768 up), where another
  // connection's local port could hold it: 20000-39999 gave 36304 in CI.
  for (int job = 1; job <= 50; ++job) {
    const std::string id = std::to_string(job);
    const int port = config::resolve_launch(none, fake({{"OMPI_COMM_WORLD_RANK", "1"},
                                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                        {"MASTER_ADDR", "n0"},
                                                        {"OMPI_MCA_ess_base_jobid", id}}))
                         .master_port;
    EXPECT_GE(port, 20000) << "job " << id;
    EXPECT_LT(port, 32768) << "job " << id;
  }

  // Under torchrun the agent's own store holds MASTER_PORT: collie uses the next.
  l = config::resolve_launch(none, fake({{"RANK", "1"},
                                         {"WORLD_SIZE", "2"},
                                         {"MASTER_PORT", "29500"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_EQ(l.master_port, 29501);

  l = config::resolve_launch(none, fake({{"SLURM_PROCID", "5"},
                                         {"SLURM_NTASKS", "6"},
                                         {"SLURM_LOCALID", "1"},
                                         {"MASTER_ADDR", "n0"},
                                         {"MASTER_PORT", "4000"}}));
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.world_size, 6);
  EXPECT_EQ(l.local_rank, 1);

  Options explicit_opts;
  explicit_opts.rank = 0;
  explicit_opts.world_size = 2;
  explicit_opts.master_port = 999;
  l = config::resolve_launch(explicit_opts, fake({{"RANK", "1"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.world_size, 2);
  EXPECT_EQ(l.master_port, 999);

  l = config::resolve_launch(none, fake({}));
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.world_size, 1);  // no launcher: a single process
}

TEST(Config, BadValuesSayWhatToChange) {
  Options none;
  EXPECT_EQ(error_of([&] {
              config::resolve_launch(none, fake({{"RANK", "0"}, {"WORLD_SIZE", "abc"}}));
            }),
            "invalid_argument: WORLD_SIZE='abc' is not an integer; set it to a whole number");
  auto msg = error_of([&] {
    config::resolve_launch(none, fake({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  });
  EXPECT_NE(msg.find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos) << msg;
  msg = error_of([&] { config::resolve_launch(none, fake({{"RANK", "1"}})); });
  EXPECT_NE(msg.find("WORLD_SIZE"), std::string::npos) << msg;
  msg = error_of([&] {
    config::resolve_launch(none,
                           fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}));
  });
  EXPECT_NE(msg.find("MASTER_PORT=70000"), std::string::npos) << msg;
  msg = error_of([&] {
    config::resolve_launch(none, fake({{"RANK", "0"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_PORT", "29500"},
                                       {"COLLIE_TIMEOUT", "-3"}}));
  });
  EXPECT_NE(msg.find("COLLIE_TIMEOUT"), std::string::npos) << msg;
  msg = error_of([&] { config::tcp_tuning(fake({{"COLLIE_ALLREDUCE_ALGO", "fast"}})); });
  EXPECT_NE(msg.find("auto, ring, rd"), std::string::npos) << msg;
}

// Sizes in bytes take collie-bench's K, M and G (binary) as well as plain
// numbers; anything else names the variable and the form.
TEST(Config, SizesTakeKMAndGSuffixes) {
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_SHM_CHUNK", "1M"}})).chunk_bytes, size_t{1} << 20);
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_SHM_CHUNK", "262144"}})).chunk_bytes, 262144u);
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_SHM_SMALL", "16k"}})).small_bytes, 16384u);
  EXPECT_EQ(config::tcp_tuning(fake({{"COLLIE_TCP_CHUNK_BYTES", "512K"}})).chunk_bytes, 524288u);
  EXPECT_EQ(config::cuda_chunk_bytes(fake({{"COLLIE_CUDA_CHUNK", "1G"}})), size_t{1} << 30);
  EXPECT_EQ(config::hier_piece_bytes(fake({{"COLLIE_HIER_PIECE", "2M"}})), size_t{2} << 20);
  for (const char* bad : {"1X", "K", "1.5M", "1MB", "-1K", "99999999999G"}) {
    auto msg = error_of([&] { config::shm_tuning(fake({{"COLLIE_SHM_CHUNK", bad}})); });
    EXPECT_EQ(msg, std::string("invalid_argument: COLLIE_SHM_CHUNK='") + bad +
                       "' is not a size; set it to a whole number of bytes, with an optional K, "
                       "M or G (262144 or 256K)")
        << bad;
  }
  // In range after the suffix, as before.
  auto msg = error_of([&] { config::shm_tuning(fake({{"COLLIE_SHM_CHUNK", "1G"}})); });
  EXPECT_NE(msg.find("between 4096 and 67108864"), std::string::npos) << msg;
}

// Half a core's L2, a power of two, 64 KiB to 4 MiB, at most 32 MiB of
// rounds in all: the EPYC here before (512 KiB L2) got 256 KiB, the Xeon
// (2 MiB) 1 MiB, the sizes measured best on each (bench/RESULTS.md).
TEST(Config, ShmRoundIsHalfACoresL2) {
  EXPECT_EQ(config::shm_auto_chunk(512 << 10, 2), size_t{256} << 10);
  EXPECT_EQ(config::shm_auto_chunk(2 << 20, 2), size_t{1} << 20);
  EXPECT_EQ(config::shm_auto_chunk(1280 << 10, 2), size_t{512} << 10);  // not a power of two
  EXPECT_EQ(config::shm_auto_chunk(size_t{32} << 20, 2), size_t{4} << 20);
  EXPECT_EQ(config::shm_auto_chunk(32 << 10, 2), size_t{64} << 10);
  EXPECT_EQ(config::shm_auto_chunk(2 << 20, 64), size_t{256} << 10);  // 64 x 2 x 256 KiB = 32 MiB
  EXPECT_EQ(config::shm_auto_chunk(2 << 20, 1024), size_t{64} << 10);
  EXPECT_EQ(config::shm_auto_chunk(0, 2), config::ShmTuning{}.chunk_bytes);  // unknown L2
  EXPECT_FALSE(config::shm_tuning(fake({})).chunk_set);
  EXPECT_TRUE(config::shm_tuning(fake({{"COLLIE_SHM_CHUNK", "1M"}})).chunk_set);
  EXPECT_TRUE(config::shm_tuning(fake({{"COLLIE_SHM_SMALL", "0"}})).small_set);
}

// The mpi backend's settings.
TEST(Config, MpiSettingsCheckIsOnUnlessTurnedOff) {
  EXPECT_EQ(config::mpi_settings(fake({})).check, 1);
  EXPECT_EQ(config::mpi_settings(fake({{"COLLIE_MPI_CHECK", "0"}})).check, 0);
  EXPECT_EQ(config::mpi_settings(fake({{"COLLIE_MPI_CHECK", "2"}})).check, 2);
  EXPECT_THROW(config::mpi_settings(fake({{"COLLIE_MPI_CHECK", "3"}})), Error);
}

// Open MPI's btl list as mpirun --mca btl passes it: shared memory unless
// the list leaves out vader and sm (or excludes one of them with ^).
TEST(Config, MpiSharedMemoryFollowsOpenMpisBtlList) {
  auto shm = [](const char* btl) {
    return config::mpi_settings(fake({{"OMPI_MCA_btl", btl}})).shared_memory_btl;
  };
  EXPECT_TRUE(config::mpi_settings(fake({})).shared_memory_btl);
  EXPECT_TRUE(shm("self,vader"));
  EXPECT_TRUE(shm("tcp,sm,self"));
  EXPECT_TRUE(shm("^tcp"));
  EXPECT_FALSE(shm("self,tcp"));
  EXPECT_FALSE(shm("^vader"));
  EXPECT_FALSE(shm("^tcp,sm"));
  EXPECT_FALSE(shm("self,vaderx"));
}

// Whether waits may spin: Open MPI's verdict wins over the CPU count (1
// under mpirun's binding), for tcp and shm as for mpi; without it, ranks
// against CPUs. (Reading the CPU count alone, every op of the mpi backend
// napped between tests: an 8 KiB all-reduce 90 us, not 10.)
TEST(Config, RanksFitCoresTakesOpenMpisVerdictOverTheBoundCpuCount) {
  EXPECT_TRUE(config::ranks_fit_cores(2, 1, fake({{"OMPI_MCA_mpi_oversubscribe", "0"}})));
  EXPECT_FALSE(config::ranks_fit_cores(2, 8, fake({{"OMPI_MCA_mpi_oversubscribe", "1"}})));
  EXPECT_FALSE(config::ranks_fit_cores(2, 1, fake({})));
  EXPECT_TRUE(config::ranks_fit_cores(2, 2, fake({})));
}

// collie picks Open MPI's non-blocking all-reduce algorithm per call unless
// told not to, or unless the user gave Open MPI's own setting.
TEST(Config, MpiAlgorithmChoiceYieldsToTheUsersOwnSetting) {
  EXPECT_TRUE(config::mpi_settings(fake({})).choose_algorithms);
  EXPECT_FALSE(config::mpi_settings(fake({{"COLLIE_MPI_ALGORITHMS", "0"}})).choose_algorithms);
  EXPECT_FALSE(config::mpi_settings(fake({{"OMPI_MCA_coll_libnbc_iallreduce_algorithm", "2"}}))
                   .choose_algorithms);
  EXPECT_THROW(config::mpi_settings(fake({{"COLLIE_MPI_ALGORITHMS", "yes"}})), Error);
}

// What `auto` picks, and what asking for a backend that cannot be had says.
// The job identity every handshake compares: the launcher's job id where
// it gives one, and the world size always; the secret is never made up
// from it (it would travel in clear as the identity does).
TEST(Config, JobIdentityComesFromTheLauncher) {
  Options none;
  auto job = [&](std::map<std::string, std::string> vars) {
    vars.emplace("RANK", "0");
    vars.emplace("WORLD_SIZE", "4");
    vars.emplace("MASTER_PORT", "29500");
    return config::resolve_launch(none, fake(vars));
  };
  EXPECT_EQ(job({}).job, "4 ranks");
  EXPECT_EQ(job({}).secret, "");
  EXPECT_EQ(job({{"TORCHELASTIC_RUN_ID", "abc"}}).job, "TORCHELASTIC_RUN_ID=abc, 4 ranks");
  EXPECT_EQ(job({{"TORCHELASTIC_RUN_ID", "abc"}}).secret, "");
  EXPECT_EQ(job({{"OMPI_MCA_ess_base_jobid", "77"}}).job, "OMPI_MCA_ess_base_jobid=77, 4 ranks");
  EXPECT_EQ(job({{"SLURM_JOB_ID", "9"}, {"SLURM_STEP_ID", "2"}}).job, "SLURM_JOB_ID=9.2, 4 ranks");
  // An explicit identity wins over the launcher's.
  EXPECT_EQ(job({{"COLLIE_JOB_ID", "mine"}, {"SLURM_JOB_ID", "9"}}).job,
            "COLLIE_JOB_ID=mine, 4 ranks");
  EXPECT_EQ(job({{"COLLIE_JOB_SECRET", "s"}}).secret, "s");
  // Two jobs that differ only in size are two jobs.
  EXPECT_NE(job({}).job,
            config::resolve_launch(
                none, fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}))
                .job);
}

TEST(Registry, AutoPicksByLaunchAndAskingForAMissingBackendSaysWhy) {
  config::Launch one_host;
  one_host.world_size = 4;
  one_host.local_world_size = 4;
  one_host.source = "COLLIE";
  EXPECT_STREQ(pick_backend("auto", one_host).name, "shm");
  config::Launch hosts = one_host;
  hosts.local_world_size = 2;
  EXPECT_STREQ(pick_backend("auto", hosts).name, "hier");
  config::Launch mpirun_hosts = hosts;
  mpirun_hosts.source = "OMPI";
  // Under mpirun across hosts, MPI's interconnect; on one host, shm still.
  EXPECT_STREQ(pick_backend("auto", mpirun_hosts).name, COLLIE_HAVE_MPI ? "mpi" : "hier");
  config::Launch mpirun_one_host = one_host;
  mpirun_one_host.source = "OMPI";
  EXPECT_STREQ(pick_backend("auto", mpirun_one_host).name, "shm");

  auto why = [](const std::string& name, const config::Launch& l) {
    try {
      pick_backend(name, l);
    } catch (const Error& e) {
      return std::string(to_string(e.code())) + ": " + e.what();
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  if (COLLIE_HAVE_MPI) {
    EXPECT_STREQ(pick_backend("mpi", mpirun_hosts).name, "mpi");
    EXPECT_PRED2(has, why("mpi", hosts),
                 "unavailable: backend 'mpi' cannot serve these ranks: it "
                 "needs an MPI launch (mpirun or srun)");
  } else {
    EXPECT_PRED2(has, why("mpi", mpirun_hosts),
                 "unavailable: backend 'mpi' is not available: this build "
                 "has no MPI: install Open MPI");
    EXPECT_PRED2(has, why("mpi", mpirun_hosts), "-Dmpi=enabled");
  }
  EXPECT_PRED2(has, why("shm", hosts), "it needs every rank on one host");
  EXPECT_PRED2(has, why("gloo", hosts), "invalid_argument: unknown backend 'gloo'");
}

// collie-run's own settings come through base/config.h like everything else.
TEST(Config, LauncherSettingsAndTheirBadValues) {
  auto l = config::launcher_settings(fake({}));
  EXPECT_EQ(l.grace_seconds, 5);
  EXPECT_EQ(l.job_secret, "");
  EXPECT_FALSE(l.thread_count_set);
  l = config::launcher_settings(fake(
      {{"COLLIE_RUN_GRACE", "0"}, {"COLLIE_JOB_SECRET", "s3"}, {"OPENBLAS_NUM_THREADS", "1"}}));
  EXPECT_EQ(l.grace_seconds, 0);
  EXPECT_EQ(l.job_secret, "s3");
  EXPECT_TRUE(l.thread_count_set);
  EXPECT_TRUE(config::launcher_settings(fake({{"OMP_NUM_THREADS", "2"}})).thread_count_set);
  for (const char* bad : {"-1", "86401", "abc", "1.5"}) {
    std::string msg = error_of([&] {
      config::launcher_settings(fake({{"COLLIE_RUN_GRACE", bad}}));
    });
    EXPECT_NE(msg.find("COLLIE_RUN_GRACE"), std::string::npos) << bad << ": " << msg;
  }
}

// COLLIE_TUNING_FILE: the profile collie-bench --tune writes feeds the cost
// model's settings, the environment wins over it, and a bad file is an
// error that names the file and the line.
TEST(Config, TuningFileUnderTheEnvironment) {
  std::string path = ::testing::TempDir() + "collie_tuning_test.txt";
  auto write = [&](const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write(
      "# measured\nCOLLIE_TCP_LATENCY_US=12.5\n  COLLIE_TCP_GBPS = 3.25  # each way\n"
      "COLLIE_REDUCE_GBPS=11\nCOLLIE_SHM_CHUNK=65536\n");
  auto t = config::tcp_tuning(fake({{"COLLIE_TUNING_FILE", path}}));
  EXPECT_DOUBLE_EQ(t.latency_us, 12.5);
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps, 3.25);
  EXPECT_DOUBLE_EQ(t.reduce_gbps, 11);
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_TUNING_FILE", path}})).chunk_bytes, 65536u);
  t = config::tcp_tuning(fake({{"COLLIE_TUNING_FILE", path}, {"COLLIE_TCP_GBPS", "7"}}));
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps, 7);
  EXPECT_DOUBLE_EQ(t.latency_us, 12.5);
  auto error_with = [&](const std::string& text) {
    write(text);
    return error_of([&] { config::tcp_tuning(fake({{"COLLIE_TUNING_FILE", path}})); });
  };
  EXPECT_NE(error_with("COLLIE_TCP_GBPS=1\nCOLLIE_TCP_GPBS=2\n")
                .find(path + ":2: COLLIE_TCP_GPBS is not a tuning setting"),
            std::string::npos);
  EXPECT_NE(error_with("COLLIE_TCP_GBPS=fast\n")
                .find(path + ":1: COLLIE_TCP_GBPS='fast' is not a number"),
            std::string::npos);
  EXPECT_NE(error_with("just words\n").find(path + ":1: 'just words' is not NAME=value"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(error_of([&] {
              config::tcp_tuning(fake({{"COLLIE_TUNING_FILE", path}}));
            }).find("cannot be read"),
            std::string::npos);
}

TEST(Config, TimeoutFromEnvironmentInSeconds) {
  Options none;
  auto l = config::resolve_launch(none, fake({{"COLLIE_TIMEOUT", "2.5"}}));
  EXPECT_EQ(l.timeout, 2500ms);
  Options o;
  o.timeout = 7s;
  EXPECT_EQ(config::resolve_launch(o, fake({{"COLLIE_TIMEOUT", "2.5"}})).timeout, 7s);
  EXPECT_EQ(config::resolve_launch(none, fake({})).timeout, 300s);
}

// Run once as is and once under `taskset -c 0` (tests/meson.build), which
// sets COLLIE_TEST_EXPECT_CPUS=1: the count must follow the process binding.
TEST(Topology, UsableCpusFollowTheProcessBinding) {
  int n = topology::usable_cpus();
  EXPECT_GE(n, 1);
  if (const char* want = std::getenv("COLLIE_TEST_EXPECT_CPUS"))
    EXPECT_EQ(n, std::atoi(want));
  else
    EXPECT_LE(n, static_cast<int>(std::thread::hardware_concurrency()));
}

// COLLIE_BIND=core, in forked processes standing for the local ranks: each
// gets a block of this process's CPUs, the blocks do not overlap while
// there are cores enough, together they cover every CPU, and with more ranks
// than cores every rank still gets one. numa puts each on a node's CPUs.
// (This machine's CPUs are cores: no SMT.)
std::set<int> cpus_of(const std::string& list) {
  std::set<int> out;
  std::stringstream ss(list);
  for (std::string part; std::getline(ss, part, ',');) {
    auto dash = part.find('-');
    int lo = std::stoi(part.substr(0, dash)),
        hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

std::vector<std::set<int>> bound_cpus(const std::string& how, int ranks) {
  std::vector<std::set<int>> out;
  for (int r = 0; r < ranks; ++r) {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
      std::string got;
      try {
        got = topology::bind(how, r, ranks);
      } catch (const Error& e) {
        got = std::string("error ") + e.what();
      }
      [[maybe_unused]] ssize_t w = ::write(p[1], got.data(), got.size());
      _exit(0);
    }
    ::close(p[1]);
    std::string got;
    char buf[256];
    for (ssize_t k; (k = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, k);
    ::close(p[0]);
    waitpid(pid, nullptr, 0);
    EXPECT_EQ(got.rfind("error", 0), std::string::npos) << got;
    out.push_back(got.rfind("error", 0) == 0 ? std::set<int>{} : cpus_of(got));
  }
  return out;
}

TEST(Topology, BindGivesEachLocalRankItsShareOfTheCores) {
  const std::set<int> all = cpus_of(topology::binding());
  ASSERT_FALSE(all.empty());
  const int cores = static_cast<int>(all.size());
  for (int ranks : {1, 2, cores, cores + 1}) {
    auto sets = bound_cpus("core", ranks);
    std::set<int> covered;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_FALSE(sets[r].empty()) << ranks << " ranks, rank " << r;
      for (int c : sets[r]) EXPECT_TRUE(all.count(c)) << "CPU " << c << " is not this process's";
      if (ranks <= cores) {
        for (int q = 0; q < r; ++q)
          for (int c : sets[r]) EXPECT_FALSE(sets[q].count(c)) << "CPU " << c << " given twice";
      }
      covered.insert(sets[r].begin(), sets[r].end());
    }
    EXPECT_EQ(covered, all) << ranks << " ranks";
  }
  for (const auto& s : bound_cpus("numa", 2)) EXPECT_FALSE(s.empty());
  EXPECT_NE(error_of([] {
              config::bind(fake({{"COLLIE_BIND", "socket"}}));
            }).find("COLLIE_BIND='socket' is not one of none, core, numa"),
            std::string::npos);
}

// The waiters' spin: grows when a sleep was answered about as soon as it
// began (a wake-up lost to a short spin), shrinks back when the peer was
// really late, and stays put when the user fixed it.
TEST(SpinBudget, GrowsOnWakeUpsItCouldHaveSpunThroughAndShrinksOnLatePeers) {
  SpinBudget s(50, true);
  EXPECT_EQ(s.get(), 50us);
  s.slept(70us);  // answered within a spin plus a wake-up
  EXPECT_EQ(s.get(), 100us);
  for (int i = 0; i < 10; ++i) s.slept(20us);
  EXPECT_EQ(s.get(), 400us);  // at most 8x the base
  s.slept(1000us);            // between: a peer a little late; keep
  EXPECT_EQ(s.get(), 400us);
  s.slept(5ms);  // a peer computing: spinning would burn a core
  EXPECT_EQ(s.get(), 200us);
  for (int i = 0; i < 10; ++i) s.slept(50ms);
  EXPECT_EQ(s.get(), 50us);  // never under the base

  SpinBudget fixed(50, false);
  fixed.slept(10us);
  EXPECT_EQ(fixed.get(), 50us);
  SpinBudget none(0, true);  // more ranks than cores: never spin
  none.slept(1us);
  EXPECT_EQ(none.get(), 0us);

  // From COLLIE_SPIN_US: set, fixed; unset, 50 us adapting where cores are free.
  auto set = SpinBudget::from_setting(20, true);
  set.slept(1us);
  EXPECT_EQ(set.get(), 20us);
  auto unset = SpinBudget::from_setting(-1, true);
  EXPECT_EQ(unset.get(), 50us);
  unset.slept(1us);
  EXPECT_EQ(unset.get(), 100us);
  EXPECT_EQ(SpinBudget::from_setting(-1, false).get(), 0us);
}

TEST(WorkHandle, CompletionErrorAndTimeout) {
  Work w = Work::pending("op #1", 5s);
  EXPECT_FALSE(w.done());
  std::thread t([w] {
    std::this_thread::sleep_for(20ms);
    w.complete();
  });
  w.wait();
  t.join();
  EXPECT_TRUE(w.done());
  EXPECT_FALSE(w.error());

  Work f = Work::pending("op #2", 5s);
  f.fail(Error(ErrorCode::peer_lost, "rank 3 lost"));
  EXPECT_TRUE(f.done());
  EXPECT_EQ(f.error()->code(), ErrorCode::peer_lost);
  EXPECT_THROW(f.wait(), Error);

  Work slow = Work::pending("op #3", 5s);
  try {
    slow.wait(30ms);
    ADD_FAILURE() << "wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout);
    EXPECT_NE(std::string(e.what()).find("op #3"), std::string::npos);
  }
  slow.complete();
}

// Waiters sleep on a futex word (Completion::block_until), which a finish
// wakes only when it sees a waiter counted: a waiter that counted itself
// after the finish's look, and then slept, would sleep to its deadline
// (an end seen late is still an end, so only the time shows it). Many
// rounds of two waiters racing one finish; a lost wake-up is a wait of
// seconds, against microseconds.
TEST(WorkHandle, AWaiterIsWokenByAFinishThatRacesItsSleep) {
  constexpr int kRounds = 3000;
  std::vector<Work> works;
  for (int i = 0; i < kRounds; ++i) works.push_back(Work::pending("op #" + std::to_string(i), 60s));
  std::atomic<int> next{0};  // the round the finisher is at
  std::atomic<int> lost{0};
  auto waiter = [&] {
    for (int i = 0; i < kRounds; ++i) {
      while (next.load() < i) {
      }
      auto t0 = std::chrono::steady_clock::now();
      works[static_cast<size_t>(i)].wait(30s);
      if (std::chrono::steady_clock::now() - t0 > 5s) ++lost;
    }
  };
  std::thread a(waiter), b(waiter);
  for (int i = 0; i < kRounds; ++i) {
    next.store(i);
    for (int k = 0; k < (i % 7) * 50; ++k) std::atomic_signal_fence(std::memory_order_seq_cst);
    works[static_cast<size_t>(i)].complete();
  }
  a.join();
  b.join();
  EXPECT_EQ(lost.load(), 0) << "waits woken only by their deadline";
  for (auto& w : works) EXPECT_TRUE(w.done());
}

// finish() claims the end without a lock: a callback registered while
// finish() runs on another thread must run once, neither lost nor twice,
// and of two finish() calls the first wins, with both returning only once
// the end is visible.
TEST(WorkHandle, ACallbackRegisteredWhileTheEndRacesRunsExactlyOnce) {
  constexpr int kRounds = 20000;
  int lost = 0, twice = 0, early = 0, mixed = 0;
  for (int i = 0; i < kRounds; ++i) {
    Work w = Work::pending("op #" + std::to_string(i), 60s);
    std::atomic<int> runs{0};
    std::atomic<bool> go{false};
    std::atomic<int> seen_ended{0};
    auto finisher = [&](std::optional<Error> e) {
      while (!go.load()) {
      }
      w.completion()->finish(std::move(e));
      if (w.done()) ++seen_ended;
    };
    std::thread a(finisher, std::nullopt);
    std::thread b(finisher, Error(ErrorCode::aborted, "the second finish"));
    go.store(true);
    for (int k = 0; k < i % 13; ++k) std::atomic_signal_fence(std::memory_order_seq_cst);
    w.completion()->on_complete([&] { ++runs; });
    a.join();
    b.join();
    if (runs.load() == 0) ++lost;
    if (runs.load() > 1) ++twice;
    if (seen_ended.load() != 2) ++early;
    // The error is the winner's, whole: none, or the second finish's.
    auto e = w.error();
    if (e && std::string(e->what()).find("the second finish") == std::string::npos) ++mixed;
  }
  EXPECT_EQ(lost, 0) << "callbacks never run";
  EXPECT_EQ(twice, 0) << "callbacks run twice";
  EXPECT_EQ(early, 0) << "finish() returned before the end was visible";
  EXPECT_EQ(mixed, 0);
}

// What the NCCL backend will return: a completion that is ended when its
// CUDA event fires (query polls it), makes a stream wait without blocking
// the host, and aborts its communicator when told to. A fake event stands in
// for CUDA here; Work drives it through the Completion interface alone.
class FakeEventCompletion final : public Completion {
 public:
  using Completion::Completion;
  std::atomic<bool> fired{false};
  std::atomic<int> polls{0};
  std::vector<void*> streams;
  bool aborted = false;

  bool query() override {
    ++polls;
    if (fired) finish(std::nullopt);
    return ended();
  }
  bool wait_until(Clock::time_point deadline) override {
    while (!query()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
  void wait_on(void* stream) override { streams.push_back(stream); }
  void abort(const Error& e) override {
    aborted = true;
    finish(e);
  }
};

TEST(WorkHandle, ADeviceCompletionIsPolledAndAStreamWaitsWithoutTheHost) {
  auto ev = std::make_shared<FakeEventCompletion>("allreduce #1 on cuda:0", 5s);
  Work w(ev);
  EXPECT_FALSE(w.done());
  EXPECT_GT(ev->polls.load(), 0);
  int stream = 0;
  w.wait_on(&stream);  // enqueued on the stream: returns before the event fires
  ASSERT_EQ(ev->streams.size(), 1u);
  EXPECT_EQ(ev->streams[0], &stream);
  EXPECT_FALSE(ev->ended());
  std::thread fire([ev] {
    std::this_thread::sleep_for(20ms);
    ev->fired = true;
  });
  w.wait();  // polls until the event fires
  fire.join();
  EXPECT_TRUE(w.done());

  auto stuck = std::make_shared<FakeEventCompletion>("allreduce #2 on cuda:0", 5s);
  Work s(stuck);
  Work after = s.then([](const Work& w) {
    if (auto e = w.error()) throw *e;
  });
  EXPECT_THROW(s.wait(30ms), Error);  // the event never fires: a timeout naming it
  stuck->abort(Error(ErrorCode::timeout, "allreduce #2 on cuda:0 timed out"));
  EXPECT_TRUE(stuck->aborted);
  ASSERT_TRUE(after.error().has_value());  // continuations see the abort
  EXPECT_EQ(after.error()->code(), ErrorCode::timeout);
}

TEST(WorkHandle, ThenChainsAndPropagatesErrors) {
  Work a = Work::pending("a", 5s);
  int order = 0, ran_at = -1;
  Work b = a.then([&](const Work&) { ran_at = order++; });
  EXPECT_FALSE(b.done());
  a.complete();
  EXPECT_TRUE(b.done());
  EXPECT_EQ(ran_at, 0);

  Work inner = Work::pending("inner", 5s);
  Work c = Work().then_work([&](const Work&) { return inner; });
  EXPECT_FALSE(c.done());
  inner.fail(Error(ErrorCode::mismatch, "inner failed"));
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.error()->code(), ErrorCode::mismatch);

  Work d =
      Work().then([](const Work&) { throw Error(ErrorCode::invalid_argument, "hook said no"); });
  EXPECT_EQ(d.error()->code(), ErrorCode::invalid_argument);
}

// What a continuation captures is released before its Work completes: the
// reducer's continuations hold bucket memory whose allocator may be the
// engine's (Python's), and a release that came after the waiter went on ran
// on collie's thread while Python was shutting down (a std::terminate).
TEST(WorkHandle, ThenReleasesWhatItCapturedBeforeTheWaiterGoesOn) {
  std::atomic<bool> released{false};
  struct SlowRelease {
    explicit SlowRelease(std::atomic<bool>* f) : flag(f) {}
    std::atomic<bool>* flag;
    ~SlowRelease() {
      std::this_thread::sleep_for(50ms);
      flag->store(true);
    }
  };
  for (bool chained_work : {false, true}) {
    released = false;
    Work a = Work::pending("a", 5s);
    auto keep = std::make_shared<SlowRelease>(&released);
    Work b = chained_work ? a.then_work([keep](const Work&) { return Work(); })
                          : a.then([keep](const Work&) {});
    keep.reset();
    std::thread completer([&] { a.complete(); });
    b.wait();
    EXPECT_TRUE(released.load()) << (chained_work ? "then_work" : "then");
    completer.join();
  }
}

// Run spans on one row of the timeline (COLLIE_TRACE) follow each other,
// and each ends at its own op's end, even when a later op on the stream is
// recorded first (the CI failure of trace_nccl_fake_device under ASan).
TEST(TraceRow, RunSpansFollowEachOtherAndEndAtTheirOwnEnd) {
  int fd = ::open("/dev/null", O_WRONLY);
  ASSERT_GE(fd, 0);
  trace::Track row(std::make_shared<trace::Sink>(fd, "/dev/null", 0, 1), 1);
  EXPECT_EQ(row.serial_start(100, 300), 100);
  EXPECT_EQ(row.serial_start(150, 400), 300);  // queued behind: starts when that ended
  // Ended at 250, recorded after the op that ended at 400: ends at 250.
  const trace::Nanos late = row.serial_start(120, 250);
  EXPECT_EQ(late, 250);
  EXPECT_EQ(row.serial_start(500, 600), 500);
}

}  // namespace
}  // namespace collie

// shrink's check that the survivors completed the same collectives: silent
// when they did, else every group named with its last collective, the most
// advanced first.
TEST(Shrink, SurvivorsThatCompletedDifferentCollectivesAreNamed) {
  using collie::survivors_disagree;
  EXPECT_EQ(survivors_disagree({}), "");
  EXPECT_EQ(survivors_disagree({{0, 12}}), "");
  EXPECT_EQ(survivors_disagree({{0, 12}, {1, 12}, {2, 12}}), "");
  EXPECT_EQ(survivors_disagree({{0, 11}, {1, 11}, {2, 12}}),
            "rank 2 completed up to #12; ranks 0, 1 up to #11");
  EXPECT_EQ(survivors_disagree({{0, 5}, {2, 7}, {3, 6}}),
            "rank 2 completed up to #7; rank 3 up to #6; rank 0 up to #5");
}

namespace collie {
namespace {

// The one "same collective?" check and its error (base/op.h), which tcp,
// shm and mpi all report through: every field tells two collectives
// apart, and the message names both calls and both ranks.
TEST(OpDesc, SameCollectiveComparesEveryFieldAndTheMismatchNamesBothCalls) {
  const OpDesc mine{OpKind::allreduce, DType::f32, ReduceOp::sum, 7, 0, 1000};
  EXPECT_TRUE(same_collective(mine, mine));
  std::vector<OpDesc> others(6, mine);
  others[0].op = OpKind::allgather;
  others[1].dtype = DType::f64;
  others[2].redop = ReduceOp::max;
  others[3].seq = 8;
  others[4].tag = 1;
  others[5].count = 999;
  for (const OpDesc& o : others) EXPECT_FALSE(same_collective(mine, o)) << o.describe();
  const Error e = collective_mismatch(mine.describe() + " on rank 0", "rank 2", others[5]);
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  const std::string m = e.what();
  EXPECT_NE(m.find("allreduce #7 (f32 x 1000, sum) on rank 0 does not match rank 2, which called "
                   "allreduce #7 (f32 x 999, sum)"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace collie
