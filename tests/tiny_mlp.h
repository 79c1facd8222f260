// tests/tiny_mlp.h: a two-layer perceptron with a hand-written backward, in
// any float type: the engine the reducer tests drive (in f32, one shard per
// rank) and the serial reference they compare with (in f64, the whole batch).
//
// out = W2 relu(W1 x + b1) + b2 (+ e * x[0:O] when `use_e`), loss = mean over
// samples of |out - y|^2 / 2. Parameters, in registration order: W1, b1, W2,
// b2, e. Backward produces the output layer's gradients (b2, e, W2) first and
// reports each through `ready(i)` as it is complete, the way an autograd
// engine does.
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

namespace collie::testing {

struct MlpShape {
  static constexpr int D = 6, H = 5, O = 3;
  static constexpr size_t kSizes[5] = {H * D, H, O* H, O, O};
};

struct Dataset {
  std::vector<double> x, y;  // samples x D, samples x O
  int samples = 0;
};

inline Dataset make_dataset(int samples, unsigned seed) {
  Dataset d;
  d.samples = samples;
  std::mt19937 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  for (int s = 0; s < samples; ++s) {
    for (int i = 0; i < MlpShape::D; ++i) d.x.push_back(n(g));
    for (int o = 0; o < MlpShape::O; ++o)
      d.y.push_back(std::sin(d.x[s * MlpShape::D + o]) + 0.1 * n(g));
  }
  return d;
}

template <typename T>
std::vector<std::vector<T>> init_params(unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> n(0.0, 0.5);
  std::vector<std::vector<T>> p;
  for (size_t sz : MlpShape::kSizes) {
    std::vector<T> v(sz);
    for (auto& x : v) x = static_cast<T>(n(g));
    p.push_back(v);
  }
  return p;
}

// Adds d(loss)/d(param) over samples [first, first + count) to grads, where
// the loss is normalised by `norm` samples. Calls ready(i) as each gradient
// is complete. Returns the loss contribution.
template <typename T>
double backward(const std::vector<const T*>& p, const std::vector<T*>& grad, const Dataset& d,
                int first, int count, double norm, bool use_e,
                const std::function<void(size_t)>& ready) {
  constexpr int D = MlpShape::D, H = MlpShape::H, O = MlpShape::O;
  const T *W1 = p[0], *b1 = p[1], *W2 = p[2], *b2 = p[3], *e = p[4];
  std::vector<T> z1(static_cast<size_t>(count) * H), a1(z1.size()),
      dout(static_cast<size_t>(count) * O);
  double loss = 0;
  for (int s = 0; s < count; ++s) {
    const double* x = &d.x[(first + s) * D];
    const double* y = &d.y[(first + s) * O];
    for (int h = 0; h < H; ++h) {
      T acc = b1[h];
      for (int i = 0; i < D; ++i) acc += W1[h * D + i] * static_cast<T>(x[i]);
      z1[s * H + h] = acc;
      a1[s * H + h] = acc > 0 ? acc : T(0);
    }
    for (int o = 0; o < O; ++o) {
      T out = b2[o];
      for (int h = 0; h < H; ++h) out += W2[o * H + h] * a1[s * H + h];
      if (use_e) out += e[o] * static_cast<T>(x[o]);
      T diff = out - static_cast<T>(y[o]);
      loss += 0.5 * static_cast<double>(diff * diff) / norm;
      dout[s * O + o] = diff / static_cast<T>(norm);
    }
  }
  // Output layer first, as backward produces it.
  for (int s = 0; s < count; ++s)
    for (int o = 0; o < O; ++o) {
      T g = dout[s * O + o];
      if (use_e) grad[4][o] += g * static_cast<T>(d.x[(first + s) * D + o]);
      grad[3][o] += g;
      for (int h = 0; h < H; ++h) grad[2][o * H + h] += g * a1[s * H + h];
    }
  // Reported in an order other than reverse registration (b2 before e, W1
  // before b1), so the reducer's first-iteration rebuild really reorders.
  ready(3);
  if (use_e) ready(4);
  ready(2);
  for (int s = 0; s < count; ++s)
    for (int h = 0; h < H; ++h) {
      if (z1[s * H + h] <= 0) continue;
      T g = 0;
      for (int o = 0; o < O; ++o) g += W2[o * H + h] * dout[s * O + o];
      grad[1][h] += g;
      for (int i = 0; i < D; ++i)
        grad[0][h * D + i] += g * static_cast<T>(d.x[(first + s) * D + i]);
    }
  ready(0);
  ready(1);
  return loss;
}

// The loss of `params` on the whole of `d` (gradients computed and dropped).
template <typename T>
double full_batch_loss(const std::vector<std::vector<T>>& params, const Dataset& d, bool use_e) {
  std::vector<std::vector<double>> p64, g64;
  std::vector<const double*> pp;
  std::vector<double*> gp;
  for (auto& v : params) p64.emplace_back(v.begin(), v.end());
  for (auto& v : p64) {
    pp.push_back(v.data());
    g64.emplace_back(v.size(), 0.0);
    gp.push_back(g64.back().data());
  }
  return backward<double>(pp, gp, d, 0, d.samples, d.samples, use_e, [](size_t) {});
}

}  // namespace collie::testing
