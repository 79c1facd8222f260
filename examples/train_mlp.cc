// examples/train_mlp.cc: a small autograd engine of our own, trained with
// collie's DDP reducer.
//
//   collie-run -n 2 train_mlp [--steps 200] [--copy] [--hidden 128]
//              [--checkpoint PATH [--checkpoint-every 20]] [--dump-params FILE]
//              [--log-every 20] [--step-sleep-ms MS]
//
// A multi-layer perceptron (tanh hidden layers, linear output) with a
// hand-written backward learns to imitate a fixed random "teacher" network on
// synthetic inputs. Each rank draws its own mini-batches, from a generator
// seeded with (rank, step) alone, so that a run resumed from a checkpoint
// sees the very batches an uninterrupted one would have. Backward walks the
// layers from the output down and, as soon as a layer's weight and bias
// gradients are written, tells the reducer (mark_grad_ready), which ships
// full buckets while backward goes on with the layers below. With bucket
// views (the default) backward writes gradients straight into the reducer's
// buckets: no gradient copies at all.
//
// With --checkpoint PATH, every --checkpoint-every steps rank 0 writes the
// step, the parameters and every rank's reducer state to PATH (atomically:
// examples/checkpoint.h), and a run that finds PATH resumes from it: under
// `collie-run --max-restarts N` a job whose rank died goes on from its last
// checkpoint and ends with the parameters of a run that never stopped.
// --dump-params FILE writes the final parameters (f32, w0 b0 w1 b1 ...) for
// such comparisons; rank 0 also prints their FNV-1a checksum.
//
// Under `collie-run --elastic --max-restarts N` (COLLIE_ELASTIC=1), a rank
// that dies is replaced in the running job instead: the others catch
// peer_lost, shrink and grow their communicator by the rank collie-run
// starts again (COLLIE_JOIN=1, whose connect() joins), hand it their
// reducer's state (Reducer::handoff_state) and the step, and rebuild the
// reducer, which broadcasts rank 0's parameters. Batches follow the new
// ranks, so the run still ends with the parameters of one that never
// stopped. Rank 0 prints "back at step S with W ranks epoch=..." after the
// first step done with the replacement (and "first step after resuming
// epoch=..." after a restart from a checkpoint), for the soak's timings.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collie/comm.h"
#include "examples/checkpoint.h"
#include "reducer/reducer.h"

namespace {

struct Layer {
  int in, out;
  std::vector<float> w, b;  // out x in, out
};

struct Mlp {
  std::vector<Layer> layers;

  Mlp(const std::vector<int>& sizes, unsigned seed) {
    std::mt19937 g(seed);
    for (size_t l = 0; l + 1 < sizes.size(); ++l) {
      Layer L{sizes[l], sizes[l + 1], {}, {}};
      std::normal_distribution<float> n(0.0f, 1.0f / std::sqrt(static_cast<float>(L.in)));
      L.w.resize(static_cast<size_t>(L.in) * L.out);
      L.b.assign(static_cast<size_t>(L.out), 0.0f);
      for (auto& x : L.w) x = n(g);
      layers.push_back(std::move(L));
    }
  }

  // Activations of every layer for a batch (row-major, batch x width).
  std::vector<std::vector<float>> forward(const std::vector<float>& x, int batch) const {
    std::vector<std::vector<float>> acts{x};
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      std::vector<float> y(static_cast<size_t>(batch) * L.out);
      for (int s = 0; s < batch; ++s)
        for (int o = 0; o < L.out; ++o) {
          float acc = L.b[o];
          const float* xin = &acts.back()[static_cast<size_t>(s) * L.in];
          const float* wr = &L.w[static_cast<size_t>(o) * L.in];
          for (int i = 0; i < L.in; ++i) acc += wr[i] * xin[i];
          y[static_cast<size_t>(s) * L.out + o] = l + 1 < layers.size() ? std::tanh(acc) : acc;
        }
      acts.push_back(std::move(y));
    }
    return acts;
  }
};

constexpr const char* kUsage =
    "usage: train_mlp [--steps N] [--hidden H] [--copy] [--checkpoint PATH]\n"
    "                 [--checkpoint-every K] [--dump-params FILE] [--log-every N]\n"
    "                 [--step-sleep-ms MS]\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "train_mlp: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

