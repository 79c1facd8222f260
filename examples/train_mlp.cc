// examples/train_mlp.cc: a small autograd engine of our own, trained with
// collie's DDP reducer.
//
//   collie-run -n 2 train_mlp [--steps 200] [--copy] [--hidden 128]
//
// A multi-layer perceptron (tanh hidden layers, linear output) with a
// hand-written backward learns to imitate a fixed random "teacher" network on
// synthetic inputs. Each rank draws its own mini-batches; backward walks the
// layers from the output down and, as soon as a layer's weight and bias
// gradients are written, tells the reducer (mark_grad_ready), which ships
// full buckets while backward goes on with the layers below. With bucket
// views (the default) backward writes gradients straight into the reducer's
// buckets: no gradient copies at all.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collie/comm.h"
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

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, hidden = 128;
  bool bucket_view = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--hidden" && i + 1 < argc)
      hidden = std::atoi(argv[++i]);
    else if (a == "--copy")
      bucket_view = false;
    else {
      std::fprintf(stderr, "usage: train_mlp [--steps N] [--hidden H] [--copy]\n");
      return 2;
    }
  }
  try {
    auto comm = collie::connect();
    const int rank = comm->rank(), n = comm->size();
    const std::vector<int> sizes{16, hidden, hidden, hidden, 4};
    const int batch = 64;  // per rank
    Mlp teacher(sizes, 2024);
    Mlp model(sizes, 7 + rank);  // different per rank: the reducer broadcasts rank 0's

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
    collie::Reducer reducer(*comm, params, opt);
    if (rank == 0)
      std::printf(
          "training a %d-%d-%d-%d-%d MLP on %d ranks x %d samples, %zu buckets, %s, "
          "comm hook %s\n",
          sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], n, batch,
          reducer.plan().buckets().size(), bucket_view ? "bucket views" : "copies",
          reducer.comm_hook().name().c_str());

    std::mt19937 data_rng(100 + rank);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    const float lr = 0.05f;
    const int L = static_cast<int>(model.layers.size());
    for (int step = 0; step <= steps; ++step) {
      std::vector<float> x(static_cast<size_t>(batch) * sizes[0]);
      for (auto& v : x) v = gauss(data_rng);
      auto target = teacher.forward(x, batch).back();
      auto acts = model.forward(x, batch);

      reducer.prepare_for_backward();
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
        auto gw = reducer.grad_view(2 * l), gb = reducer.grad_view(2 * l + 1);
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
        reducer.mark_grad_ready(2 * l);
        reducer.mark_grad_ready(2 * l + 1);
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
      reducer.finalize_backward();
      for (int l = 0; l < L; ++l) {
        auto& Ly = model.layers[l];
        const float* dw = static_cast<const float*>(reducer.grad_view(2 * l).data);
        const float* db = static_cast<const float*>(reducer.grad_view(2 * l + 1).data);
        for (size_t k = 0; k < Ly.w.size(); ++k) Ly.w[k] -= lr * dw[k];
        for (size_t k = 0; k < Ly.b.size(); ++k) Ly.b[k] -= lr * db[k];
      }
      comm->allreduce(collie::view_of(&loss, 1), collie::ReduceOp::avg).wait();
      if (rank == 0 && step % 20 == 0) {
        const auto& st = reducer.last_stats();
        std::printf("step %4d  loss %.5f  (backward %.2f ms, exposed comm %.2f ms)\n", step, loss,
                    st.backward_us / 1e3, st.exposed_us / 1e3);
      }
    }
    // Replicas must agree to the bit: compare every rank's weights with rank 0's.
    std::vector<float> flat, ref;
    for (auto& Ly : model.layers) {
      flat.insert(flat.end(), Ly.w.begin(), Ly.w.end());
      flat.insert(flat.end(), Ly.b.begin(), Ly.b.end());
    }
    ref = flat;
    comm->broadcast(collie::view_of(ref.data(), ref.size()), 0).wait();
    int64_t differs = std::memcmp(ref.data(), flat.data(), flat.size() * sizeof(float)) != 0;
    comm->allreduce(collie::view_of(&differs, 1), collie::ReduceOp::sum).wait();
    if (rank == 0)
      std::printf("replicas identical on all %d ranks: %s\n", n, differs ? "NO" : "yes");
    return differs ? 1 : 0;
  } catch (const collie::Error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
