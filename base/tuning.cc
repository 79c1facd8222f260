// base/tuning.cc: the backends' settings from the environment (and from
// COLLIE_TUNING_FILE beneath it): tcp's cost model and sockets, shm's
// rounds, CUDA staging, mpi's checks and algorithms, hier's pieces.
// base/config.cc reads the launch settings; base/config.h declares both.
#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "base/config.h"
#include "base/config_parse.h"

namespace collie::config {

using detail::bad;
using detail::parse_bytes;
using detail::parse_double;
using detail::parse_int;

// COLLIE_SPIN_US, which both host backends read; -1 when unset (auto).
static int spin_us(const Env& env) {
  auto v = parse_int("COLLIE_SPIN_US", env("COLLIE_SPIN_US"));
  if (!v) return -1;
  if (*v < 0 || *v > 1000000)
    throw bad("COLLIE_SPIN_US=" + std::to_string(*v) +
              " is not 0 to 1000000 (microseconds of busy-polling before sleeping)");
  return static_cast<int>(*v);
}

// COLLIE_YIELD_US, for shm and tcp alike; -1 when not set.
static int yield_us(const Env& env) {
  auto v = parse_int("COLLIE_YIELD_US", env("COLLIE_YIELD_US"));
  if (!v) return -1;
  if (*v < 0 || *v > 100000)
    throw bad("COLLIE_YIELD_US=" + std::to_string(*v) +
              " is not 0 to 100000 (microseconds a waiter on a host with more ranks than CPUs "
              "hands its CPU over between looks before it sleeps; 0: sleep at once)");
  return static_cast<int>(*v);
}

std::map<std::string, std::string> parse_tuning_file(std::istream& f, const std::string& path) {
  static const char* const kNames[] = {"COLLIE_TCP_LATENCY_US",
                                       "COLLIE_TCP_GBPS",
                                       "COLLIE_REDUCE_GBPS",
                                       "COLLIE_TCP_CHUNK_BYTES",
                                       "COLLIE_SOCKET_BUFFER",
                                       "COLLIE_SPIN_US",
                                       "COLLIE_YIELD_US",
                                       "COLLIE_SHM_CHUNK",
                                       "COLLIE_SHM_SMALL",
                                       "COLLIE_HIER_PIECE",
                                       "COLLIE_ALLREDUCE_ALGO",
                                       "COLLIE_TCP_SOCKETS",
                                       "COLLIE_TCP_SOCKET_MIN_BYTES",
                                       "COLLIE_TCP_SPLIT_DIRECTIONS",
                                       "COLLIE_TCP_SPLIT_MIN_BYTES"};
  std::map<std::string, std::string> values;
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t\r"));
    s.erase(s.find_last_not_of(" \t\r") + 1);
    return s;
  };
  std::string line;
  for (int no = 1; std::getline(f, line); ++no) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    auto eq = line.find('=');
    std::string where = path + ":" + std::to_string(no);
    if (eq == std::string::npos)
      throw bad("COLLIE_TUNING_FILE " + where + ": '" + line + "' is not NAME=value");
    std::string name = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (std::find(std::begin(kNames), std::end(kNames), name) == std::end(kNames))
      throw bad("COLLIE_TUNING_FILE " + where + ": " + name +
                " is not a tuning setting (COLLIE_TCP_LATENCY_US, COLLIE_TCP_GBPS, "
                "COLLIE_REDUCE_GBPS, COLLIE_TCP_CHUNK_BYTES, ...)");
    if (name != "COLLIE_ALLREDUCE_ALGO") {
      char* end = nullptr;
      std::strtod(value.c_str(), &end);
      if (value.empty() || *end)
        throw bad("COLLIE_TUNING_FILE " + where + ": " + name + "='" + value + "' is not a number");
    }
    values[name] = value;
  }
  return values;
}

Env tuned(const Env& env) {
  const char* path = env("COLLIE_TUNING_FILE");
  if (!path || !*path) return env;
  std::ifstream f(path);
  if (!f)
    throw bad(std::string("COLLIE_TUNING_FILE='") + path +
              "' cannot be read; write one with collie-bench --tune, or unset it");
  auto values = std::make_shared<std::map<std::string, std::string>>(parse_tuning_file(f, path));
  return [env, values](const char* name) -> const char* {
    if (const char* v = env(name)) return v;
    auto it = values->find(name);
    return it == values->end() ? nullptr : it->second.c_str();
  };
}

