// tests/fuzz/config_checks.h: every setting base/config.h reads, from a given
// environment, each checked against its contract: what fuzz_launch_env (a
// fuzzed environment) and fuzz_tuning_file (the settings of a fuzzed tuning
// file) both run.
//
// Each function either refuses the environment with an invalid_argument
// error, or returns values that a reference reading of the same variables
// agrees with: a launch variable's number is the number written (never one
// cut to another width), a setting lies in its documented range, and a
// deadline is one that the clock arithmetic can add to now.
#pragma once

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "base/config.h"
#include "tests/fuzz/fuzz.h"

namespace collie::fuzz {

// An environment from NAME=value pairs.
inline config::Env env_of(const std::map<std::string, std::string>& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

// The reference reading of an integer variable: decimal, optional leading
// blanks and sign, every character used, within long long. nullopt when
// unset or empty; `bad` set when it is not such a number.
struct RefInt {
  std::optional<long long> value;
  bool bad = false;
};
inline RefInt ref_int(const config::Env& env, const char* name) {
  const char* v = env(name);
  RefInt r;
  if (!v || !*v) return r;
  std::string s(v);
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i == s.size()) return r.bad = true, r;
  // Accumulated negatively, so that LLONG_MIN fits.
  long long x = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return r.bad = true, r;
    int d = s[i] - '0';
    if (x < (LLONG_MIN + d) / 10) return r.bad = true, r;
    x = x * 10 - d;
  }
  if (!neg && x == LLONG_MIN) return r.bad = true, r;
  r.value = neg ? x : -x;
  return r;
}

// The reference reading of a size in bytes: an integer as above, or one
// followed by K, M or G (either case; x 2^10, 2^20, 2^30), not negative,
// whose product fits in long long.
inline RefInt ref_bytes(const config::Env& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return {};
  std::string s(v);
  int shift = 0;
  switch (s.back()) {
    case 'K':
    case 'k':
      shift = 10;
      break;
    case 'M':
    case 'm':
      shift = 20;
      break;
    case 'G':
    case 'g':
      shift = 30;
      break;
    default:
      break;
  }
  if (!shift) return ref_int(env, name);
  s.pop_back();
  if (s.empty()) return RefInt{std::nullopt, true};
  RefInt r = ref_int([&s](const char*) { return s.c_str(); }, name);
  if (r.bad || !r.value || *r.value < 0 || *r.value > (LLONG_MAX >> shift))
    return RefInt{std::nullopt, true};
  r.value = *r.value << shift;
  return r;
}

// The first of `names` that is set (not empty), as resolve_launch takes them.
inline RefInt first_set(const config::Env& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    RefInt r = ref_int(env, n);
    if (r.value || r.bad) return r;
  }
  return {};
}

