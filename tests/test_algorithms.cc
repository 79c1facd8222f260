// tests/test_algorithms.cc: collie's collective algorithms over the
// in-process fake transport (comm/fake/fake_network.h), at every world size
// from 1 to 16, against serial float64 references; with completions reported
// out of order; with a rank that vanishes mid-collective; with ranks that
// disagree. The multi-process suites run the same algorithms over TCP.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/choose.h"
#include "fake_ranks.h"
#include "mp_common.h"

namespace collie {
namespace {

using namespace std::chrono_literals;
using testing::combine;
using testing::exact_value;
using testing::FakeNetwork;
using testing::FakeOptions;
using testing::get;
using testing::put;
using testing::RankResult;

enum class Algo { ring, rd, reduce_scatter, allgather, chain, tree, barrier, alltoall, dispatch };

const char* name(Algo a) {
  switch (a) {
    case Algo::ring:
      return "ring_allreduce";
    case Algo::rd:
      return "rd_allreduce";
    case Algo::reduce_scatter:
      return "ring_reduce_scatter";
    case Algo::allgather:
      return "ring_allgather";
    case Algo::chain:
      return "chain_broadcast";
    case Algo::tree:
      return "tree_broadcast";
    case Algo::barrier:
      return "dissemination_barrier";
    case Algo::alltoall:
      return "pairwise_alltoall";
    case Algo::dispatch:
      return "run_collective";
  }
  return "?";
}

struct Case {
  Algo algo;
  DType dtype;
  ReduceOp op;
  size_t count;
  bool in_place;
  int root;
  size_t chunk;
  uint64_t salt;
  std::string label() const {
    return std::string(name(algo)) + " " + std::string(to_string(dtype)) + " " +
           std::string(to_string(op)) + " x" + std::to_string(count) +
           (in_place ? " in place" : "") + " root " + std::to_string(root) + " chunk " +
           std::to_string(chunk);
  }
};

double want_reduced(ReduceOp op, DType t, int n, size_t i, uint64_t salt) {
  double want = exact_value(op, 0, i, salt);
  for (int q = 1; q < n; ++q) want = combine(op, want, exact_value(op, q, i, salt));
  if (op == ReduceOp::avg) want = testing::rounded(t, want / n);
  return want;
}

// Runs one case on one rank and returns what is wrong ("" if nothing).
std::string run_case(const Case& k, int r, Transport& tr, algo::Scratch& scratch) {
  const int n = tr.size();
  const size_t es = dtype_size(k.dtype);
  OpDesc desc;
  desc.dtype = k.dtype;
  desc.redop = k.op;
  desc.count = k.count;
  desc.seq = static_cast<uint32_t>(k.salt);
  // A hang detector, generous enough for the sanitizer builds (16 threads
  // on 2 cores under tsan run about 30 times slower).
  algo::Ctx c{tr, desc, k.chunk, scratch, Deadline::clock::now() + 120s};
  size_t wrong = 0;
  double first_got = 0, first_want = 0;
  auto check = [&](double got, double want) {
    if (got != want && wrong++ == 0) {
      first_got = got;
      first_want = want;
    }
  };
  switch (k.algo) {
    case Algo::ring:
    case Algo::rd:
    case Algo::dispatch: {
      desc.op = OpKind::allreduce;
      std::vector<uint8_t> in(k.count * es + 1), out(k.count * es + 1, 0xcd);
      for (size_t i = 0; i < k.count; ++i)
        put(k.dtype, in.data(), i, exact_value(k.op, r, i, k.salt));
      void* dst = k.in_place ? in.data() : out.data();
      if (k.algo == Algo::ring)
        algo::ring_allreduce(c, in.data(), dst, k.count, k.dtype, k.op);
      else if (k.algo == Algo::rd)
        algo::rd_allreduce(c, in.data(), dst, k.count, k.dtype, k.op);
      else {
        Op op;
        op.desc = desc;
        op.in = TensorView{in.data(), k.dtype, k.count, Device::cpu()};
        op.out = TensorView{dst, k.dtype, k.count, Device::cpu()};
        algo::run_collective(c, op, config::TcpTuning{});
      }
      for (size_t i = 0; i < k.count; ++i)
        check(get(k.dtype, dst, i), want_reduced(k.op, k.dtype, n, i, k.salt));
      break;
    }
    case Algo::reduce_scatter: {
      desc.op = OpKind::reduce_scatter;
      std::vector<uint8_t> in(n * k.count * es + 1), out(k.count * es + 1, 0xcd);
      for (size_t i = 0; i < n * k.count; ++i)
        put(k.dtype, in.data(), i, exact_value(k.op, r, i, k.salt));
      std::vector<uint8_t> in_copy = in;
      algo::ring_reduce_scatter(c, in.data(), out.data(), k.count, k.dtype, k.op);
      for (size_t i = 0; i < k.count; ++i)
        check(get(k.dtype, out.data(), i),
              want_reduced(k.op, k.dtype, n, static_cast<size_t>(r) * k.count + i, k.salt));
      if (in != in_copy) return k.label() + ": the input was modified";
      break;
    }
    case Algo::allgather: {
      desc.op = OpKind::allgather;
      std::vector<uint8_t> out(n * k.count * es + 1, 0xcd), mine(k.count * es + 1);
      uint8_t* in = k.in_place ? out.data() + r * k.count * es : mine.data();
      for (size_t i = 0; i < k.count; ++i) put(k.dtype, in, i, exact_value(k.op, r, i, k.salt));
      algo::ring_allgather(c, in, out.data(), k.count * es);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < k.count; ++i)
          check(get(k.dtype, out.data(), q * k.count + i),
                testing::rounded(k.dtype, exact_value(k.op, q, i, k.salt)));
      break;
    }
    case Algo::chain:
    case Algo::tree: {
      desc.op = OpKind::broadcast;
      desc.tag = k.root;
      std::vector<uint8_t> buf(k.count * es + 1, 0xcd);
      if (r == k.root)
        for (size_t i = 0; i < k.count; ++i)
          put(k.dtype, buf.data(), i, exact_value(k.op, r, i, k.salt));
      if (n > 1 && k.algo == Algo::chain)
        algo::chain_broadcast(c, buf.data(), k.count * es, k.root);
      if (n > 1 && k.algo == Algo::tree) algo::tree_broadcast(c, buf.data(), k.count * es, k.root);
      for (size_t i = 0; i < k.count; ++i)
        check(get(k.dtype, buf.data(), i),
              testing::rounded(k.dtype, exact_value(k.op, k.root, i, k.salt)));
      break;
    }
    case Algo::barrier:
      desc.op = OpKind::barrier;
      algo::dissemination_barrier(c);
      break;
    case Algo::alltoall: {
      // Through run_collective, as the tcp backend runs it; in_place stands
      // for "block j's values encode the destination rank".
      desc.op = OpKind::alltoall;
      desc.count = n * k.count;
      std::vector<uint8_t> in(n * k.count * es + 1), out(n * k.count * es + 1, 0xcd);
      auto code = [&](int src, int dst, size_t i) {
        return exact_value(k.op, src * 31 + dst, i, k.salt);
      };
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < k.count; ++i)
          put(k.dtype, in.data(), j * k.count + i, code(r, j, i));
      std::vector<uint8_t> in_copy = in;
      Op op;
      op.desc = desc;
      op.in = TensorView{in.data(), k.dtype, n * k.count, Device::cpu()};
      op.out = TensorView{out.data(), k.dtype, n * k.count, Device::cpu()};
      algo::run_collective(c, op, config::TcpTuning{});
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < k.count; ++i)
          check(get(k.dtype, out.data(), q * k.count + i),
                testing::rounded(k.dtype, code(q, r, i)));
      if (out[n * k.count * es] != 0xcd) return k.label() + ": written past the output";
      if (in != in_copy) return k.label() + ": the input was modified";
      break;
    }
  }
  if (wrong == 0) return "";
  return k.label() + ": " + std::to_string(wrong) + " wrong, first " + std::to_string(first_got) +
         " expected " + std::to_string(first_want) + "\n";
}

