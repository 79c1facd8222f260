// comm/launch/process.cc: collie-run's process helpers (process.h).
#include "comm/launch/process.h"

#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace collie::launch {

// 128 bits as 32 hex digits. getrandom() never returns short for 16 bytes.
std::string random_secret() {
  unsigned char raw[16];
  if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw)) {
    std::perror("collie-run: getrandom");
    std::exit(1);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) s.append({kHex[c >> 4], kHex[c & 15]});
  return s;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE): keep running the job
    done += static_cast<size_t>(n);
  }
}

std::string signal_name(int sig) {
  const char* name = sigabbrev_np(sig);
  return name ? "SIG" + std::string(name) : std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "was killed by signal " + signal_name(WTERMSIG(status));
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace collie::launch
