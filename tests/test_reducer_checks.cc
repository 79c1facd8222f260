// tests/test_reducer_checks.cc: the reducer's checks (reducer/replica_check.h,
// reducer/nonfinite_check.h) over the fake backend, every rank a thread:
// one rank's parameter moved by one ulp, or a NaN or Inf put in one rank's
// gradient, and what every rank is told, against what the test did.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "collie/collie.h"
#include "fake_world.h"
#include "reducer/reducer.h"

namespace collie {
namespace {

const std::vector<std::string> kNames = {"fc1.weight", "fc1.bias", "fc2.weight"};
const std::vector<size_t> kSizes = {600, 7, 300};

std::string g9(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// What rank r's backward produces for parameter i, element k, at iteration it.
float grad_value(int r, int it, size_t i, size_t k) {
  return 0.001f * static_cast<float>((r + 1) * ((k + i + it) % 5));
}

// A three-parameter model trained with plain SGD over the reducer. `before`
// runs on this rank before each iteration's backward (it may change the
// parameters or, through `grads`, what the backward produces), and returns
// false to stop.
struct Model {
  std::vector<std::vector<float>> params, grads;
  std::unique_ptr<Reducer> red;
  int iterations = 0;  // finished

  Model(Communicator& c, ReducerOptions opt) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      params.emplace_back(kSizes[i]);
      for (size_t k = 0; k < kSizes[i]; ++k)
        params[i][k] = 0.25f + 0.01f * static_cast<float>(k % 11);
      grads.emplace_back(kSizes[i], 0.0f);
    }
    std::vector<Parameter> ps;
    for (size_t i = 0; i < params.size(); ++i)
      ps.push_back(
          {view_of(params[i].data(), params[i].size()), view_of(grads[i].data(), grads[i].size())});
    opt.param_names = kNames;
    opt.first_bucket_bytes = 1024;
    opt.bucket_bytes = 2048;
    red = std::make_unique<Reducer>(c, ps, opt);
  }

  // Where the backward writes gradient i.
  float* grad(size_t i) {
    return red->plan().buckets().empty() || !red->grad_view(i).data
               ? grads[i].data()
               : static_cast<float*>(red->grad_view(i).data);
  }

  // One iteration: gradients from grad_value (then `poison` may change
  // them), reduced, and a step. Returns the averaged gradients.
  void step(int r, const std::function<void(Model&)>& poison = {}) {
    red->prepare_for_backward();
    for (size_t i = kSizes.size(); i-- > 0;) {
      float* g = grad(i);
      for (size_t k = 0; k < kSizes[i]; ++k) g[k] = grad_value(r, iterations, i, k);
      if (poison && i == 0) poison(*this);
    }
    for (size_t i = kSizes.size(); i-- > 0;) red->mark_grad_ready(i);
    ++iterations;
    red->finalize_backward();
    for (size_t i = 0; i < params.size(); ++i) {
      const float* g = grad(i);
      for (size_t k = 0; k < kSizes[i]; ++k) params[i][k] -= 0.5f * g[k];
    }
  }
};

TEST(ReplicaCheck, OneUlpOnOneRankIsNamedOnEveryRankWithItsElementAndDifference) {
  float before = 0, after = 0;
  auto ended = run_world(4, [&](Communicator& c) -> std::string {
    ReducerOptions opt;
    opt.check_replicas = 3;  // iterations 0, 3, 6, ...
    Model m(c, opt);
    for (int it = 0; it < 9; ++it) {
      if (it == 6 && c.rank() == 2) {  // just before the check of iteration 6
        before = m.params[0][17];
        m.params[0][17] = after = std::nextafter(before, INFINITY);
      }
      try {
        m.step(c.rank());
      } catch (const Error&) {
        if (m.iterations != 6 || it != 6)
          return "failed at iteration " + std::to_string(it) + ", not at 6's check";
        throw;
      }
    }
    return "no rank was told";
  });
  const std::string want =
      "replicas disagree at iteration 6: rank 2 holds parameters that differ from those of ranks "
      "0, 1, 3; the first parameter that differs is fc1.weight (600 f32); rank 2: element 17 is " +
      g9(after) + " where rank 0's is " + g9(before) + ", largest difference " +
      g9(static_cast<double>(after) - before) + " (element 17)";
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ended[r].failures, "") << "rank " << r;
    EXPECT_EQ(ended[r].error, "mismatch: reducer on rank " + std::to_string(r) + ": " + want);
  }
}

