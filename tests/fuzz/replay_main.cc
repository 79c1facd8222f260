// tests/fuzz/replay_main.cc: the fuzz targets without libFuzzer. Linked with
// one target (any compiler, any build), it runs every file under the given
// folders through LLVMFuzzerTestOneInput, in name order, so that the test
// suite replays each target's seeds and regression inputs on every run. A
// finding aborts (tests/fuzz/fuzz.h), and the test fails naming the input.
//
//   fuzz_replay_<name> tests/fuzz/corpus/<name> tests/fuzz/regressions/<name>
//
// A folder that does not exist holds no inputs; with no inputs at all, the
// replay fails (a corpus that went missing must not pass unnoticed).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    fs::path p(argv[i]);
    if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs to replay under");
    for (int i = 1; i < argc; ++i) std::fprintf(stderr, " %s", argv[i]);
    std::fprintf(stderr, "\n");
    return 1;
  }
  for (const auto& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      std::fprintf(stderr, "cannot read %s\n", p.c_str());
      return 1;
    }
    // Printed before the run, so that a crash names the input.
    std::fprintf(stderr, "replay %s (%zu bytes)\n", p.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("%zu inputs replayed without a finding\n", inputs.size());
  return 0;
}
