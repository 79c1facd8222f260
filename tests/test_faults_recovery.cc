// tests/test_faults_recovery.cc: survivors that carry on after a death
// (shrink, and the reducer rebuilt on the shrunk communicator, bit for bit
// against a job that never had the dead rank), and the reducer under
// faults (models that differ across ranks, a death during PowerSGD, a hook
// that never completes). Real rank processes (tests/faults_harness.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collie/comm.h"
#include "faults_harness.h"
#include "mp_test.h"
#include "reducer/reducer.h"
#include "tiny_mlp.h"

namespace collie {
namespace {

using namespace faults;
using namespace std::chrono_literals;

// Survivors that carry on: after a rank dies, the others shrink the
// communicator to themselves and go on. Rank 3 is killed; ranks 0..2 wait
// for it briefly, agree without it, and their all-reduce sums the three.
TEST(Faults, SurvivorsShrinkTheCommunicatorAndGoOn) {
  auto out = run_ranks(
      4,
      [](int rank, Options opt) {
        auto c = connect(opt);
        float x = 1;
        // Rank 3 dies once its first all-reduce is done, which may be
        // before a survivor's is: that survivor hears of it in its first
        // (tests/survivor_probe.cc says more), the others in their second.
        bool heard = false;
        try {
          c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
        } catch (const Error& e) {
          if (rank == 3 || e.code() != ErrorCode::peer_lost) throw;
          heard = true;
        }
        if (rank == 3) raise(SIGKILL);
        if (!heard) try {
            x = 1;
            c->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
            return std::string("the all-reduce ended without rank 3");
          } catch (const Error& e) {
            if (e.code() != ErrorCode::peer_lost) throw;
          }
        auto s = c->shrink({}, 1500ms);  // finds by itself that rank 3 is gone
        std::vector<double> v{static_cast<double>(rank + 1), 0.5};
        s->allreduce(view_of(v.data(), v.size()), ReduceOp::sum).wait();
        // Shrinking a working communicator with an explicit exclusion:
        // ranks 0 and 1 go on without rank 2, which does not take part.
        std::unique_ptr<Communicator> t;
        if (rank < 2) t = s->shrink({2});
        std::string r = std::to_string(s->rank()) + "/" + std::to_string(s->size()) + " " +
                        std::to_string(static_cast<int>(v[0])) + " " + std::to_string(v[1]);
        if (t) r += " then " + std::to_string(t->rank()) + "/" + std::to_string(t->size());
        return r;
      },
      3s);
  EXPECT_TRUE(out[3].report.empty() || !out[3].ok()) << describe(out);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].ok()) << describe(out);
    // New ranks in the old order; 1 + 2 + 3 and 3 x 0.5 exactly.
    EXPECT_TRUE(contains(out[r].report, std::to_string(r) + "/3 6 1.500000")) << describe(out);
  }
  EXPECT_TRUE(contains(out[0].report, "then 0/2")) << describe(out);
  EXPECT_TRUE(contains(out[1].report, "then 1/2")) << describe(out);
}

// The reducer on a shrunk communicator: 4 ranks train a small MLP, rank 3
// dies at step kDeath, the survivors shrink, build a new reducer and finish.
// Their parameters must equal, bit for bit, those of a 3-rank job (ranks
// 0..2's data) resumed from the 4-rank job's parameters at step kDeath: the
// same arithmetic in the same order.
namespace shrink_training {
constexpr int kSteps = 12, kDeath = 5, kBatch = 8;

const testing::Dataset& data() {
  static const testing::Dataset d = testing::make_dataset(4 * kSteps * kBatch, 7);
  return d;
}

using Params = std::vector<std::vector<float>>;

// Steps [from, to) on `comm`; rank r's data at step k depends on (k, r) only.
void train(Communicator& comm, Params& p, int from, int to, int die_at = -1) {
  Params g;
  for (auto& v : p) g.emplace_back(v.size(), 0.0f);
  std::vector<Parameter> params;
  for (size_t i = 0; i < p.size(); ++i)
    params.push_back({view_of(p[i].data(), p[i].size()), view_of(g[i].data(), g[i].size()), 0});
  Reducer red(comm, params);
  std::vector<const float*> pp;
  std::vector<float*> gp;
  for (size_t i = 0; i < p.size(); ++i) {
    pp.push_back(p[i].data());
    gp.push_back(g[i].data());
  }
  for (int k = from; k < to; ++k) {
    if (k == die_at) raise(SIGKILL);
    for (auto& v : g) std::fill(v.begin(), v.end(), 0.0f);
    red.prepare_for_backward();
    testing::backward<float>(pp, gp, data(), (k * 4 + comm.rank()) * kBatch, kBatch, kBatch, true,
                             [&](size_t i) { red.mark_grad_ready(i); });
    red.finalize_backward();
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t j = 0; j < p[i].size(); ++j) p[i][j] -= 0.1f * g[i][j];
  }
}