TEST(ReplicaCheck, TwoRanksThatDifferNameEachOtherAndAWarningGoesOn) {
  for (int warns : {0, 1}) {
    auto ended = run_world(2, [&](Communicator& c) -> std::string {
      ReducerOptions opt;
      opt.check_replicas = 1;
      opt.check_warns = warns;
      Model m(c, opt);
      m.step(c.rank());
      if (c.rank() == 1) m.params[2][299] = -m.params[2][299];  // the last element of the last one
      m.step(c.rank());
      m.step(c.rank());
      return "";
    });
    if (warns) {
      expect_all_ok(ended, "warn");
      continue;
    }
    for (int r = 0; r < 2; ++r)
      EXPECT_NE(ended[r].error.find("replicas disagree at iteration 1: rank 1 holds parameters "
                                    "that differ from those of rank 0; the first parameter that "
                                    "differs is fc2.weight (300 f32); rank 1: element 299 is -"),
                std::string::npos)
          << ended[r].error;
  }
}

TEST(ReplicaCheck, ARankThatHasJoinedIsNotCompared) {
  // Uneven inputs: rank 2 has run out of data and shadows the others'
  // collectives; its parameters no longer follow theirs.
  auto ended = run_world(3, [&](Communicator& c) -> std::string {
    ReducerOptions opt;
    opt.check_replicas = 2;
    Model m(c, opt);
    for (int it = 0; it < 5; ++it) {
      if (c.rank() == 2 && it >= 1) {
        m.params[1][0] += 1.0f;
        m.red->join_step();
      } else {
        m.step(c.rank());
      }
    }
    return "";
  });
  expect_all_ok(ended, "joined rank");
}

// Builds the Model on 3 ranks with `set` choosing each rank's options, and
// expects every rank's construction to fail with `want` in its message.
void expect_named_at_construction(const std::function<void(ReducerOptions&, int)>& set,
                                  const std::string& want) {
  auto ended = run_world(3, [&](Communicator& c) -> std::string {
    ReducerOptions opt;
    set(opt, c.rank());
    Model m(c, opt);
    return "built";
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(ended[r].error.find(want), std::string::npos) << ended[r].error;
}

TEST(ReplicaCheck, RanksBuiltWithDifferentChecksAreNamedAtConstruction) {
  expect_named_at_construction(
      [](ReducerOptions& opt, int rank) {
        opt.check_replicas = rank == 1 ? 5 : 3;
        opt.check_nonfinite = 0;
      },
      "rank 1 builds its reducer with find_unused_parameters=false, static_graph=false, "
      "gradient_as_bucket_view=false, check_nonfinite=0, check_replicas=5, check_warns=0 and "
      "rank 0 with");
}

TEST(ReplicaCheck, RanksThatWouldActDifferentlyOnAFailedCheckAreNamedAtConstruction) {
  // One rank told to warn and the others to stop: at the first failed check
  // the warned rank would go on into collectives that nobody else issues.
  expect_named_at_construction(
      [](ReducerOptions& opt, int rank) {
        opt.check_replicas = 3;
        opt.check_warns = rank == 2 ? 1 : 0;
      },
      "rank 2 builds its reducer with find_unused_parameters=false, static_graph=false, "
      "gradient_as_bucket_view=false, check_nonfinite=0, check_replicas=3, check_warns=1 and "
      "rank 0 with");
}

TEST(NonfiniteCheck, ItsExchangeFollowsAHooksLateCollectivesOnEveryRank) {
  // PowerSGD issues each bucket's all-reduces from continuations, after the
  // bucket before has finished. The check's exchange once went out beside
  // them, so it took a different number on a rank that reached finalize
  // later than its peers ("allreduce #27 ... does not match rank 2, which
  // called allgather #27"). Rank 0 reaches it late every other iteration
  // (the delay only moves the odds of the race; nothing waits on it), and
  // every rank must train to the end.
  auto ended = run_world(3, [&](Communicator& c) -> std::string {
    const size_t rows = 64, cols = 64;
    std::vector<std::vector<float>> w(4, std::vector<float>(rows * cols)),
        g(4, std::vector<float>(rows * cols));
    std::vector<Parameter> ps;
    for (int i = 0; i < 4; ++i)
      ps.push_back({view_of(w[i].data(), w[i].size()), view_of(g[i].data(), g[i].size()), rows});
    ReducerOptions opt;
    opt.comm_hook = "powersgd:start_iter=2";
    opt.check_nonfinite = 1;
    opt.first_bucket_bytes = opt.bucket_bytes = rows * cols * sizeof(float);  // one each
    Reducer red(c, ps, opt);
    for (int it = 0; it < 40; ++it) {
      for (auto& v : g)
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i + it + c.rank()) % 7);
      red.prepare_for_backward();
      for (int i = 3; i >= 0; --i) red.mark_grad_ready(i);
      if (c.rank() == 0 && it % 2) std::this_thread::sleep_for(milliseconds(5));
      red.finalize_backward();
    }
    return "";
  });
  expect_all_ok(ended, "PowerSGD with the non-finite check");
}