// Every case, on every rank of an n-rank fake network, in the same order.
std::string run_all(int n, const std::vector<Case>& cases, FakeOptions opt) {
  FakeNetwork net(n, opt);
  auto results = testing::run_ranks(net, [&](int r, Transport& tr) {
    algo::Scratch scratch;
    std::string failures;
    for (const Case& k : cases) failures += run_case(k, r, tr, scratch);
    return failures;
  });
  std::string report;
  for (int r = 0; r < n; ++r) {
    const RankResult& res = results[r];
    if (!res.ok)
      report += "rank " + std::to_string(r) + " threw " + res.error + "\n";
    else if (!res.failures.empty())
      report += "rank " + std::to_string(r) + ": " + res.failures;
  }
  return report;
}

constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                             DType::i32, DType::i64, DType::u8,  DType::i8};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                             ReduceOp::prod};

// Counts around the world size (segments of 0, 1 and 2 elements) and a few
// that leave remainders; chunks small enough that each segment is many.
// `every_dtype`: every dtype and op (small worlds); otherwise the ones that
// take different paths (avg divides where a segment completes, f16 widens,
// integers compare), which keeps 16 threads on 2 cores to seconds.
std::vector<Case> cases_for(int n, bool every_dtype) {
  std::vector<Case> v;
  uint64_t salt = 0;
  const size_t sn = static_cast<size_t>(n);
  std::vector<size_t> counts = {0, 1, 2, 3, sn - 1, sn + 1, 2 * sn + 3, 97, 1000};
  for (DType t : kDTypes)
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      bool picked = (t == DType::f32 && (op == ReduceOp::sum || op == ReduceOp::avg)) ||
                    (t == DType::f16 && op == ReduceOp::sum) ||
                    (t == DType::i32 && op == ReduceOp::max);
      if (!every_dtype && !picked) continue;
      for (size_t count : counts)
        for (bool in_place : {false, true}) {
          size_t chunk = count >= 1000 ? 256 : 16;
          for (Algo a : {Algo::ring, Algo::rd})
            v.push_back({a, t, op, count, in_place, 0, chunk, ++salt});
          if (every_dtype) v.push_back({Algo::dispatch, t, op, count, in_place, 0, chunk, ++salt});
          if (!in_place)
            v.push_back({Algo::reduce_scatter, t, op, count, false, 0, chunk + 8, ++salt});
        }
    }
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{97}, size_t{1000}})
    for (bool in_place : {false, true}) {
      size_t chunk = count >= 1000 ? 256 : 12;
      v.push_back({Algo::allgather, DType::f32, ReduceOp::sum, count, in_place, 0, chunk, ++salt});
      v.push_back(
          {Algo::allgather, DType::u8, ReduceOp::sum, count, in_place, 0, chunk / 2 - 1, ++salt});
    }
  for (int root : {0, n - 1, n / 2})
    for (size_t count : {size_t{1}, size_t{7}, size_t{97}, size_t{1000}}) {
      size_t chunk = count >= 1000 ? 256 : 20;
      v.push_back({Algo::chain, DType::f32, ReduceOp::sum, count, false, root, chunk, ++salt});
      v.push_back({Algo::tree, DType::bf16, ReduceOp::sum, count, false, root, chunk, ++salt});
    }
  v.push_back({Algo::barrier, DType::u8, ReduceOp::sum, 1, false, 0, 1, ++salt});
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{97}, size_t{1000}}) {
    v.push_back({Algo::alltoall, DType::f32, ReduceOp::sum, count, false, 0, 16, ++salt});
    v.push_back({Algo::alltoall, DType::u8, ReduceOp::sum, count, false, 0, 16, ++salt});
  }
  // Blocks of 64 KiB and more: the own block is copied while the transport
  // waits (or at the end), and each block goes as chunk-sized messages.
  if (every_dtype)
    for (size_t chunk : {size_t{4096}, size_t{1} << 20})  // pieces of 64 KiB, or whole
      v.push_back({Algo::alltoall, DType::f32, ReduceOp::sum, 20000, false, 0, chunk, ++salt});
  return v;
}

