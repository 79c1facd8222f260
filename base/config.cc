// base/config.cc: the launch settings from the environment (rank, world
// size, rendezvous, secret, job identity, timeout), in the order
// base/config.h gives, and collie's other process-wide settings;
// base/tuning.cc reads the backends' tunings.
#include "base/config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include "base/config_parse.h"

namespace collie::config {

Env process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

namespace {

using detail::bad;
using detail::kMaxRanks;
using detail::parse_double;
using detail::parse_int;

// One launcher's names for the same four integers and the rendezvous.
struct Source {
  const char* label;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
  const char* addr;
  const char* port;
};

constexpr Source kSources[] = {
    {"collie", "COLLIE_RANK", "COLLIE_WORLD_SIZE", "COLLIE_LOCAL_RANK", "COLLIE_LOCAL_WORLD_SIZE",
     "COLLIE_MASTER_ADDR", "COLLIE_MASTER_PORT"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
     "MASTER_PORT"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, nullptr},
    {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, nullptr, nullptr},
};

// The first source (in order) that defines `field`, with its variable name.
template <typename Field>
std::optional<std::pair<long long, std::string>> first_int(const Env& env, Field field) {
  for (const Source& s : kSources) {
    const char* name = s.*field;
    if (!name) continue;
    if (auto v = parse_int(name, env(name))) return std::make_pair(*v, std::string(name));
  }
  return std::nullopt;
}

// A port both sides can compute when mpirun/srun give no MASTER_PORT: derived
// from the job id, so that two jobs on one host are unlikely to collide, and
// below Linux's ephemeral ports (32768 up), where any connection's local
// port could already hold it (seen in CI: "port 36304 is already in use"
// under mpirun). 20000 + the job id's hash mod kJobPorts.
constexpr unsigned long long kJobPorts = 32768 - 20000;

int port_from(std::string_view id) {
  unsigned long long h = 1469598103934665603ull;
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return 20000 + static_cast<int>(h % kJobPorts);
}

std::optional<int> port_from_job_id(const Env& env) {
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_JOBID"})
    if (const char* v = env(name); v && *v) return port_from(v);
  return std::nullopt;
}

}  // namespace

std::optional<LauncherStore> launcher_store(const Env& env) {
  const char* on = env("COLLIE_LAUNCHER_STORE");
  const char* addr = env("COLLIE_MASTER_ADDR");
  const auto port = parse_int("COLLIE_MASTER_PORT", env("COLLIE_MASTER_PORT"));
  const auto world = parse_int("COLLIE_WORLD_SIZE", env("COLLIE_WORLD_SIZE"));
  if (!on || std::string_view(on) != "1" || !addr || !*addr || !port || *port < 1 ||
      *port > 65535 || !world || *world < 1 || *world > kMaxRanks)
    return std::nullopt;
  LauncherStore s;
  s.addr = addr;
  s.port = static_cast<int>(*port);
  if (const char* v = env("COLLIE_JOB_SECRET")) s.secret = v;
  s.job = job_identity(env, static_cast<int>(*world));
  if (const char* v = env("COLLIE_STORE_PREFIX")) s.prefix = v;
  return s;
}

// What tells this job apart from another that reaches the same store or
// mesh: the launcher's job id where it gives one (COLLIE_JOB_ID, torchrun's
// run id, Open MPI's and SLURM's job ids), and always the world size. Sent
// in clear and compared before the secret, so that a rank of another job is
// told "another job" rather than "wrong secret", and refused even when
// neither job set a secret.
std::string job_identity(const Env& env, int world_size) {
  std::string id;
  for (const char* name :
       {"COLLIE_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"})
    if (const char* v = env(name); v && *v) {
      id = std::string(name) + "=" + std::string(v).substr(0, 200);
      if (std::string_view(name) == "SLURM_JOB_ID")
        if (const char* step = env("SLURM_STEP_ID"); step && *step)
          id += "." + std::string(step).substr(0, 32);
      id += ", ";
      break;
    }
  return id + std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks");
}

// COLLIE_TIMEOUT, when set.
static std::optional<std::chrono::milliseconds> timeout(const Env& env) {
  auto t = parse_double("COLLIE_TIMEOUT", env("COLLIE_TIMEOUT"));
  if (!t) return std::nullopt;
  // At least a millisecond, which is the unit it is kept in (less would
  // round to no deadline at all), and at most 1e9 seconds (about 31 years):
  // deadlines are now + twice the timeout on a nanosecond clock, which a
  // larger one would overflow.
  if (!(*t >= 0.001 && *t <= 1e9))
    throw bad("COLLIE_TIMEOUT=" + std::string(env("COLLIE_TIMEOUT")) +
              " is not a number of seconds from 0.001 to 1e9");
  return std::chrono::milliseconds(static_cast<long long>(*t * 1000.0 + 0.5));
}

Launch resolve_launch(const Options& o, const Env& env) {
  Launch l;
  auto rank = first_int(env, &Source::rank);
  auto world = first_int(env, &Source::world);
  std::string rank_name = o.rank >= 0 ? "Options::rank" : rank ? rank->second : "RANK";
  std::string world_name = o.world_size >= 0 ? "Options::world_size"
                           : world           ? world->second
                                             : "WORLD_SIZE";

  // Compared as the numbers written, and only then narrowed to int: a
  // RANK of 4294967296 must be refused, not read as rank 0.
  const long long rank_v = o.rank >= 0 ? o.rank : rank ? rank->first : 0;
  const long long world_v = o.world_size >= 0 ? o.world_size : world ? world->first : 1;

  bool have_rank = o.rank >= 0 || rank;
  bool have_world = o.world_size >= 0 || world;
  if (have_rank && !have_world)
    throw bad(rank_name +
              " is set but no world size is: set WORLD_SIZE (or COLLIE_WORLD_SIZE) "
              "to the number of ranks");
  if (have_world && !have_rank)
    throw bad(world_name + " is set but no rank is: set RANK (or COLLIE_RANK) to 0 .. " +
              world_name + "-1");
  if (world && o.world_size < 0 && (world->first < 1 || world->first > kMaxRanks))
    throw bad(world->second + "=" + std::to_string(world->first) +
              " is not a valid world size; it must be 1 to " + std::to_string(kMaxRanks));
  if (world_v < 1) throw bad(world_name + " must be at least 1");
  if (rank_v < 0 || rank_v >= world_v)
    throw bad(rank_name + "=" + std::to_string(rank_v) + " is not below " + world_name + "=" +
              std::to_string(world_v) + ": ranks count from 0 to " + std::to_string(world_v - 1));
  l.rank = static_cast<int>(rank_v);
  l.world_size = static_cast<int>(world_v);
  l.source = o.rank >= 0 ? "options"
             : rank      ? rank->second.substr(0, rank->second.find('_'))
                         : "none";

  auto local_rank = first_int(env, &Source::local_rank);
  auto local_world = first_int(env, &Source::local_world);
  const long long local_rank_v = o.local_rank >= 0 ? o.local_rank
                                 : local_rank      ? local_rank->first
                                                   : l.rank;
  const long long local_world_v = o.local_world_size >= 0 ? o.local_world_size
                                  : local_world           ? local_world->first
                                                          : l.world_size;
  if (local_world_v < 1 || local_world_v > kMaxRanks || local_rank_v < 0 ||
      local_rank_v >= local_world_v)
    throw bad("local rank " + std::to_string(local_rank_v) + " is not below the local world size " +
              std::to_string(local_world_v) + " (at most " + std::to_string(kMaxRanks) +
              "): check LOCAL_RANK / LOCAL_WORLD_SIZE");
  l.local_rank = static_cast<int>(local_rank_v);
  l.local_world_size = static_cast<int>(local_world_v);

  // Rendezvous address.
  l.master_addr = o.master_addr;
  for (const Source& s : kSources)
    if (l.master_addr.empty() && s.addr)
      if (const char* v = env(s.addr); v && *v) l.master_addr = v;
  l.master_port = o.master_port;
  for (const Source& s : kSources)
    if (l.master_port < 0 && s.port)
      if (auto v = parse_int(s.port, env(s.port))) {
        if (*v < 1 || *v > 65535)
          throw bad(std::string(s.port) + "=" + std::to_string(*v) +
                    " is not a TCP port; use a number in 1..65535");
        l.master_port = static_cast<int>(*v);
        // torchrun's agent already serves its own store on MASTER_PORT;
        // collie's rank 0 then serves on a port derived from it and the
        // run id, which every rank of every node derives alike, below the
        // ephemeral ports. Not MASTER_PORT + 1: PyTorch 2.x's agent binds
        // MASTER_PORT where the kernel says (37515, odd, as Linux's bind()
        // prefers), and the port above is then an even ephemeral port, the
        // kind connect() takes for its local end: any connection may hold it.
        const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
        if (std::string_view(s.port) == "MASTER_PORT" && agent &&
            std::string_view(agent) == "True") {
          const char* run = env("TORCHELASTIC_RUN_ID");
          const int p = port_from("torchrun " + std::to_string(*v) + " " + (run ? run : ""));
          l.master_port = p == *v ? 20000 + static_cast<int>((p - 20000 + 1) % kJobPorts) : p;
        }
      }
  if (auto fd = parse_int("COLLIE_STORE_FD", env("COLLIE_STORE_FD"))) {
    if (*fd < 0 || *fd > INT_MAX)
      throw bad("COLLIE_STORE_FD=" + std::to_string(*fd) +
                " is not a file descriptor (collie-run sets it for rank 0; unset it)");
    l.store_fd = static_cast<int>(*fd);
  }
  if (const char* v = env("COLLIE_LAUNCHER_STORE"); v && std::string_view(v) == "1")
    l.launcher_store = true;
  if (o.deterministic >= 0) {
    l.deterministic = o.deterministic != 0;
  } else if (auto v = parse_int("COLLIE_DETERMINISTIC", env("COLLIE_DETERMINISTIC"))) {
    if (*v != 0 && *v != 1)
      throw bad("COLLIE_DETERMINISTIC=" + std::to_string(*v) +
                " is not 0 or 1 (1: sums in rank order, the same bits on every backend)");
    l.deterministic = *v == 1;
  }
  if (auto v = parse_int("COLLIE_ARRIVALS", env("COLLIE_ARRIVALS"))) {
    if (*v != 0 && *v != 1)
      throw bad("COLLIE_ARRIVALS=" + std::to_string(*v) +
                " is not 0 or 1 (1, the default: each collective is timed, to name the rank "
                "that arrives last)");
    l.arrivals = *v == 1;
  }
  if (auto v = parse_int("COLLIE_JOIN", env("COLLIE_JOIN"))) {
    if (*v != 0 && *v != 1)
      throw bad("COLLIE_JOIN=" + std::to_string(*v) +
                " is not 0 or 1 (1: this process joins a running job, as a rank that "
                "collie-run --elastic restarted)");
    l.join = *v == 1;
  }
  if (const char* v = env("COLLIE_SPARE"); v && *v) {
    if (!l.join)
      throw bad(std::string("COLLIE_SPARE=") + v +
                " is set without COLLIE_JOIN=1: a spare is a process that joins a running job "
                "(collie-run --elastic --spares sets both)");
    l.spare = v;
  }
  if (const char* v = env("COLLIE_STORE_PREFIX"); v && *v) l.store_prefix = v;
  if (const char* f = env("COLLIE_STORE_FILE"); f && *f) l.store_file = f;
  if (l.world_size > 1 && !o.store && l.store_file.empty()) {
    if (l.master_addr.empty()) {
      if (l.local_world_size == l.world_size)
        l.master_addr = "127.0.0.1";
      else
        l.no_rendezvous =
            "no rendezvous address: set MASTER_ADDR to rank 0's host name or address "
            "(the ranks span several hosts)";
    }
    if (l.master_port < 0) {
      if (auto p = port_from_job_id(env))
        l.master_port = *p;
      else if (l.store_fd < 0 && l.no_rendezvous.empty())
        l.no_rendezvous =
            "no rendezvous port: set MASTER_PORT (e.g. MASTER_PORT=29500), or launch with "
            "collie-run, which picks a free one";
    }
  }

  l.secret = o.secret;
  if (l.secret.empty())
    if (const char* v = env("COLLIE_JOB_SECRET")) l.secret = v;
  l.job = job_identity(env, l.world_size);

  if (o.timeout.count() > 0)
    l.timeout = o.timeout;
  else if (auto t = timeout(env))
    l.timeout = *t;
  return l;
}

std::string backend(const Options& o, const Env& env) {
  if (o.backend != "auto" && !o.backend.empty()) return o.backend;
  if (const char* v = env("COLLIE_BACKEND"); v && *v) return v;
  return "auto";
}

int reducer_log_every(const Env& env) {
  auto v = parse_int("COLLIE_REDUCER_LOG_EVERY", env("COLLIE_REDUCER_LOG_EVERY"));
  if (!v) return 100;
  if (*v < 1 || *v > INT_MAX)
    throw bad("COLLIE_REDUCER_LOG_EVERY=" + std::to_string(*v) + " is not 1 to 2147483647");
  return static_cast<int>(*v);
}

std::string comm_hook(const Env& env) {
  const char* v = env("COLLIE_COMM_HOOK");
  return v ? v : "";
}

uint64_t check_replicas(const Env& env) {
  auto v = parse_int("COLLIE_CHECK_REPLICAS", env("COLLIE_CHECK_REPLICAS"));
  if (!v) return 0;
  if (*v < 0)
    throw bad("COLLIE_CHECK_REPLICAS=" + std::to_string(*v) +
              " is negative; set it to how many iterations apart the replicas are checked (0: "
              "never)");
  return static_cast<uint64_t>(*v);
}

bool check_nonfinite(const Env& env) {
  auto v = parse_int("COLLIE_CHECK_NONFINITE", env("COLLIE_CHECK_NONFINITE"));
  if (!v) return false;
  if (*v != 0 && *v != 1)
    throw bad("COLLIE_CHECK_NONFINITE=" + std::to_string(*v) + " is not 0 or 1");
  return *v == 1;
}

bool checks_warn(const Env& env) {
  const char* v = env("COLLIE_CHECK_ACTION");
  if (!v || !*v || std::string_view(v) == "error") return false;
  if (std::string_view(v) == "warn") return true;
  throw bad(std::string("COLLIE_CHECK_ACTION='") + v + "' is not error or warn");
}

std::string hostname_override(const Env& env) {
  const char* v = env("COLLIE_HOSTNAME");
  return v ? v : "";
}

std::string bind(const Env& env) {
  const char* v = env("COLLIE_BIND");
  std::string s = v && *v ? v : "none";
  if (s != "none" && s != "core" && s != "numa")
    throw bad("COLLIE_BIND='" + s + "' is not one of none, core, numa");
  return s;
}

std::string trace(const Env& env) {
  const char* v = env("COLLIE_TRACE");
  return v ? v : "";
}

int log_level(const Env& env) {
  const char* v = env("COLLIE_DEBUG");
  if (!v) return 0;
  std::string s(v);
  if (s == "INFO" || s == "info") return 1;
  if (s == "DEBUG" || s == "debug" || s == "TRACE") return 2;
  return 0;
}

LauncherSettings launcher_settings(const Env& env) {
  LauncherSettings l;
  if (auto g = parse_int("COLLIE_RUN_GRACE", env("COLLIE_RUN_GRACE"))) {
    if (*g < 0 || *g > 86400)
      throw bad("COLLIE_RUN_GRACE=" + std::to_string(*g) +
                " is not a number of seconds in 0..86400 (the time ranks get between SIGTERM "
                "and SIGKILL)");
    l.grace_seconds = static_cast<int>(*g);
  }
  if (const char* v = env("COLLIE_JOB_SECRET")) l.job_secret = v;
  auto set = [&](const char* name) {
    const char* v = env(name);
    return v && *v;
  };
  l.thread_count_set = set("OMP_NUM_THREADS") || set("OPENBLAS_NUM_THREADS");
  if (auto t = timeout(env)) l.timeout = *t;
  return l;
}

FakeInjection fake_injection(const Env& env) {
  FakeInjection f;
  if (auto v = parse_int("COLLIE_FAKE_SHUFFLE", env("COLLIE_FAKE_SHUFFLE"))) {
    if (*v < 0) throw bad("COLLIE_FAKE_SHUFFLE must be a seed >= 0 (0: completions in order)");
    f.shuffle_seed = static_cast<uint64_t>(*v);
  }
  if (const char* v = env("COLLIE_FAKE_VANISH"); v && *v) {
    const std::string s(v);
    const size_t colon = s.find(':');
    const auto usage = [&] {
      return bad("COLLIE_FAKE_VANISH='" + s +
                 "' is not RANK:POSTS (the rank that vanishes, and at which of its posted "
                 "messages, from 1)");
    };
    if (colon == std::string::npos) throw usage();
    std::optional<long long> rank, posts;
    try {
      rank = parse_int("COLLIE_FAKE_VANISH", s.substr(0, colon).c_str());
      posts = parse_int("COLLIE_FAKE_VANISH", s.substr(colon + 1).c_str());
    } catch (const Error&) {
      throw usage();
    }
    if (!rank || !posts || *rank < 0 || *rank >= kMaxRanks || *posts < 1) throw usage();
    f.vanish_rank = static_cast<int>(*rank);
    f.vanish_after_posts = static_cast<size_t>(*posts);
  }
  return f;
}

}  // namespace collie::config