TcpTuning tcp_tuning(const Env& raw) {
  const Env env = tuned(raw);
  TcpTuning t;
  if (const char* v = env("COLLIE_ALLREDUCE_ALGO"); v && *v) {
    std::string a(v);
    if (a != "auto" && a != "ring" && a != "rd")
      throw bad("COLLIE_ALLREDUCE_ALGO='" + a + "' is not one of auto, ring, rd");
    t.allreduce_algo = a;
  }
  auto positive = [&](const char* name, double fallback) {
    auto v = parse_double(name, env(name));
    if (!v) return fallback;
    if (*v <= 0) throw bad(std::string(name) + " must be positive");
    return *v;
  };
  t.latency_us = positive("COLLIE_TCP_LATENCY_US", t.latency_us);
  t.bandwidth_gbps = positive("COLLIE_TCP_GBPS", t.bandwidth_gbps);
  t.reduce_gbps = positive("COLLIE_REDUCE_GBPS", t.reduce_gbps);
  if (auto v = parse_bytes("COLLIE_TCP_CHUNK_BYTES", env("COLLIE_TCP_CHUNK_BYTES"))) {
    if (*v < 4096) throw bad("COLLIE_TCP_CHUNK_BYTES must be at least 4096");
    t.chunk_bytes = static_cast<size_t>(*v);
  }
  t.spin_us = spin_us(env);
  t.yield_us = yield_us(env);
  if (auto v = parse_bytes("COLLIE_SOCKET_BUFFER", env("COLLIE_SOCKET_BUFFER"))) {
    if (*v < 0 || *v > INT_MAX)
      throw bad("COLLIE_SOCKET_BUFFER=" + std::to_string(*v) +
                " is not 0 (the kernel's autotuning) to 2147483647 bytes");
    t.socket_buffer_bytes = static_cast<int>(*v);
  }
  if (auto v = parse_int("COLLIE_TCP_SOCKETS", env("COLLIE_TCP_SOCKETS"))) {
    if (*v < 1 || *v > 16) throw bad("COLLIE_TCP_SOCKETS must be 1 to 16 (connections per peer)");
    t.sockets_per_peer = static_cast<int>(*v);
  }
  if (auto v = parse_bytes("COLLIE_TCP_SOCKET_MIN_BYTES", env("COLLIE_TCP_SOCKET_MIN_BYTES"))) {
    if (*v < 4096) throw bad("COLLIE_TCP_SOCKET_MIN_BYTES must be at least 4096");
    t.lane_min_bytes = static_cast<size_t>(*v);
  }
  if (auto v = parse_int("COLLIE_TCP_SPLIT_DIRECTIONS", env("COLLIE_TCP_SPLIT_DIRECTIONS"))) {
    if (*v != 0 && *v != 1)
      throw bad(
          "COLLIE_TCP_SPLIT_DIRECTIONS must be 0 (large messages both ways on one "
          "connection) or 1 (one connection per direction)");
    t.split_directions = *v == 1;
  }
  if (auto v = parse_bytes("COLLIE_TCP_SPLIT_MIN_BYTES", env("COLLIE_TCP_SPLIT_MIN_BYTES"))) {
    if (*v < 1) throw bad("COLLIE_TCP_SPLIT_MIN_BYTES must be at least 1 byte");
    t.split_min_bytes = static_cast<size_t>(*v);
  }
  return t;
}

ShmTuning shm_tuning(const Env& raw) {
  const Env env = tuned(raw);
  ShmTuning t;
  if (auto v = parse_bytes("COLLIE_SHM_CHUNK", env("COLLIE_SHM_CHUNK"))) {
    if (*v < 4096 || *v > (64 << 20))
      throw bad("COLLIE_SHM_CHUNK must be between 4096 and 67108864 bytes");
    t.chunk_bytes = static_cast<size_t>(*v) & ~size_t{63};
    t.chunk_set = true;
  }
  if (auto v = parse_bytes("COLLIE_SHM_SMALL", env("COLLIE_SHM_SMALL"))) {
    if (*v < 0 || *v > (1 << 20)) throw bad("COLLIE_SHM_SMALL must be between 0 and 1048576 bytes");
    t.small_bytes = static_cast<size_t>(*v);
    t.small_set = true;
  }
  if (auto v = parse_int("COLLIE_SHM_CMA", env("COLLIE_SHM_CMA"))) {
    if (*v != 0 && *v != 1)
      throw bad("COLLIE_SHM_CMA must be 0 or 1 (read peers' memory directly in large collectives)");
    t.cma = *v == 1;
  }
  t.spin_us = spin_us(env);
  t.yield_us = yield_us(env);
  return t;
}