TEST(Algorithms, EveryAlgorithmMatchesTheSerialReferenceAtWorldSizes1To16) {
  for (int n = 1; n <= 16; ++n) {
    std::string report = run_all(n, cases_for(n, n <= 4), {});
    EXPECT_EQ(report, "") << n << " ranks";
  }
}

// Completions reported in a random order, sends late, and send buffers read
// only when matched: an algorithm that forwards out of order, reuses a
// buffer under a send, or posts receives in completion order fails here.
TEST(Algorithms, CompletionsOutOfOrderChangeNothing) {
  for (int n : {2, 3, 4, 5, 8, 16})
    for (uint64_t seed : {1, 2}) {
      FakeOptions o;
      o.shuffle = true;
      o.seed = seed;
      std::string report = run_all(n, cases_for(n, n == 3), o);
      EXPECT_EQ(report, "") << n << " ranks, seed " << seed;
    }
}

// Every rank ends an all-reduce with the same bits, where the inputs hold
// NaNs of different payloads (rank r's at every (r + 2)th place, so some
// places hold several): min, max and sum commute on numbers, not on NaNs,
// so an algorithm that reduced in each rank's own operand order would leave
// replicas apart (recursive doubling did, before 2026-12-05: one rank got
// the NaN, its partner the number).
TEST(Algorithms, EveryRankEndsWithTheSameBitsWhereInputsHoldNaNs) {
  for (Algo a : {Algo::ring, Algo::rd})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
      for (int n : {2, 3, 4, 5, 8}) {
        const size_t count = 1000;
        std::vector<std::vector<float>> got(static_cast<size_t>(n));
        FakeNetwork net(n);
        auto results = testing::run_ranks(net, [&](int r, Transport& tr) {
          algo::Scratch scratch;
          OpDesc desc;
          desc.op = OpKind::allreduce;
          desc.dtype = DType::f32;
          desc.redop = op;
          desc.count = count;
          desc.seq = 1;
          algo::Ctx c{tr, desc, 64, scratch, Deadline::clock::now() + 120s};
          std::vector<float> in(count), out(count);
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r + 1) * (i % 7)) - 3;
          for (size_t i = 0; i < count; i += static_cast<size_t>(r) + 2) {
            const uint32_t bits = 0x7fc00000u | static_cast<uint32_t>(r + 1);
            std::memcpy(&in[i], &bits, sizeof bits);
          }
          if (a == Algo::ring)
            algo::ring_allreduce(c, in.data(), out.data(), count, DType::f32, op);
          else
            algo::rd_allreduce(c, in.data(), out.data(), count, DType::f32, op);
          got[static_cast<size_t>(r)] = out;
          return std::string();
        });
        for (int r = 0; r < n; ++r) {
          ASSERT_TRUE(results[r].ok) << name(a) << " rank " << r << ": " << results[r].error;
          EXPECT_EQ(0, std::memcmp(got[r].data(), got[0].data(), count * sizeof(float)))
              << name(a) << " " << to_string(op) << " at " << n << " ranks: rank " << r
              << " differs from rank 0";
        }
      }
}