TEST(NonfiniteCheck, TheRankParameterAndElementOfANaNOrInfAreNamedBeforeAveraging) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (bool view : {false, true}) {
    auto ended = run_world(3, [&](Communicator& c) -> std::string {
      ReducerOptions opt;
      opt.check_nonfinite = 1;
      opt.gradient_as_bucket_view = view;
      Model m(c, opt);
      const int r = c.rank();
      for (int it = 0; it < 5; ++it) {
        try {
          m.step(r, [&](Model& mm) {
            if (it != 2) return;
            if (r == 1) mm.grad(2)[5] = kNaN;
            if (r == 2) {
              mm.grad(0)[9] = -INFINITY;
              mm.grad(0)[20] = INFINITY;
              mm.grad(2)[0] = kNaN;
            }
          });
          if (it == 2) return "iteration 2 passed";
        } catch (const Error& e) {
          if (it != 2) throw;
          const std::string want =
              "invalid_argument reducer on rank " + std::to_string(r) +
              ": non-finite gradients at iteration 2, found before averaging: rank 1: parameter "
              "fc2.weight has NaN at element 5 (1 non-finite element in 1 parameter); rank 2: "
              "parameter fc1.weight has -Inf at element 9 (3 non-finite elements in 2 "
              "parameters); so their averages are NaN or Inf on every rank";
          const std::string got = std::string(to_string(e.code())) + " " + e.what();
          if (got != want) return "told:\n" + got + "\nnot:\n" + want;
          if (!std::isnan(m.grad(2)[5]) || !std::isinf(m.grad(0)[9]))
            return "the averages were changed";
        }
        if (it < 2) continue;
        // Iterations after it go on in step, with exact averages.
        for (size_t i = 0; i < kSizes.size(); ++i)
          for (size_t k = 0; k < kSizes[i]; ++k) {
            double want = 0;
            for (int q = 0; q < 3; ++q) want += grad_value(q, m.iterations - 1, i, k);
            want /= 3;
            if (it > 2 && std::abs(m.grad(i)[k] - want) > 1e-6)
              return "iteration " + std::to_string(it) + ": average " +
                     std::to_string(m.grad(i)[k]) + " not " + std::to_string(want);
          }
      }
      return "";
    });
    expect_all_ok(ended, view ? "bucket views" : "copy mode");
  }
}