std::string bytes_of(const Params& p) {
  std::string s;
  for (auto& v : p) s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return s;
}
std::string hex(const std::string& s) {
  static const char* h = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(h[c >> 4]);
    out.push_back(h[c & 15]);
  }
  return out;
}
}  // namespace shrink_training

TEST(Faults, SurvivorsRebuildTheReducerOnTheShrunkCommunicatorAndFinishExactly) {
  using namespace shrink_training;
  // The reference: 4 ranks to kDeath, then 3 ranks from those parameters.
  auto first = run_ranks(
      4,
      [](int, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        train(*c, p, 0, kDeath);
        return hex(bytes_of(p));
      },
      20s);
  for (auto& o : first) ASSERT_TRUE(o.ok()) << describe(first);
  const std::string at_death = first[0].report.substr(3);
  auto second = run_ranks(
      3,
      [&](int, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        size_t at = 0;
        for (auto& v : p)
          for (auto& x : v) {
            unsigned b[4];
            for (int i = 0; i < 4; ++i) std::sscanf(&at_death[2 * (at + i)], "%2x", &b[i]);
            unsigned char raw[4] = {
                static_cast<unsigned char>(b[0]), static_cast<unsigned char>(b[1]),
                static_cast<unsigned char>(b[2]), static_cast<unsigned char>(b[3])};
            std::memcpy(&x, raw, 4);
            at += 4;
          }
        train(*c, p, kDeath, kSteps);
        return hex(bytes_of(p));
      },
      20s);
  for (auto& o : second) ASSERT_TRUE(o.ok()) << describe(second);

  // The job that loses rank 3 at kDeath and carries on in the same processes.
  auto shrunk = run_ranks(
      4,
      [](int rank, Options opt) {
        auto c = connect(opt);
        Params p = testing::init_params<float>(3);
        try {
          train(*c, p, 0, kSteps, rank == 3 ? kDeath : -1);
          return std::string("finished without noticing rank 3's death");
        } catch (const Error&) {
          if (!c->error()) throw;  // not the communicator's failure
        }
        // Step kDeath failed before its update: the parameters are those of
        // step kDeath on every survivor. Go on from there without rank 3.
        auto s = c->shrink({3});
        train(*s, p, kDeath, kSteps);
        return hex(bytes_of(p));
      },
      20s);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(shrunk[r].ok()) << describe(shrunk);
    EXPECT_EQ(shrunk[r].report, second[0].report) << "rank " << r;
  }
  EXPECT_NE(second[0].report, first[0].report);  // it trained on
}