inline void check_launch(const config::Env& env) {
  config::Launch l;
  if (!accepted([&] { l = config::resolve_launch(Options{}, env); })) return;
  const RefInt rank =
      first_set(env, {"COLLIE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"});
  const RefInt world =
      first_set(env, {"COLLIE_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"});
  FUZZ_CHECK(!rank.bad && !world.bad, "a rank or world size that is not a number was accepted");
  FUZZ_CHECK(l.rank == rank.value.value_or(0), "rank " + std::to_string(l.rank) +
                                                   " resolved from " +
                                                   std::to_string(rank.value.value_or(0)));
  FUZZ_CHECK(l.world_size == world.value.value_or(1), "world size " + std::to_string(l.world_size) +
                                                          " resolved from " +
                                                          std::to_string(world.value.value_or(1)));
  FUZZ_CHECK(l.world_size >= 1 && l.rank >= 0 && l.rank < l.world_size, "rank out of range");
  const RefInt local = first_set(
      env, {"COLLIE_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"});
  const RefInt local_world =
      first_set(env, {"COLLIE_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"});
  FUZZ_CHECK(!local.bad && !local_world.bad, "a local rank that is not a number was accepted");
  FUZZ_CHECK(l.local_rank == local.value.value_or(l.rank),
             "local rank " + std::to_string(l.local_rank) + " resolved from " +
                 std::to_string(local.value.value_or(l.rank)));
  FUZZ_CHECK(l.local_world_size == local_world.value.value_or(l.world_size),
             "local world size " + std::to_string(l.local_world_size) + " resolved from " +
                 std::to_string(local_world.value.value_or(l.world_size)));
  FUZZ_CHECK(l.local_rank >= 0 && l.local_rank < l.local_world_size, "local rank out of range");
  FUZZ_CHECK(l.master_port == -1 || (l.master_port >= 1 && l.master_port <= 65535),
             "master port " + std::to_string(l.master_port));
  const RefInt fd = ref_int(env, "COLLIE_STORE_FD");
  FUZZ_CHECK(!fd.bad, "COLLIE_STORE_FD that is not a number was accepted");
  if (fd.value)
    FUZZ_CHECK(l.store_fd == *fd.value, "store fd " + std::to_string(l.store_fd) +
                                            " resolved from " + std::to_string(*fd.value));
  const char* launcher_store = env("COLLIE_LAUNCHER_STORE");
  FUZZ_CHECK(l.launcher_store == (launcher_store && std::string(launcher_store) == "1"),
             "COLLIE_LAUNCHER_STORE resolved otherwise than as written");
  // The secret is only ever the one given (never made up from the job id,
  // which travels in clear); the job identity always names the world size.
  const char* given = env("COLLIE_JOB_SECRET");
  FUZZ_CHECK(l.secret == (given ? given : ""), "a secret that was not given");
  const std::string size_part =
      std::to_string(l.world_size) + (l.world_size == 1 ? " rank" : " ranks");
  FUZZ_CHECK(l.job.size() >= size_part.size() &&
                 l.job.compare(l.job.size() - size_part.size(), size_part.size(), size_part) == 0,
             "job identity '" + l.job + "' does not end with the world size");
  // A deadline is now + timeout (twice it, and a second, for waits) on a
  // nanosecond clock: it must be at least a millisecond and leave room.
  FUZZ_CHECK(l.timeout.count() >= 1 && l.timeout.count() <= 1'000'000'000'000LL,
             "timeout of " + std::to_string(l.timeout.count()) + " ms");
  if (const char* t = env("COLLIE_TIMEOUT"); t && *t) {
    double s = std::strtod(t, nullptr);
    FUZZ_CHECK(
        std::fabs(static_cast<double>(l.timeout.count()) - s * 1000) <= 1,
        "COLLIE_TIMEOUT=" + std::string(t) + " gave " + std::to_string(l.timeout.count()) + " ms");
  }
}

// `got` is `name`'s value as the reference reads it (`r`) when it is set,
// else `fallback`.
inline void check_setting(const config::Env& env, const char* name, const RefInt& r, long long got,
                          long long fallback) {
  FUZZ_CHECK(!r.bad, std::string(name) + "='" + env(name) + "' was accepted");
  FUZZ_CHECK(got == r.value.value_or(fallback), std::string(name) + " gave " + std::to_string(got) +
                                                    " from " +
                                                    std::to_string(r.value.value_or(fallback)));
}
inline void check_int_setting(const config::Env& env, const char* name, long long got,
                              long long fallback) {
  check_setting(env, name, ref_int(env, name), got, fallback);
}
// The same for a size in bytes.
inline void check_bytes_setting(const config::Env& env, const char* name, long long got,
                                long long fallback) {
  check_setting(env, name, ref_bytes(env, name), got, fallback);
}