size_t shm_auto_chunk(size_t l2, int ranks) {
  if (l2 == 0) return ShmTuning{}.chunk_bytes;
  constexpr size_t lo = 64 * 1024, hi = 4 << 20, all_rounds = 32 << 20;
  size_t c = lo;
  while (c * 2 <= l2 / 2 && c * 2 <= hi) c *= 2;
  while (c > lo && c * 2 * static_cast<size_t>(std::max(ranks, 1)) > all_rounds) c /= 2;
  return c;
}

std::string cuda_route(const Env& env) {
  const char* v = env("COLLIE_CUDA_BACKEND");
  std::string r = v && *v ? v : "auto";
  if (r != "auto" && r != "nccl" && r != "staged")
    throw bad("COLLIE_CUDA_BACKEND='" + r + "': choose auto, nccl or staged");
  return r;
}

size_t cuda_chunk_bytes(const Env& env) {
  size_t bytes = 4 << 20;
  if (auto v = parse_bytes("COLLIE_CUDA_CHUNK", env("COLLIE_CUDA_CHUNK"))) {
    if (*v < 4096 || *v > (1 << 30))
      throw bad("COLLIE_CUDA_CHUNK must be between 4096 and 1073741824 bytes");
    bytes = static_cast<size_t>(*v) & ~size_t{255};
  }
  return bytes;
}

// Open MPI's verdict on oversubscription: 1, 0, or -1 when not given.
static int launcher_oversubscribed(const Env& env) {
  if (const char* v = env("OMPI_MCA_mpi_oversubscribe"); v && (*v == '0' || *v == '1') && !v[1])
    return *v - '0';
  return -1;
}

MpiSettings mpi_settings(const Env& raw) {
  const Env env = tuned(raw);
  MpiSettings m;
  m.spin_us = spin_us(env);
  if (auto v = parse_int("COLLIE_MPI_CHECK", env("COLLIE_MPI_CHECK"))) {
    if (*v < 0 || *v > 2)
      throw bad(
          "COLLIE_MPI_CHECK must be 0 (no check), 1 (shared memory on one host) or 2 "
          "(MPI messages)");
    m.check = static_cast<int>(*v);
  }
  if (auto v = parse_int("COLLIE_MPI_ALGORITHMS", env("COLLIE_MPI_ALGORITHMS"))) {
    if (*v != 0 && *v != 1) throw bad("COLLIE_MPI_ALGORITHMS must be 0 or 1");
    m.choose_algorithms = *v == 1;
  }
  if (const char* v = env("OMPI_MCA_coll_libnbc_iallreduce_algorithm"); v && *v)
    m.choose_algorithms = false;
  if (const char* v = env("OMPI_MCA_btl"); v && *v) {
    // "a,b": only those; "^a,b": all but those.
    std::string list = v;
    const bool exclude = list[0] == '^';
    bool named = false;
    std::istringstream in(exclude ? list.substr(1) : list);
    for (std::string b; std::getline(in, b, ',');)
      if (b == "vader" || b == "sm") named = true;
    m.shared_memory_btl = exclude ? !named : named;
  }
  return m;
}

bool ranks_fit_cores(int local_world_size, int usable_cpus, const Env& env) {
  const int verdict = launcher_oversubscribed(env);
  return verdict >= 0 ? verdict == 0 : local_world_size <= usable_cpus;
}

size_t hier_piece_bytes(const Env& raw, size_t unset) {
  const Env env = tuned(raw);
  auto v = parse_bytes("COLLIE_HIER_PIECE", env("COLLIE_HIER_PIECE"));
  if (!v) return unset;
  if (*v < 4096 || *v > (1LL << 30))
    throw bad("COLLIE_HIER_PIECE must be between 4096 and 1073741824 bytes");
  return static_cast<size_t>(*v);
}

}  // namespace collie::config