// A rank vanishes in the middle of a collective (after its k-th message):
// every other rank gets peer_lost naming it, none hangs, none sees success.
TEST(Algorithms, AVanishingPeerIsPeerLostOnEverySurvivor) {
  for (Algo a : {Algo::ring, Algo::rd, Algo::reduce_scatter, Algo::allgather, Algo::chain,
                 Algo::tree, Algo::barrier, Algo::alltoall})
    for (int n : {2, 3, 4, 8, 16}) {
      const int victim = n / 2;
      FakeOptions o;
      o.vanish_rank = victim;
      o.vanish_after_posts = 3;
      FakeNetwork net(n, o);
      auto t0 = std::chrono::steady_clock::now();
      Case k{a, DType::f32, ReduceOp::sum, 4096, false, 0, 64, 1};
      auto results = testing::run_ranks(net, [&](int r, Transport& tr) {
        algo::Scratch scratch;
        std::string f;
        for (int i = 0; i < 20; ++i) f += run_case(k, r, tr, scratch);
        return f;
      });
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << name(a);
      EXPECT_TRUE(results[victim].vanished) << name(a) << " " << n;
      for (int r = 0; r < n; ++r) {
        if (r == victim) continue;
        EXPECT_FALSE(results[r].ok) << name(a) << " " << n << " rank " << r << " finished";
        EXPECT_NE(results[r].error.find("peer_lost"), std::string::npos)
            << name(a) << " " << n << " rank " << r << ": " << results[r].error;
        EXPECT_NE(results[r].error.find("rank " + std::to_string(victim)), std::string::npos)
            << results[r].error;
      }
    }
}