// Ranks that build the reducer over different models, or with different
// bucket sizes, are told so at construction, on every rank.
TEST(Faults, ReducerOverDifferentModelsOrBucketsIsRefusedOnEveryRank) {
  for (bool shapes : {true, false}) {
    auto out = run_ranks(
        3,
        [&](int rank, Options opt) {
          auto c = connect(opt);
          std::vector<float> a(100), ga(100), b(50), gb(50), d(30), gd(30);
          size_t nd = shapes && rank == 2 ? 29 : 30;
          ReducerOptions ro;
          // Reverse order d, b, a: d fills the 64-byte first bucket; with
          // 4096-byte buckets b and a share one, with 128-byte ones they do not.
          ro.first_bucket_bytes = 64;
          ro.bucket_bytes = !shapes && rank == 2 ? 128 : 4096;
          Reducer red(*c,
                      {{view_of(a.data(), 100), view_of(ga.data(), 100)},
                       {view_of(b.data(), 50), view_of(gb.data(), 50)},
                       {view_of(d.data(), nd), view_of(gd.data(), nd)}},
                      ro);
          return std::string("constructed");
        },
        20s);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(out[r].code(), "mismatch") << describe(out);
      EXPECT_TRUE(contains(out[r].message(), "rank 2")) << describe(out);
      EXPECT_TRUE(contains(out[r].message(), shapes ? "shapes or dtypes" : "bucket sizes"))
          << describe(out);
    }
  }
}

// A rank killed while the reducer runs PowerSGD (two chained all-reduces per
// bucket, issued from completions): every survivor's finalize reports the
// lost rank instead of hanging in the chain.
TEST(Faults, RankKilledDuringPowerSgdTrainingIsReportedByEverySurvivor) {
  if (!testing::have_powersgd()) GTEST_SKIP() << "built without BLAS: no PowerSGD";
  const int victim = 1;
  auto out = run_ranks(
      3,
      [&](int rank, Options opt) {
        auto c = connect(opt);
        const size_t rows = 256, cols = 512;
        std::vector<float> w(rows * cols), gw(rows * cols), b(rows), gb(rows);
        ReducerOptions ro;
        ro.comm_hook = "powersgd:start_iter=2";
        Reducer red(*c,
                    {{view_of(w.data(), w.size()), view_of(gw.data(), gw.size()), rows},
                     {view_of(b.data(), b.size()), view_of(gb.data(), gb.size()), 0}},
                    ro);
        if (rank == victim) {
          std::thread([] {
            std::this_thread::sleep_for(300ms);
            raise(SIGKILL);
          }).detach();
        }
        for (int it = 0; it < 1000000; ++it) {
          for (size_t i = 0; i < gw.size(); ++i) gw[i] = static_cast<float>((i + it) % 7);
          red.prepare_for_backward();
          red.mark_grad_ready(1);
          red.mark_grad_ready(0);
          red.finalize_backward();
        }
        return std::string("finished without noticing");
      },
      10s);
  EXPECT_FALSE(out[victim].exited) << describe(out);
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "peer_lost") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "rank " + std::to_string(victim))) << describe(out);
  }
}

// A hook that never completes: finalize fails at the deadline, naming what
// it waited for, on every rank; nothing hangs (the reducer's destructor
// gives up on it too).
class NeverCompletes final : public CommHook {
 public:
  std::string name() const override { return "never_completes"; }
  Work run(Communicator& c, GradBucket& b) override {
    return Work::pending("never_completes on bucket " + std::to_string(b.index) + " (rank " +
                             std::to_string(c.rank()) + ")",
                         c.timeout() * 2);
  }
};

TEST(Faults, AHookThatNeverCompletesTimesOutNamingIt) {
  auto out = run_ranks(
      2,
      [&](int, Options opt) {
        auto c = connect(opt);
        std::vector<float> w(64), gw(64);
        ReducerOptions ro;
        ro.hook = std::make_shared<NeverCompletes>();
        Reducer red(*c, {{view_of(w.data(), w.size()), view_of(gw.data(), gw.size())}}, ro);
        red.prepare_for_backward();
        red.mark_grad_ready(0);
        red.finalize_backward();
        return std::string("finalize returned");
      },
      1s, {}, 30s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(out[r].hung) << describe(out);
    EXPECT_EQ(out[r].code(), "timeout") << describe(out);
    EXPECT_TRUE(contains(out[r].message(), "never_completes on bucket 0")) << describe(out);
  }
}

}  // namespace
}  // namespace collie
