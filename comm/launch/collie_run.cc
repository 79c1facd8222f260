// comm/launch/collie_run.cc: collie-run, the launcher.
//
//   collie-run -n N [--nnodes K --node-rank R --master-addr A --master-port P]
//              [--grace-seconds S] [--no-prefix] prog args...
//
// Starts N local ranks of a K-node job with collie's and torchrun's launch
// variables, prefixes every output line with the rank, forwards SIGINT,
// SIGTERM and SIGHUP, and when one rank fails ends the others (SIGTERM, then
// SIGKILL after the grace period) and exits with the failing rank's status.
//
// Node 0's launcher binds the store's listening socket itself (on the given
// port, or a free one) and hands the open socket to rank 0 as COLLIE_STORE_FD:
// no other process can take the port between choosing it and using it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/tcp/socket.h"

namespace {

struct Args {
  int nproc = -1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = -1;
  int grace_seconds = 5;
  bool prefix = true;
  std::vector<std::string> prog;
};

[[noreturn]] void usage_error(const std::string& msg) {
  if (!msg.empty()) std::fprintf(stderr, "collie-run: %s\n", msg.c_str());
  std::fprintf(stderr,
               "usage: collie-run -n N [--nnodes K --node-rank R --master-addr A "
               "--master-port P]\n"
               "                  [--grace-seconds S] [--no-prefix] program [args...]\n"
               "  -n N              ranks on this node\n"
               "  --nnodes K        nodes in the job (default 1)\n"
               "  --node-rank R     this node's index, 0..K-1 (default 0)\n"
               "  --master-addr A   rank 0's host (default 127.0.0.1)\n"
               "  --master-port P   rank 0's store port (default: a free port, node 0 only)\n"
               "  --grace-seconds S after a rank fails, SIGKILL the rest after S s (default 5)\n"
               "  --no-prefix       pass output through without the [rank] prefix\n");
  std::exit(2);
}

int parse_count(const std::string& flag, const char* v, int min) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE || x < min || x > 1 << 20)
    usage_error(flag + " takes a whole number >= " + std::to_string(min) + ", not '" + v + "'");
  return static_cast<int>(x);
}

Args parse(int argc, char** argv) {
  Args a;
  if (const char* g = std::getenv("COLLIE_RUN_GRACE")) a.grace_seconds = parse_count("COLLIE_RUN_GRACE", g, 0);
  int i = 1;
  for (; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") usage_error("");
    if (f == "--no-prefix") {
      a.prefix = false;
      continue;
    }
    if (f == "--") {
      ++i;
      break;
    }
    if (f.empty() || f[0] != '-') break;
    std::string value;
    auto eq = f.find('=');
    if (eq != std::string::npos) {
      value = f.substr(eq + 1);
      f = f.substr(0, eq);
    } else {
      if (i + 1 >= argc) usage_error(f + " needs a value");
      value = argv[++i];
    }
    if (f == "-n" || f == "--nproc-per-node") a.nproc = parse_count(f, value.c_str(), 1);
    else if (f == "--nnodes") a.nnodes = parse_count(f, value.c_str(), 1);
    else if (f == "--node-rank") a.node_rank = parse_count(f, value.c_str(), 0);
    else if (f == "--master-addr") a.master_addr = value;
    else if (f == "--master-port") a.master_port = parse_count(f, value.c_str(), 1);
    else if (f == "--grace-seconds") a.grace_seconds = parse_count(f, value.c_str(), 0);
    else usage_error("unknown option " + f);
  }
  for (; i < argc; ++i) a.prog.push_back(argv[i]);
  if (a.nproc < 0) usage_error("-n N is required: how many ranks to start on this node");
  if (a.prog.empty()) usage_error("no program given to run");
  if (a.node_rank >= a.nnodes)
    usage_error("--node-rank " + std::to_string(a.node_rank) + " must be below --nnodes " +
                std::to_string(a.nnodes));
  if (a.master_port > 65535) usage_error("--master-port must be in 1..65535");
  if (a.node_rank > 0 && (a.master_addr.empty() || a.master_port < 0))
    usage_error("node " + std::to_string(a.node_rank) +
                " needs --master-addr and --master-port (node 0's launcher prints them)");
  if (a.master_addr.empty()) a.master_addr = "127.0.0.1";
  return a;
}

