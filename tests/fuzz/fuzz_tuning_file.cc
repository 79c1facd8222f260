// tests/fuzz/fuzz_tuning_file.cc: the tuning profile that COLLIE_TUNING_FILE
// names (`collie-bench --tune` writes it), as base/config.h parses it.
//
// Input: the file's contents. Contract: it is refused with an
// invalid_argument error naming the file and the line, or its settings are
// tuning variables, and the settings read through them keep the contract of
// tests/fuzz/config_checks.h (in range, the numbers written).
#include <map>
#include <sstream>
#include <string>

#include "tests/fuzz/config_checks.h"

namespace {
const char* const kTunable[] = {"COLLIE_TCP_LATENCY_US",
                                "COLLIE_TCP_GBPS",
                                "COLLIE_REDUCE_GBPS",
                                "COLLIE_TCP_CHUNK_BYTES",
                                "COLLIE_SOCKET_BUFFER",
                                "COLLIE_SPIN_US",
                                "COLLIE_SHM_CHUNK",
                                "COLLIE_SHM_SMALL",
                                "COLLIE_HIER_PIECE",
                                "COLLIE_ALLREDUCE_ALGO",
                                "COLLIE_TCP_SOCKETS",
                                "COLLIE_TCP_SOCKET_MIN_BYTES",
                                "COLLIE_TCP_SPLIT_DIRECTIONS",
                                "COLLIE_TCP_SPLIT_MIN_BYTES",
                                "COLLIE_YIELD_US"};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream file(std::string(reinterpret_cast<const char*>(data), size));
  std::map<std::string, std::string> values;
  bool ok = collie::fuzz::accepted([&] {
    try {
      values = collie::config::parse_tuning_file(file, "/fuzz/profile");
    } catch (const collie::Error& e) {
      FUZZ_CHECK(std::string(e.what()).find("/fuzz/profile:") != std::string::npos,
                 std::string("the error does not name the file and line: ") + e.what());
      throw;
    }
  });
  if (!ok) return 0;
  for (const auto& [name, value] : values) {
    bool known = false;
    for (const char* n : kTunable) known = known || name == n;
    FUZZ_CHECK(known, name + " is not a tuning variable, yet the file set it");
  }
  // The settings as tuned() hands them on (no environment over them). A
  // value is a C string there, as in an environment.
  const collie::config::Env env = collie::fuzz::env_of(values);
  collie::fuzz::check_tuning(env);
  return 0;
}
