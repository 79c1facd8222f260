// tests/test_config.cc: base/config.h, the one reader of the environment:
// launch variables in precedence order, bad values that say what to change,
// sizes, the backends' settings, the tuning file, the launcher's settings;
// and the registry's choice of backend (comm/front/registry.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "base/config.h"
#include "base/topology.h"
#include "collie_build_config.h"
#include "comm/backend.h"
#include "fake_env.h"

namespace collie {
namespace {

using namespace std::chrono_literals;

using testing::error_of;
using testing::fake;

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
  // Under torchrun's agent store: a port every rank derives alike from the
  // agent's and the run id, below Linux's ephemeral ports (32768 up),
  // where PyTorch 2.x's agent puts MASTER_PORT and where the port above it
  // may be any connection's local end.
  auto beside_agent = [&](const char* rank, const char* port, const char* run) {
    return config::resolve_launch(none, fake({{"RANK", rank},
                                              {"WORLD_SIZE", "2"},
                                              {"MASTER_PORT", port},
                                              {"TORCHELASTIC_RUN_ID", run},
                                              {"TORCHELASTIC_USE_AGENT_STORE", "True"}}))
        .master_port;
  };
  for (const char* port : {"29500", "37515", "20000", "65535"}) {
    const int p = beside_agent("1", port, "none");
    EXPECT_GE(p, 20000) << port;
    EXPECT_LT(p, 32768) << port;
    EXPECT_NE(p, std::atoi(port)) << port;
    EXPECT_EQ(beside_agent("0", port, "none"), p) << port;  // every rank alike
  }
  std::set<int> ports;  // other jobs, other ports (their agents' ports differ)
  for (int agent = 37501; agent < 37521; agent += 2)
    ports.insert(beside_agent("0", std::to_string(agent).c_str(), "none"));
  EXPECT_EQ(ports.size(), 10u);
  EXPECT_NE(beside_agent("0", "29500", "job-a"), beside_agent("0", "29500", "job-b"));
  // Without the agent store, MASTER_PORT is collie's own.
  l = config::resolve_launch(none,
                             fake({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(l.master_port, 29500);

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
  msg = error_of([&] { config::tcp_tuning(fake({{"COLLIE_TCP_SPLIT_DIRECTIONS", "2"}})); });
  EXPECT_NE(msg.find("COLLIE_TCP_SPLIT_DIRECTIONS must be 0"), std::string::npos) << msg;
}

// One connection per direction for large TCP messages unless turned off.
TEST(Config, TcpSplitsDirectionsUnlessTurnedOff) {
  EXPECT_TRUE(config::tcp_tuning(fake({})).split_directions);
  EXPECT_TRUE(config::tcp_tuning(fake({{"COLLIE_TCP_SPLIT_DIRECTIONS", "1"}})).split_directions);
  EXPECT_FALSE(config::tcp_tuning(fake({{"COLLIE_TCP_SPLIT_DIRECTIONS", "0"}})).split_directions);
  EXPECT_EQ(config::tcp_tuning(fake({})).split_min_bytes, size_t{512} << 10);
  EXPECT_EQ(config::tcp_tuning(fake({{"COLLIE_TCP_SPLIT_MIN_BYTES", "1M"}})).split_min_bytes,
            size_t{1} << 20);
  auto msg = error_of([&] { config::tcp_tuning(fake({{"COLLIE_TCP_SPLIT_MIN_BYTES", "0"}})); });
  EXPECT_NE(msg.find("COLLIE_TCP_SPLIT_MIN_BYTES must be at least 1 byte"), std::string::npos)
      << msg;
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
  // Unset: 1 MiB, or the caller's default (hier on crowded hosts: the whole
  // message); a set value wins over either.
  EXPECT_EQ(config::hier_piece_bytes(fake({})), size_t{1} << 20);
  EXPECT_EQ(config::hier_piece_bytes(fake({}), size_t{1} << 40), size_t{1} << 40);
  EXPECT_EQ(config::hier_piece_bytes(fake({{"COLLIE_HIER_PIECE", "8K"}}), size_t{1} << 40), 8192u);
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
  // COLLIE_YIELD_US: auto (-1) unless given; 0 is allowed (sleep at once).
  EXPECT_EQ(config::shm_tuning(fake({})).yield_us, -1);
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_YIELD_US", "0"}})).yield_us, 0);
  EXPECT_EQ(config::shm_tuning(fake({{"COLLIE_YIELD_US", "250"}})).yield_us, 250);
  const auto msg = error_of([&] { config::shm_tuning(fake({{"COLLIE_YIELD_US", "-5"}})); });
  EXPECT_NE(msg.find("COLLIE_YIELD_US=-5 is not 0 to 100000"), std::string::npos) << msg;
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

// COLLIE_SPARE (collie-run --spares): a spare's id, only with COLLIE_JOIN=1.
TEST(Config, ASpareIsAJoinerWithAnId) {
  Options none;
  const auto l = config::resolve_launch(
      none,
      fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COLLIE_JOIN", "1"}, {"COLLIE_SPARE", "0.3"}}));
  EXPECT_TRUE(l.join);
  EXPECT_EQ(l.spare, "0.3");
  EXPECT_EQ(config::resolve_launch(none, fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}})).spare, "");
  const auto msg = error_of([&] {
    config::resolve_launch(none,
                           fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COLLIE_SPARE", "0.3"}}));
  });
  EXPECT_NE(msg.find("COLLIE_SPARE=0.3 is set without COLLIE_JOIN=1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace collie
