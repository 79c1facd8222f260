// tests/fuzz/fuzz_launch_env.cc: the launch variables and tuning knobs
// (base/config.cc), read from a fuzzed environment.
//
// Input: NAME=value lines, an environment as a launcher (collie-run,
// torchrun, mpirun, srun) or a user leaves it (a name without '=' is set to
// ""; a value ends at a NUL byte, as in a real environment). Every setting
// base/config.h reads is resolved from it and checked against its contract
// (tests/fuzz/config_checks.h). COLLIE_TUNING_FILE is left out: it names a
// file, whose contents fuzz_tuning_file covers.
#include <map>
#include <string>

#include "tests/fuzz/config_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  collie::fuzz::Input in(data, size);
  std::map<std::string, std::string> vars;
  while (!in.empty()) {
    std::string line = in.line();
    line = line.substr(0, line.find('\0'));
    size_t eq = line.find('=');
    std::string name = line.substr(0, eq);
    if (name.empty() || name == "COLLIE_TUNING_FILE") continue;
    vars[name] = eq == std::string::npos ? "" : line.substr(eq + 1);
  }
  const collie::config::Env env = collie::fuzz::env_of(vars);
  collie::fuzz::check_launch(env);
  collie::fuzz::check_tuning(env);
  collie::fuzz::check_other_settings(env);
  return 0;
}