// Ranks that pass different counts, or run different collectives, get a
// mismatch naming the other rank, not bytes read as something else.
TEST(Algorithms, RanksThatDisagreeGetAMismatchNamingTheOther) {
  for (Algo a : {Algo::rd, Algo::alltoall})
    for (int n : {2, 3, 5}) {
      FakeNetwork net(n);
      auto results = testing::run_ranks(net, [&](int r, Transport& tr) {
        algo::Scratch scratch;
        Case k{a, DType::f32, ReduceOp::sum, r == 1 ? size_t{9} : size_t{8}, false, 0, 64, 5};
        return run_case(k, r, tr, scratch);
      });
      int mismatches = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_FALSE(results[r].ok) << n << " rank " << r;
        if (results[r].error.find("mismatch") != std::string::npos) ++mismatches;
      }
      EXPECT_GE(mismatches, 2) << n;
      EXPECT_NE(results[1].error.find("rank "), std::string::npos) << results[1].error;
    }
}

// A rank that never takes part: the others time out at their deadline,
// saying whom they wait for.
TEST(Algorithms, ARankThatNeverCallsTimesOutItsPartners) {
  FakeNetwork net(3);
  auto results = testing::run_ranks(net, [&](int r, Transport& tr) -> std::string {
    if (r == 2) return "";
    algo::Scratch scratch;
    OpDesc d;
    d.op = OpKind::barrier;
    algo::Ctx c{tr, d, 64, scratch, Deadline::clock::now() + 200ms};
    algo::dissemination_barrier(c);
    return "";
  });
  for (int r : {0, 1}) {
    EXPECT_NE(results[r].error.find("timeout"), std::string::npos) << results[r].error;
    EXPECT_NE(results[r].error.find("waiting for rank"), std::string::npos) << results[r].error;
  }
  EXPECT_TRUE(results[2].ok);
}

TEST(Algorithm, CostModelPicksLatencyForSmallAndRingForLarge) {
  config::TcpTuning t;
  for (int n : {2, 3, 4, 8}) {
    EXPECT_EQ(algo::choose_allreduce(8, n, t), algo::AllreduceAlgo::recursive_doubling) << n;
    EXPECT_EQ(algo::choose_allreduce(64 << 20, n, t), algo::AllreduceAlgo::ring) << n;
    EXPECT_EQ(algo::choose_broadcast(8, n, t), algo::BroadcastAlgo::binomial_tree) << n;
  }
  EXPECT_EQ(algo::choose_broadcast(64 << 20, 8, t), algo::BroadcastAlgo::chain);
  // The switch point follows the model: the crossover is where the costs meet.
  size_t lo = 8, hi = 64 << 20;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    (algo::choose_allreduce(mid, 4, t) == algo::AllreduceAlgo::ring ? hi : lo) = mid;
  }
  EXPECT_LE(algo::allreduce_cost(algo::AllreduceAlgo::ring, hi, 4, t),
            algo::allreduce_cost(algo::AllreduceAlgo::recursive_doubling, hi, 4, t));
  EXPECT_GT(algo::allreduce_cost(algo::AllreduceAlgo::ring, lo, 4, t),
            algo::allreduce_cost(algo::AllreduceAlgo::recursive_doubling, lo, 4, t));
  t.allreduce_algo = "ring";
  EXPECT_EQ(algo::choose_allreduce(8, 4, t), algo::AllreduceAlgo::ring);
  t.allreduce_algo = "rd";
  EXPECT_EQ(algo::choose_allreduce(64 << 20, 4, t), algo::AllreduceAlgo::recursive_doubling);
}

}  // namespace
}  // namespace collie
