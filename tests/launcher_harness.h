// tests/launcher_harness.h: collie-run as users run it, for the launcher's
// tests (tests/test_launcher*.cc): a real subprocess with its output and
// exit status captured, ranks that are small shell programs, and a folder
// of the test's own ($T) for the files by which ranks say they are ready.
// COLLIE_RUN names the binary; without it the tests skip.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace launcher_test {

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// COLLIE_RUN, or "".
std::string launcher();

// The launcher's parent leaks this descriptor to it (many test runners and
// shells do); ranks must not see it.
inline constexpr int kLeakedFd = 9;

// Runs collie-run with `args` and the extra `env` ("K=V"); `while_running`
// gets the launcher's pid while its output is being collected.
Result run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
           const std::function<void(pid_t)>& while_running = nullptr);

std::vector<std::string> lines(const std::string& s);

// Polls `cond` every 10 ms for up to 20 s; a bound on waiting, not a timing assertion.
bool eventually(const std::function<bool()>& cond);

bool contains(const std::string& haystack, const std::string& needle);

// A port free on this host now (the kernel's pick, given back at once).
int free_port();

// The part of stderr from collie-run's failure summary on.
std::string summary(const std::string& err);

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launcher().empty()) GTEST_SKIP() << "COLLIE_RUN is not set";
    dir_ = std::filesystem::temp_directory_path() /
           ("collie-launcher-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // Ranks find it as $T; the launcher passes the environment on.
    setenv("T", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    unsetenv("T");
  }
  // Ranks touch $T/ready.$RANK once they are ready for what the test does next.
  bool all_ready(int n) const {
    for (int r = 0; r < n; ++r)
      if (!std::filesystem::exists(dir_ / ("ready." + std::to_string(r)))) return false;
    return true;
  }
  void reset_dir() const {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::filesystem::path dir_;
};

}  // namespace launcher_test
