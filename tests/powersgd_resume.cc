// tests/powersgd_resume.cc: a checkpoint of the reducer (bucket layout,
// iteration, PowerSGD's error feedback and Q) taken at step S and loaded by
// a fresh process gives bit-identical parameters from step S+1 on.
//
//   collie-run -n 2 powersgd_resume full DIR     trains K steps, saves at S
//   collie-run -n 2 powersgd_resume resume DIR   loads at S, trains to K,
//                                                compares with `full`
// Steps 3..S are compressed before the checkpoint, so the error feedback and
// Q are non-zero then: a state that did not carry over gives other bits.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "collie/comm.h"
#include "reducer/reducer.h"

using namespace collie;

namespace {

constexpr size_t kIn = 48, kOut = 32;  // W is kOut x kIn: compressed at rank 1
constexpr int kSteps = 14, kSaveAt = 7, kBatch = 8;
const char* kHook = "powersgd:start_iter=3,seed=5";

struct Net {
  std::vector<float> w = std::vector<float>(kOut * kIn), b = std::vector<float>(kOut);
  std::vector<float> gw = std::vector<float>(kOut * kIn), gb = std::vector<float>(kOut);
};

// Least squares towards a fixed random linear map, on this rank's batch.
void backward(Net& n, int rank, int step, Reducer& red) {
  std::mt19937_64 g(1000003ull * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
  std::normal_distribution<float> nd;
  std::fill(n.gw.begin(), n.gw.end(), 0.0f);
  std::fill(n.gb.begin(), n.gb.end(), 0.0f);
  red.prepare_for_backward();
  for (int s = 0; s < kBatch; ++s) {
    float x[kIn];
    for (auto& v : x) v = nd(g);
    for (size_t o = 0; o < kOut; ++o) {
      float out = n.b[o], target = std::sin(0.3f * static_cast<float>(o)) * x[o % kIn];
      for (size_t i = 0; i < kIn; ++i) out += n.w[o * kIn + i] * x[i];
      float d = (out - target) / kBatch;
      n.gb[o] += d;
      for (size_t i = 0; i < kIn; ++i) n.gw[o * kIn + i] += d * x[i];
    }
  }
  red.mark_grad_ready(1);
  red.mark_grad_ready(0);
  red.finalize_backward();
  for (size_t i = 0; i < n.w.size(); ++i) n.w[i] -= 0.05f * n.gw[i];
  for (size_t i = 0; i < n.b.size(); ++i) n.b[i] -= 0.05f * n.gb[i];
}

std::unique_ptr<Reducer> make_reducer(Communicator& c, Net& n) {
  ReducerOptions opt;
  opt.comm_hook = kHook;
  return std::make_unique<Reducer>(
      c,
      std::vector<Parameter>{
          {view_of(n.w.data(), n.w.size()), view_of(n.gw.data(), n.gw.size()), kOut},
          {view_of(n.b.data(), n.b.size()), view_of(n.gb.data(), n.gb.size()), 0}},
      opt);
}

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}
std::vector<uint8_t> read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(f), {}};
}
std::vector<uint8_t> params_bytes(const Net& n) {
  std::vector<uint8_t> out((n.w.size() + n.b.size()) * 4);
  std::memcpy(out.data(), n.w.data(), n.w.size() * 4);
  std::memcpy(out.data() + n.w.size() * 4, n.b.data(), n.b.size() * 4);
  return out;
}
void load_params(Net& n, const std::vector<uint8_t>& in) {
  if (in.size() != (n.w.size() + n.b.size()) * 4)
    throw std::runtime_error("checkpoint has the wrong size");
  std::memcpy(n.w.data(), in.data(), n.w.size() * 4);
  std::memcpy(n.b.data(), in.data() + n.w.size() * 4, n.b.size() * 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: powersgd_resume full|resume DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  auto comm = connect();
  const int rank = comm->rank();
  const std::string me = "." + std::to_string(rank);
  try {
    Net n;
    std::mt19937 g(3);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    for (auto& v : n.w) v = nd(g);
    if (mode == "full") {
      auto red = make_reducer(*comm, n);
      for (int step = 0; step < kSteps; ++step) {
        backward(n, rank, step, *red);
        if (step + 1 == kSaveAt) {
          write(dir + "/params" + me, params_bytes(n));
          write(dir + "/reducer" + me, red->save_state());
        }
      }
      write(dir + "/final" + me, params_bytes(n));
      return 0;
    }
    if (mode != "resume") throw std::runtime_error("unknown mode " + mode);
    const auto want = read(dir + "/final" + me);
    load_params(n, read(dir + "/params" + me));
    auto red = make_reducer(*comm, n);
    red->load_state(read(dir + "/reducer" + me));
    for (int step = kSaveAt; step < kSteps; ++step) backward(n, rank, step, *red);
    if (params_bytes(n) != want) {
      std::fprintf(stderr,
                   "rank %d: resumed from step %d with the reducer's state, the parameters "
                   "differ from the uninterrupted run's\n",
                   rank, kSaveAt);
      return 1;
    }
    std::printf("rank %d: resumed run bit-identical from step %d to %d\n", rank, kSaveAt + 1,
                kSteps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}