std::string random_secret() {
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::perror("collie-run: getrandom");
      std::exit(1);
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) {
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

// Signals arrive through a pipe, so the poll loop below sees them in order
// with the children's output and exits.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  int saved = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &s, 1);
  errno = saved;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // pipe read ends (-1: closed)
  std::string out_buf, err_buf;
  std::string prefix;  // "[rank] "
  bool exited = false;
  int status = 0;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Writes the complete lines of `buf` with the rank's prefix; at EOF also the
// unfinished last line. Lines longer than 64 KiB are cut.
void emit_lines(std::string& buf, int fd, const std::string& prefix, bool eof) {
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(buf, start, nl + 1 - start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (!buf.empty() && (eof || buf.size() > 65536)) {
    out += prefix + buf + "\n";
    buf.clear();
  }
  if (!out.empty()) write_all(fd, out);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("was killed by signal ") + (name ? std::string("SIG") + name : std::to_string(WTERMSIG(status)));
  }
  return "stopped";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  const int world = a.nnodes * a.nproc;

  // Node 0 holds the store's socket from here until rank 0 has it.
  collie::net::Fd store_listener;
  int port = a.master_port;
  if (a.node_rank == 0) {
    try {
      store_listener = collie::net::listen_tcp("", port < 0 ? 0 : port, "collie-run");
    } catch (const collie::Error& e) {
      std::fprintf(stderr, "collie-run: %s\n", e.what());
      return 2;
    }
    port = collie::net::local_port(store_listener.get());
  }
  std::string secret;
  if (const char* s = std::getenv("COLLIE_JOB_SECRET"); s && *s) secret = s;
  else if (a.nnodes > 1) {
    std::fprintf(stderr, "collie-run: a job on several nodes needs one COLLIE_JOB_SECRET shared by "
                         "every node's launcher; export the same value on each\n");
    return 2;
  } else secret = random_secret();

  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("collie-run: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(a.nproc);
  for (int local = 0; local < a.nproc; ++local) {
    Rank& r = ranks[local];
    r.rank = a.node_rank * a.nproc + local;
    r.prefix.append("[").append(std::to_string(r.rank)).append("] ");
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (a.prefix && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
      std::perror("collie-run: pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("collie-run: fork");
      return 1;
    }
    if (pid == 0) {
      // Each rank leads its own process group, so that ending a rank also
      // ends whatever it started (a shell's children, say).
      setpgid(0, 0);
      signal(SIGPIPE, SIG_DFL);
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
      if (a.prefix) {
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
      }
      auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
      set("COLLIE_RANK", std::to_string(r.rank));
      set("COLLIE_WORLD_SIZE", std::to_string(world));
      set("COLLIE_LOCAL_RANK", std::to_string(local));
      set("COLLIE_LOCAL_WORLD_SIZE", std::to_string(a.nproc));
      set("COLLIE_NODE_RANK", std::to_string(a.node_rank));
      set("COLLIE_NNODES", std::to_string(a.nnodes));
      set("COLLIE_MASTER_ADDR", a.master_addr);
      set("COLLIE_MASTER_PORT", std::to_string(port));
      set("COLLIE_JOB_SECRET", secret);
      set("RANK", std::to_string(r.rank));
      set("WORLD_SIZE", std::to_string(world));
      set("LOCAL_RANK", std::to_string(local));
      set("LOCAL_WORLD_SIZE", std::to_string(a.nproc));
      set("GROUP_RANK", std::to_string(a.node_rank));
      set("MASTER_ADDR", a.master_addr);
      set("MASTER_PORT", std::to_string(port));
      unsetenv("COLLIE_STORE_FD");
      if (r.rank == 0 && store_listener.valid()) {
        collie::net::set_cloexec(store_listener.get(), false);
        set("COLLIE_STORE_FD", std::to_string(store_listener.get()));
      }
      std::vector<char*> argv_c;
      for (auto& s : a.prog) argv_c.push_back(s.data());
      argv_c.push_back(nullptr);
      execvp(argv_c[0], argv_c.data());
      std::fprintf(stderr, "collie-run: rank %d: cannot run '%s': %s\n", r.rank, argv_c[0],
                   std::strerror(errno));
      _exit(127);
    }
    r.pid = pid;
    setpgid(pid, pid);  // also here: no window in which a signal misses the group
    if (a.prefix) {
      close(out[1]);
      close(err[1]);
      r.out = out[0];
      r.err = err[0];
    }
    if (r.rank == 0) store_listener.reset();  // rank 0 has its own copy now
  }
  store_listener.reset();

  int first_failed = -1;
  int first_status = 0;
  bool terminating = false;
  collie::net::Deadline kill_at{};
  // Signals go to each rank's process group; after a rank has exited, its
  // leftover children may still hold its output pipe, so they are signalled too.
  auto signal_all = [&](int sig) {
    for (auto& r : ranks)
      if (!r.exited || r.out >= 0 || r.err >= 0) kill(-r.pid, sig);
  };
  collie::net::Deadline pipes_deadline = collie::net::Clock::time_point::max();

  for (;;) {
    // Reap whoever has exited.
    for (auto& r : ranks) {
      if (r.exited) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.exited = true;
        r.status = status;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && first_failed < 0 && !terminating) {
          first_failed = r.rank;
          first_status = status;
          std::fprintf(stderr, "collie-run: rank %d %s; stopping the other ranks\n", r.rank,
                       describe_status(status).c_str());
          terminating = true;
          signal_all(SIGTERM);
          kill_at = collie::net::deadline_after(std::chrono::seconds(a.grace_seconds));
        }
      }
    }
    bool all_exited = true, pipes_open = false;
    for (auto& r : ranks) {
      all_exited = all_exited && r.exited;
      pipes_open = pipes_open || r.out >= 0 || r.err >= 0;
    }
    if (all_exited && !pipes_open) break;
    if (all_exited && pipes_deadline == collie::net::Clock::time_point::max())
      pipes_deadline = collie::net::deadline_after(std::chrono::seconds(2));
    if (all_exited && collie::net::Clock::now() >= pipes_deadline) {
      // Every rank is gone but something they started keeps their output
      // open: end it rather than wait for it.
      signal_all(SIGKILL);
      for (auto& r : ranks) {
        for (int* fd : {&r.out, &r.err})
          if (*fd >= 0) {
            close(*fd);
            *fd = -1;
          }
      }
      break;
    }
    if (terminating && collie::net::Clock::now() >= kill_at) {
      signal_all(SIGKILL);
      kill_at = collie::net::deadline_after(std::chrono::hours(1));
    }

    std::vector<pollfd> pfds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is stdout)
    for (auto& r : ranks) {
      if (r.out >= 0) {
        pfds.push_back({r.out, POLLIN, 0});
        owners.push_back({&r, true});
      }
      if (r.err >= 0) {
        pfds.push_back({r.err, POLLIN, 0});
        owners.push_back({&r, false});
      }
    }
    // Children's exits are noticed by polling waitpid every 50 ms; their
    // output wakes the loop at once.
    int timeout_ms = 50;
    if (poll(pfds.data(), pfds.size(), timeout_ms) < 0 && errno != EINTR) {
      std::perror("collie-run: poll");
      return 1;
    }
    if (pfds[0].revents & POLLIN) {
      unsigned char sig;
      while (read(g_signal_pipe[0], &sig, 1) == 1) {
        if (!terminating) {
          terminating = true;
          kill_at = collie::net::deadline_after(std::chrono::seconds(a.grace_seconds));
        }
        signal_all(sig);
      }
    }
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = *owners[i - 1].first;
      bool is_out = owners[i - 1].second;
      int& fd = is_out ? r.out : r.err;
      std::string& buf = is_out ? r.out_buf : r.err_buf;
      char chunk[65536];
      ssize_t n = read(fd, chunk, sizeof chunk);
      const std::string& prefix = r.prefix;
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
        emit_lines(buf, is_out ? STDOUT_FILENO : STDERR_FILENO, prefix, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit_lines(buf, is_out ? STDOUT_FILENO : STDERR_FILENO, prefix, true);
        close(fd);
        fd = -1;
      }
    }
  }

  if (first_failed >= 0) return exit_code_of(first_status);
  // Ended by a signal we forwarded: report the first rank that did not exit 0.
  for (auto& r : ranks)
    if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) return exit_code_of(r.status);
  return 0;
}