TEST(NonfiniteCheck, AGradientThatArrivesTwiceIsCountedOnce) {
  // A gradient that arrives again (accumulated, or a shared weight) is
  // searched again where it now lies; its NaN was counted twice, as "2
  // non-finite elements in 2 parameters".
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (bool view : {false, true}) {
    auto ended = run_world(2, [&](Communicator& c) -> std::string {
      ReducerOptions opt;
      opt.check_nonfinite = 1;
      opt.gradient_as_bucket_view = view;
      Model m(c, opt);
      m.step(c.rank());  // the first iteration learns each gradient's arrivals
      m.red->prepare_for_backward();
      for (size_t i = 0; i < kSizes.size(); ++i)
        for (size_t k = 0; k < kSizes[i]; ++k) m.grad(i)[k] = grad_value(c.rank(), 1, i, k);
      if (c.rank() == 1) m.grad(0)[7] = kNaN;
      // fc1.weight shares its bucket with fc1.bias, which comes last: it
      // arrives again while that bucket still waits.
      m.red->mark_grad_ready(2);
      m.red->mark_grad_ready(0);
      m.red->mark_grad_ready(0);
      m.red->mark_grad_ready(1);
      try {
        m.red->finalize_backward();
      } catch (const Error& e) {
        const std::string want =
            "rank 1: parameter fc1.weight has NaN at element 7 (1 non-finite element in 1 "
            "parameter); so";
        if (std::string(e.what()).find(want) == std::string::npos)
          return std::string("told: ") + e.what();
        return "";
      }
      return "no error";
    });
    expect_all_ok(ended, view ? "bucket views" : "copy mode");
  }
}

TEST(NonfiniteCheck, AWarningLeavesTheAveragesAsTheyAreAndGoesOn) {
  auto ended = run_world(2, [&](Communicator& c) -> std::string {
    ReducerOptions opt;
    opt.check_nonfinite = 1;
    opt.check_warns = 1;
    Model m(c, opt);
    m.step(c.rank(), [&](Model& mm) {
      if (c.rank() == 0) mm.grad(1)[3] = INFINITY;
    });
    if (!std::isinf(m.grad(1)[3])) return "the average of +Inf and a number is not +Inf";
    m.step(c.rank());
    return "";
  });
  expect_all_ok(ended, "warn");
}

TEST(ReducerChecks, TheCAbiTakesThemAndReturnsTheirErrors) {
  const auto bad = run_c_world(2, "checks_c_abi", [](collie_comm* comm, int r) -> std::string {
    float w[4] = {1, 2, 3, 4}, g[4] = {0, 0, 0, 0};
    collie_tensor p{}, gt{};
    p.data = w;
    p.numel = 4;
    p.dtype = COLLIE_F32;
    gt = p;
    gt.data = g;
    const char* names[] = {"w"};
    collie_reducer_options ro;
    collie_reducer_options_init(&ro);
    ro.param_names = names;
    ro.check_replicas = 1;
    ro.check_nonfinite = 1;
    collie_reducer* red = nullptr;
    auto step = [&](float g1) {
      collie_status s = collie_reducer_prepare(red, nullptr, 1);
      if (s != COLLIE_OK) return s;
      g[1] = g1;
      collie_reducer_mark_ready(red, 0);
      return collie_reducer_finalize(red);
    };
    std::string bad;
    if (collie_reducer_create(comm, &p, &gt, 1, &ro, &red) != COLLIE_OK) {
      bad = std::string("create: ") + collie_last_error();
    } else if (step(1) != COLLIE_OK) {
      bad = std::string("a clean step: ") + collie_last_error();
    } else if (step(r == 1 ? NAN : 1) != COLLIE_ERR_INVALID_ARGUMENT ||
               std::string(collie_last_error()).find("rank 1: parameter w has NaN at element 1") ==
                   std::string::npos) {
      bad = std::string("the NaN: ") + collie_last_error();
    } else {
      if (r == 0) w[3] = 5;
      if (step(1) != COLLIE_ERR_MISMATCH ||
          std::string(collie_last_error())
                  .find("rank 1 holds parameters that differ from those of rank 0; the first "
                        "parameter that differs is w (4 f32); rank 1: element 3 is 4 where "
                        "rank 0's is 5") ==
              std::string::npos)  // a tie: the lowest rank's side is the reference
        bad = std::string("the replicas: ") + collie_last_error();
    }
    if (red) collie_reducer_destroy(red);
    return bad;
  });
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_EQ(bad[r], "") << "rank " << r;
}

}  // namespace
}  // namespace collie