inline void check_tuning(const config::Env& env) {
  config::TcpTuning t;
  if (accepted([&] { t = config::tcp_tuning(env); })) {
    FUZZ_CHECK(t.allreduce_algo == "auto" || t.allreduce_algo == "ring" || t.allreduce_algo == "rd",
               t.allreduce_algo);
    for (double v : {t.latency_us, t.bandwidth_gbps, t.reduce_gbps})
      FUZZ_CHECK(std::isfinite(v) && v > 0, "a cost-model constant of " + std::to_string(v));
    FUZZ_CHECK(t.chunk_bytes >= 4096, "chunk of " + std::to_string(t.chunk_bytes));
    check_bytes_setting(env, "COLLIE_TCP_CHUNK_BYTES", static_cast<long long>(t.chunk_bytes),
                        512 * 1024);
    check_int_setting(env, "COLLIE_SPIN_US", t.spin_us, -1);
    check_bytes_setting(env, "COLLIE_SOCKET_BUFFER", t.socket_buffer_bytes, 0);
    FUZZ_CHECK(t.sockets_per_peer >= 1 && t.sockets_per_peer <= 16, "sockets per peer");
    FUZZ_CHECK(t.lane_min_bytes >= 4096, "lane minimum");
  }
  config::ShmTuning s;
  if (accepted([&] { s = config::shm_tuning(env); })) {
    FUZZ_CHECK(s.chunk_bytes >= 4096 && s.chunk_bytes <= (64 << 20) && s.chunk_bytes % 64 == 0,
               "shm chunk of " + std::to_string(s.chunk_bytes));
    FUZZ_CHECK(s.small_bytes <= (1 << 20), "shm small limit");
    check_int_setting(env, "COLLIE_SHM_CMA", s.cma ? 1 : 0, 1);
    check_int_setting(env, "COLLIE_SPIN_US", s.spin_us, -1);
  }
  config::MpiSettings m;
  if (accepted([&] { m = config::mpi_settings(env); })) {
    FUZZ_CHECK(m.check >= 0 && m.check <= 2, "mpi check " + std::to_string(m.check));
    check_int_setting(env, "COLLIE_SPIN_US", m.spin_us, -1);
  }
  size_t piece = 0;
  if (accepted([&] { piece = config::hier_piece_bytes(env); }))
    FUZZ_CHECK(piece >= 4096 && piece <= (size_t{1} << 30), "hier piece");
}

// Everything else base/config.h reads.
inline void check_other_settings(const config::Env& env) {
  size_t chunk = 0;
  if (accepted([&] { chunk = config::cuda_chunk_bytes(env); }))
    FUZZ_CHECK(chunk >= 4096 && chunk <= (size_t{1} << 30) && chunk % 256 == 0, "cuda chunk");
  std::string s;
  if (accepted([&] { s = config::cuda_route(env); }))
    FUZZ_CHECK(s == "auto" || s == "nccl" || s == "staged", s);
  if (accepted([&] { s = config::bind(env); }))
    FUZZ_CHECK(s == "none" || s == "core" || s == "numa", s);
  int every = 0;
  if (accepted([&] { every = config::reducer_log_every(env); })) {
    FUZZ_CHECK(every >= 1, "the reducer logs every " + std::to_string(every) + " iterations");
    check_int_setting(env, "COLLIE_REDUCER_LOG_EVERY", every, 100);
  }
  int level = config::log_level(env);
  FUZZ_CHECK(level >= 0 && level <= 2, "log level");
  config::LauncherSettings l;
  if (accepted([&] { l = config::launcher_settings(env); })) {
    FUZZ_CHECK(l.grace_seconds >= 0 && l.grace_seconds <= 86400, "grace");
    check_int_setting(env, "COLLIE_RUN_GRACE", l.grace_seconds, 5);
    // The launchers' wait for each other is bounded by the ranks' timeout.
    FUZZ_CHECK(l.timeout.count() >= 1 && l.timeout.count() <= 1'000'000'000'000LL,
               "launcher timeout of " + std::to_string(l.timeout.count()) + " ms");
  }
  (void)config::backend(Options{}, env);
  (void)config::comm_hook(env);
  (void)config::hostname_override(env);
  (void)config::ranks_fit_cores(4, 2, env);
}

}  // namespace collie::fuzz