int parse_int(const std::string& flag, const char* v, long min, long max) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE || x < min || x > max)
    usage_error(flag + " takes a whole number in " + std::to_string(min) + ".." +
                std::to_string(max) + ", not '" + v + "'");
  return static_cast<int>(x);
}

// FNV-1a 64 of the parameters' bytes: two runs that print the same value
// ended with the same parameters, to the bit.
uint64_t checksum(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::vector<float> flatten(const Mlp& m) {
  std::vector<float> flat;
  for (const auto& Ly : m.layers) {
    flat.insert(flat.end(), Ly.w.begin(), Ly.w.end());
    flat.insert(flat.end(), Ly.b.begin(), Ly.b.end());
  }
  return flat;
}

void unflatten(Mlp& m, const std::vector<float>& flat) {
  size_t at = 0;
  for (auto& Ly : m.layers) {
    std::copy(flat.begin() + static_cast<long>(at),
              flat.begin() + static_cast<long>(at + Ly.w.size()), Ly.w.begin());
    at += Ly.w.size();
    std::copy(flat.begin() + static_cast<long>(at),
              flat.begin() + static_cast<long>(at + Ly.b.size()), Ly.b.begin());
    at += Ly.b.size();
  }
}

// The wall clock (CLOCK_REALTIME), in seconds: the soak compares it with
// the moment it killed a rank.
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, hidden = 128, checkpoint_every = 20, log_every = 20, sleep_ms = 0;
  bool bucket_view = true, every_given = false;
  std::string checkpoint, dump;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--copy") {
      bucket_view = false;
      continue;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    static const char* const kTakeValues[] = {
        "--steps",       "--hidden",    "--checkpoint",   "--checkpoint-every",
        "--dump-params", "--log-every", "--step-sleep-ms"};
    if (std::find(std::begin(kTakeValues), std::end(kTakeValues), a) == std::end(kTakeValues))
      usage_error("unknown option '" + a + "'");
    if (i + 1 >= argc) usage_error(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--steps")
      steps = parse_int(a, v, 0, 1000000000);
    else if (a == "--hidden")
      hidden = parse_int(a, v, 1, 4096);
    else if (a == "--checkpoint")
      checkpoint = v;
    else if (a == "--checkpoint-every") {
      checkpoint_every = parse_int(a, v, 1, 1000000000);
      every_given = true;
    } else if (a == "--dump-params")
      dump = v;
    else if (a == "--log-every")
      log_every = parse_int(a, v, 1, 1000000000);
    else  // --step-sleep-ms: slows a run so that a test can kill a rank mid-run
      sleep_ms = parse_int(a, v, 0, 60000);
  }
  if (every_given && checkpoint.empty())
    usage_error("--checkpoint-every needs --checkpoint PATH: where to write the checkpoints");
  int rank = -1;
  try {
    auto env_is = [](const char* name, const char* value) {
      const char* v = std::getenv(name);
      return v && std::strcmp(v, value) == 0;
    };
    const bool elastic = env_is("COLLIE_ELASTIC", "1"), joining = env_is("COLLIE_JOIN", "1");
    auto comm = collie::connect();
    rank = comm->rank();
    const int world = comm->size();
    // A joiner's model, step and reducer state come from the others.
    if (joining) checkpoint.clear();
    const std::vector<int> sizes{16, hidden, hidden, hidden, 4};
    const int batch = 64;  // per rank
    Mlp teacher(sizes, 2024);
    Mlp model(sizes, 7 + rank);  // different per rank: the reducer broadcasts rank 0's

    // A checkpoint, where there is one, replaces the initial values before
    // the reducer broadcasts rank 0's (the same on every rank then), and
    // its reducer state is loaded before the first backward.
    const std::vector<uint64_t> shape(sizes.begin(), sizes.end());
    std::optional<collie::example::Checkpoint> resume;
    if (!checkpoint.empty()) resume = collie::example::load(*comm, checkpoint, shape);
    if (resume) {
      if (resume->params.size() != flatten(model).size())
        throw std::runtime_error(
            "checkpoint " + checkpoint + " holds " + std::to_string(resume->params.size()) +
            " parameters and this model has " + std::to_string(flatten(model).size()));
      unflatten(model, resume->params);
    }

    // Parameters in registration order: w0, b0, w1, b1, ...
    std::vector<std::vector<float>> own_grads;
    std::vector<collie::Parameter> params;
    for (auto& L : model.layers) {
      own_grads.emplace_back(L.w.size());
      own_grads.emplace_back(L.b.size());
    }
    for (size_t l = 0; l < model.layers.size(); ++l) {
      auto& L = model.layers[l];
      // w is out x in: its rows let PowerSGD compress it as a matrix.
      params.push_back({collie::view_of(L.w.data(), L.w.size()),
                        collie::view_of(own_grads[2 * l].data(), L.w.size()), L.b.size()});
      params.push_back({collie::view_of(L.b.data(), L.b.size()),
                        collie::view_of(own_grads[2 * l + 1].data(), L.b.size())});
    }
    collie::ReducerOptions opt;
    opt.gradient_as_bucket_view = bucket_view;
    opt.first_bucket_bytes = 64 * 1024;  // a small model: small buckets
    opt.bucket_bytes = 256 * 1024;
    int first_step = 0;
    // The state a joiner's reducer starts from, and the step: the others'.
    collie::Bytes handed;
    if (joining) {
      handed = collie::Reducer::handoff_state(*comm, nullptr);
      int64_t s = 0;
      comm->broadcast(collie::view_of(&s, 1), 0).wait();
      first_step = static_cast<int>(s);
    }
    auto reducer = std::make_unique<collie::Reducer>(*comm, params, opt);
    if (joining) reducer->load_state(handed);
    if (resume) {
      reducer->load_state(resume->rank_states[static_cast<size_t>(rank)]);
      first_step = static_cast<int>(std::min<uint64_t>(resume->step, steps + 1u));
      if (rank == 0)
        std::printf("resuming from checkpoint %s at step %d\n", checkpoint.c_str(), first_step);
      resume.reset();
    }
    if (rank == 0)
      std::printf(
          "training a %d-%d-%d-%d-%d MLP on %d ranks x %d samples, %zu buckets, %s, "
          "comm hook %s\n",
          sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], world, batch,
          reducer->plan().buckets().size(), bucket_view ? "bucket views" : "copies",
          reducer->comm_hook().name().c_str());

    const float lr = 0.05f;
    const int L = static_cast<int>(model.layers.size());
    // Say when the first step after a resume or a replacement is done.
    const char* back = first_step > 0 ? "first step after resuming" : nullptr;
    int next = first_step;  // the step to do next: this rank's, for a recovery
    for (int step = first_step; step <= steps; ++step) try {
        // This step's batch from (rank, step) alone: the same whether the run
        // started at step 0 or resumed.
        std::seed_seq seed{100u, static_cast<unsigned>(rank), static_cast<unsigned>(step)};
        std::mt19937 data_rng(seed);
        std::normal_distribution<float> gauss(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(batch) * sizes[0]);
        for (auto& v : x) v = gauss(data_rng);
        auto target = teacher.forward(x, batch).back();
        auto acts = model.forward(x, batch);

        reducer->prepare_for_backward();
        // d loss / d output for loss = mean over the batch of |y - t|^2 / 2.
        std::vector<float> delta(acts.back().size());
        double loss = 0;
        for (size_t k = 0; k < delta.size(); ++k) {
          float d = acts.back()[k] - target[k];
          loss += 0.5 * d * d / batch;
          delta[k] = d / batch;
        }
        for (int l = L - 1; l >= 0; --l) {
          const Layer& Ly = model.layers[l];
          auto gw = reducer->grad_view(2 * l), gb = reducer->grad_view(2 * l + 1);
          auto* dw = static_cast<float*>(gw.data);
          auto* db = static_cast<float*>(gb.data);
          std::memset(dw, 0, gw.nbytes());
          std::memset(db, 0, gb.nbytes());
          const auto& xin = acts[l];
          for (int s = 0; s < batch; ++s)
            for (int o = 0; o < Ly.out; ++o) {
              float d = delta[static_cast<size_t>(s) * Ly.out + o];
              db[o] += d;
              const float* xr = &xin[static_cast<size_t>(s) * Ly.in];
              float* wr = &dw[static_cast<size_t>(o) * Ly.in];
              for (int i = 0; i < Ly.in; ++i) wr[i] += d * xr[i];
            }
          // This layer's gradients are complete: hand them to the reducer now,
          // while the layers below are still to be computed.
          reducer->mark_grad_ready(2 * l);
          reducer->mark_grad_ready(2 * l + 1);
          if (l == 0) break;
          std::vector<float> prev(static_cast<size_t>(batch) * Ly.in, 0.0f);
          for (int s = 0; s < batch; ++s)
            for (int o = 0; o < Ly.out; ++o) {
              float d = delta[static_cast<size_t>(s) * Ly.out + o];
              const float* wr = &Ly.w[static_cast<size_t>(o) * Ly.in];
              for (int i = 0; i < Ly.in; ++i) prev[static_cast<size_t>(s) * Ly.in + i] += d * wr[i];
            }
          for (size_t k = 0; k < prev.size(); ++k) prev[k] *= 1.0f - xin[k] * xin[k];  // tanh'
          delta = std::move(prev);
        }
        reducer->finalize_backward();
        for (int l = 0; l < L; ++l) {
          auto& Ly = model.layers[l];
          const float* dw = static_cast<const float*>(reducer->grad_view(2 * l).data);
          const float* db = static_cast<const float*>(reducer->grad_view(2 * l + 1).data);
          for (size_t k = 0; k < Ly.w.size(); ++k) Ly.w[k] -= lr * dw[k];
          for (size_t k = 0; k < Ly.b.size(); ++k) Ly.b[k] -= lr * db[k];
        }
        next = step + 1;
        comm->allreduce(collie::view_of(&loss, 1), collie::ReduceOp::avg).wait();
        if (back && rank == 0) {
          std::printf("%s at step %d with %d ranks epoch=%.3f\n", back, step, comm->size(),
                      wall_seconds());
          std::fflush(stdout);
        }
        back = nullptr;
        if (rank == 0 && step % log_every == 0) {
          const auto& st = reducer->last_stats();
          std::printf("step %4d  loss %.5f  (backward %.2f ms, exposed comm %.2f ms)\n", step, loss,
                      st.backward_us / 1e3, st.exposed_us / 1e3);
          std::fflush(stdout);  // a watcher (the restart test) acts on it
        }
        // After step s, s + 1 steps are done: the checkpoint resumes at s + 1.
        if (!checkpoint.empty() && (step + 1) % checkpoint_every == 0)
          collie::example::save(*comm, *reducer, static_cast<uint64_t>(step + 1), shape,
                                flatten(model), checkpoint);
        if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      } catch (const collie::Error& e) {
        if (!elastic || e.code() != collie::ErrorCode::peer_lost) throw;
        // A rank is gone, and collie-run starts it again: go on with it.
        // Rank 0's step and parameters (the new reducer broadcasts them)
        // stand for everyone, whichever collective each survivor failed in.
        if (rank == 0) std::printf("step %d: %s\n", step, e.what());
        comm = comm->shrink();
        comm = comm->grow(world - comm->size());
        collie::Bytes mine = collie::Reducer::handoff_state(*comm, reducer.get());
        int64_t s = next;
        comm->broadcast(collie::view_of(&s, 1), 0).wait();
        reducer.reset();
        reducer = std::make_unique<collie::Reducer>(*comm, params, opt);
        reducer->load_state(mine);
        rank = comm->rank();
        back = "back";
        step = static_cast<int>(s) - 1;  // the loop's ++ makes it s
      }
    // Replicas must agree to the bit: compare every rank's weights with rank 0's.
    std::vector<float> flat = flatten(model), ref = flat;
    comm->broadcast(collie::view_of(ref.data(), ref.size()), 0).wait();
    int64_t differs = std::memcmp(ref.data(), flat.data(), flat.size() * sizeof(float)) != 0;
    comm->allreduce(collie::view_of(&differs, 1), collie::ReduceOp::sum).wait();
    if (rank == 0) {
      std::printf("replicas identical on all %d ranks: %s\n", comm->size(), differs ? "NO" : "yes");
      std::printf("final parameters: %zu floats, FNV-1a %016llx\n", flat.size(),
                  static_cast<unsigned long long>(checksum(flat)));
      if (!dump.empty()) {
        std::ofstream f(dump, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(flat.data()),
                static_cast<std::streamsize>(flat.size() * sizeof(float)));
        if (!f.flush()) throw std::runtime_error("cannot write --dump-params " + dump);
      }
    }
    return differs ? 1 : 0;
  } catch (const std::exception& e) {
    // Most of collie's errors name the rank already; the others say it here.
    if (rank < 0 || std::strncmp(e.what(), "rank ", 5) == 0)
      std::fprintf(stderr, "train_mlp: %s\n", e.what());
    else
      std::fprintf(stderr, "train_mlp: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
