// tests/test_collectives.cc: every collective over real processes.
//
// Run under collie-run at 1, 2, 3 and 4 ranks (see tests/meson.build); every
// rank runs every test in the same order, so the collectives line up, and
// checks its own result against a serial float64 reference computed from all
// ranks' (regenerated) inputs. Tests use EXPECT, not ASSERT, around
// collectives so that a failing rank still issues the same calls as the rest.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/nonfinite.h"
#include "collie/comm.h"
#include "mp_common.h"
#include "mp_test.h"

namespace collie {
namespace {

using testing::combine;
using testing::exact_value;
using testing::get;
using testing::put;

Communicator& comm() {
  return testing::world();
}

const std::vector<size_t> kCounts = {0, 1, 2, 3, 7, 13, 97, 1000, 4099, 65537};
constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                             DType::i32, DType::i64, DType::u8,  DType::i8};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                             ReduceOp::prod};

std::string label(DType t, ReduceOp op, size_t count, bool in_place) {
  return std::string(to_string(t)) + " " + std::string(to_string(op)) + " x" +
         std::to_string(count) + (in_place ? " in place" : " out of place");
}

// "" when `got` holds the all-reduce of every rank's exact_value inputs,
// else how many elements differ and the first of them.
std::string wrong_sums(DType t, ReduceOp op, const void* got, size_t count, uint64_t salt) {
  const int n = comm().size();
  size_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    double want = exact_value(op, 0, i, salt);
    for (int q = 1; q < n; ++q) want = combine(op, want, exact_value(op, q, i, salt));
    if (op == ReduceOp::avg) want = testing::rounded(t, want / n);
    const double v = get(t, got, i);
    if (v != want && wrong++ == 0)
      first = "element " + std::to_string(i) + " is " + std::to_string(v) + ", expected " +
              std::to_string(want);
  }
  return wrong ? std::to_string(wrong) + " wrong; first: " + first : "";
}

// Every dtype, op, awkward count, in place and out of place, against the
// exact reference (the inputs are chosen so that every result is exact).
TEST(Allreduce, EveryDtypeOpAndCountMatchesSerialReference) {
  const int r = comm().rank();
  uint64_t salt = 0;
  for (DType t : kDTypes)
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          ++salt;
          size_t es = dtype_size(t);
          std::vector<uint8_t> in(count * es + 1), out(count * es + 1);
          for (size_t i = 0; i < count; ++i) put(t, in.data(), i, exact_value(op, r, i, salt));
          TensorView vin{in.data(), t, count, Device::cpu()};
          TensorView vout{in_place ? in.data() : out.data(), t, count, Device::cpu()};
          comm().allreduce(vin, vout, op).wait();
          EXPECT_EQ(wrong_sums(t, op, vout.data, count, salt), "") << label(t, op, count, in_place);
        }
    }
}

// 8-bit sums that overflow wrap, as their dtype's arithmetic does, at
// every count (a vectorised body and a scalar tail): Open MPI 4.1's op/avx
// saturated them over its vector body (100 + 100 in int8 gave 127), which
// the mpi backend now leaves to collie's kernels.
TEST(Allreduce, EightBitSumsWrapAtEveryCount) {
  const int n = comm().size(), r = comm().rank();
  for (DType t : {DType::u8, DType::i8})
    for (size_t count : {3, 97, 1000}) {
      std::vector<uint8_t> in(count), out(count);
      auto term = [&](int q, size_t i) { return static_cast<uint8_t>(100 + 37 * q + (i % 11)); };
      for (size_t i = 0; i < count; ++i) in[i] = term(r, i);
      comm()
          .allreduce(TensorView{in.data(), t, count, Device::cpu()},
                     TensorView{out.data(), t, count, Device::cpu()}, ReduceOp::sum)
          .wait();
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        unsigned want = 0;  // the sum mod 256: the same bits for u8 and i8
        for (int q = 0; q < n; ++q) want += term(q, i);
        wrong += out[i] != static_cast<uint8_t>(want);
      }
      EXPECT_EQ(wrong, 0u) << to_string(t) << " sum x" << count << " at " << n << " ranks";
    }
}

// fp16/bf16 with values that round: partial sums are formed in f32 and
// rounded once per step, so the error is bounded by (steps + 1) roundings of
// the narrow format, relative to the sum of magnitudes.
TEST(Allreduce, HalfPrecisionErrorWithinFormatBound) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 50021;
  for (DType t : {DType::f16, DType::bf16}) {
    double unit = t == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      std::vector<std::vector<double>> all;
      for (int q = 0; q < n; ++q) all.push_back(testing::random_values(q, count, 42));
      std::vector<uint16_t> buf(count);
      for (size_t i = 0; i < count; ++i) put(t, buf.data(), i, all[r][i]);
      comm().allreduce(TensorView{buf.data(), t, count, Device::cpu()}, op).wait();
      double worst = 0;
      for (size_t i = 0; i < count; ++i) {
        double want = 0, mag = 0;
        for (int q = 0; q < n; ++q) {
          double x = testing::rounded(t, all[q][i]);
          want += x;
          mag += std::abs(x);
        }
        if (op == ReduceOp::avg) {
          want /= n;
          mag /= n;
        }
        double bound = (n + 1) * unit * mag + 1e-30;
        worst = std::max(worst, std::abs(get(t, buf.data(), i) - want) / bound);
      }
      EXPECT_LE(worst, 1.0) << to_string(t) << " " << to_string(op);
    }
  }
}

// Every rank must hold the same bits: DDP replicas drift apart otherwise.
// Sums of random floats, and min, max and sum over inputs with NaNs of
// different payloads on different ranks (where a reduction's operand order
// decides which payload, or whether the NaN, comes out), even ranks in
// place and odd ones out of place, at sizes for every path (shm's whole
// buffer per rank at 2 ranks up to 512 KiB, its slices above).
TEST(Allreduce, ResultsAreBitIdenticalOnEveryRank) {
  const int n = comm().size(), r = comm().rank();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max})
    for (bool nans : {false, true})
      for (size_t count : {size_t{5}, size_t{4099}, size_t{65537}, size_t{300007}}) {
        if (op != ReduceOp::sum && !nans) continue;
        auto v = testing::random_values(r, count, 7);
        std::vector<float> in(v.begin(), v.end()), out(count, -1.0f);
        if (nans)  // quiet NaNs, payload r + 1, at every (r + 2)th place: some shared
          for (size_t i = 0; i < count; i += static_cast<size_t>(r) + 2) {
            const uint32_t bits = 0x7fc00000u | static_cast<uint32_t>(r + 1);
            std::memcpy(&in[i], &bits, sizeof bits);
          }
        const bool in_place = r % 2 == 0;
        float* result = in_place ? in.data() : out.data();
        comm().allreduce(view_of(in.data(), count), view_of(result, count), op).wait();
        std::vector<float> gathered(count * n);
        comm().allgather(view_of(result, count), view_of(gathered.data(), gathered.size())).wait();
        for (int q = 0; q < n; ++q)
          EXPECT_EQ(0, std::memcmp(gathered.data() + q * count, result, count * sizeof(float)))
              << "rank " << q << " differs from rank " << r << " at count " << count << ", "
              << to_string(op) << (nans ? " with NaNs" : "");
      }
}

// The search for NaN and Inf inside an all-reduce (Communicator::allreduce
// with a NonFiniteSeen: the reducer's check_nonfinite). Every rank's input
// holds NaN, +Inf and -Inf at places of its own; what all ranks saw, added
// up by the rank whose input it was and by tensor, is exactly what that
// rank put there: each element searched once, whichever part of the
// reduction read it. Every float dtype, sum and avg, counts for every path
// (shm's one line, one step, direct reads and segment rounds; tcp's
// recursive doubling and ring), out of place, in place, and in place in
// communicator memory (shm's shared buffers). On shm and tcp the search
// runs inside the reduction, so some rank records another rank's values:
// the executor's pass of its own, where a backend has none, sees only its
// own rank's.
TEST(Allreduce, TheSearchForNonFiniteInputsSeesEachRanksOnce) {
  const int n = comm().size(), r = comm().rank();
  int saw_another = 0;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (size_t count : {size_t{7}, size_t{4099}, size_t{300007}})
        for (int mode = 0; mode < 3; ++mode) {
          const size_t es = dtype_size(t);
          // Rank q's non-finite places: NaN, +Inf, -Inf, three distinct
          // elements (q < 16); in large buffers at the start, the middle
          // and the end, in every rank's slice and ring segment.
          auto places = [&](int q) {
            const size_t a = static_cast<size_t>(q);
            if (count < 100)
              return std::array<size_t, 3>{3 * a % count, (3 * a + 1) % count, (3 * a + 2) % count};
            return std::array<size_t, 3>{a, count / 2 + a, count - 1 - a};
          };
          const double kinds[3] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY};
          std::shared_ptr<void> mem;
          std::vector<uint8_t> plain(count * es), out(count * es);
          uint8_t* in = plain.data();
          if (mode == 2) {
            mem = comm().allocate(count * es);
            in = static_cast<uint8_t*>(mem.get());
          }
          for (size_t i = 0; i < count; ++i) put(t, in, i, static_cast<double>((r + 1) * (i % 3)));
          for (int k = 0; k < 3; ++k) put(t, in, places(r)[k], kinds[k]);
          kernels::NonFiniteSeen seen;
          seen.starts = {0, count / 3};  // two tensors
          void* dst = mode == 0 ? out.data() : in;
          comm()
              .allreduce(TensorView{in, t, count, Device::cpu()},
                         TensorView{dst, t, count, Device::cpu()}, op, seen)
              .wait();
          const std::string what = label(t, op, count, mode != 0) + (mode == 2 ? " (shared)" : "");
          EXPECT_TRUE(seen.searched) << what;
          // Every rank's hits, as rows (rank, tensor, count, first).
          const size_t rows = 2 * static_cast<size_t>(n);
          std::vector<int64_t> mine(4 * rows, -1), all(4 * rows * n);
          EXPECT_LE(seen.hits.size(), rows) << what;
          for (size_t h = 0; h < seen.hits.size() && h < rows; ++h) {
            const auto& x = seen.hits[h];
            mine[4 * h] = x.rank;
            mine[4 * h + 1] = static_cast<int64_t>(x.tensor);
            mine[4 * h + 2] = static_cast<int64_t>(x.count);
            mine[4 * h + 3] = static_cast<int64_t>(x.first);
            saw_another |= x.rank != r;
          }
          comm()
              .allgather(view_of(mine.data(), mine.size()), view_of(all.data(), all.size()))
              .wait();
          for (int q = 0; q < n; ++q)
            for (size_t tensor = 0; tensor < 2; ++tensor) {
              int64_t want_count = 0, want_first = -1, got_count = 0, got_first = -1;
              for (size_t p : places(q))
                if ((p >= count / 3) == (tensor == 1)) {
                  ++want_count;
                  if (want_first < 0 || static_cast<int64_t>(p) < want_first) want_first = p;
                }
              for (size_t row = 0; row < all.size() / 4; ++row) {
                const int64_t* x = &all[4 * row];
                if (x[0] != q || x[1] != static_cast<int64_t>(tensor)) continue;
                got_count += x[2];
                if (got_first < 0 || x[3] < got_first) got_first = x[3];
              }
              EXPECT_EQ(got_count, want_count) << what << ": rank " << q << "'s tensor " << tensor;
              EXPECT_EQ(got_first, want_first) << what << ": rank " << q << "'s tensor " << tensor;
            }
        }
  const std::string b = comm().backend();
  if (n > 1 && (b == "tcp" || b == "shm")) {
    comm().allreduce(view_of(&saw_another, 1), ReduceOp::max).wait();
    EXPECT_EQ(saw_another, 1) << "no rank recorded another rank's input: the search did not run "
                                 "inside "
                              << b << "'s reduction";
  }
}

// Buffers from Communicator::allocate: on shm the peers map them and the
// all-reduce runs in place in them, without the segment. Every rank puts its
// buffer at a different offset of its allocation, and in one round only
// some ranks use such memory at all: every rank must still agree on how to
// run the op and get the exact reference.
TEST(Allreduce, InPlaceInCommunicatorMemoryMatchesSerialReference) {
  const int r = comm().rank();
  uint64_t salt = 1000;
  for (int mixed = 0; mixed < 2; ++mixed)
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::i32})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        if (!supports(op, t)) continue;
        for (size_t count : {size_t{3}, size_t{4099}, size_t{65537}, size_t{300007}}) {
          ++salt;
          const size_t es = dtype_size(t), skip = static_cast<size_t>(r) * 3 * es;
          std::shared_ptr<void> mem;
          std::vector<uint8_t> plain;
          uint8_t* base;
          if (mixed && r % 2 == 1) {
            plain.resize(count * es + skip + 1);
            base = plain.data();
          } else {
            mem = comm().allocate(count * es + skip);
            base = static_cast<uint8_t*>(mem.get());
          }
          uint8_t* buf = base + skip;
          for (size_t i = 0; i < count; ++i) put(t, buf, i, exact_value(op, r, i, salt));
          comm().allreduce(TensorView{buf, t, count, Device::cpu()}, op).wait();
          EXPECT_EQ(wrong_sums(t, op, buf, count, salt), "")
              << label(t, op, count, true) << (mixed ? " (some ranks)" : "");
        }
      }
}

// The memory is zeroed, aligned, and outlives the communicator that handed
// it out; memory from one communicator serves another's all-reduce.
TEST(Allreduce, CommunicatorMemoryOutlivesItsCommunicator) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 100003;
  std::shared_ptr<void> mem;
  {
    auto sub = comm().split(0, r);
    ASSERT_NE(sub, nullptr);
    mem = sub->allocate(count * sizeof(double));
  }
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mem.get()) % 64, 0u);
  auto* x = static_cast<double*>(mem.get());
  size_t nonzero = 0;
  for (size_t i = 0; i < count; ++i) nonzero += x[i] != 0.0;
  EXPECT_EQ(nonzero, 0u);
  for (size_t i = 0; i < count; ++i) x[i] = r + 1.0 + static_cast<double>(i % 7);
  comm().allreduce(TensorView{x, DType::f64, count, Device::cpu()}, ReduceOp::sum).wait();
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    wrong += x[i] != n * (n + 1) / 2.0 + n * static_cast<double>(i % 7);
  EXPECT_EQ(wrong, 0u);
}

TEST(Allreduce, ManyOutstandingOpsCompleteInAnyWaitOrder) {
  const int n = comm().size(), r = comm().rank();
  constexpr int kOps = 16;
  std::vector<std::vector<int64_t>> bufs(kOps, std::vector<int64_t>(1000));
  std::vector<Work> works;
  for (int k = 0; k < kOps; ++k) {
    for (size_t i = 0; i < 1000; ++i) bufs[k][i] = (r + 1) * (k + 1) + static_cast<int64_t>(i);
    works.push_back(comm().allreduce(view_of(bufs[k].data(), 1000), ReduceOp::sum));
  }
  for (int k = kOps - 1; k >= 0; --k) works[k].wait();
  for (int k = 0; k < kOps; ++k)
    for (size_t i = 0; i < 1000; i += 97)
      EXPECT_EQ(bufs[k][i], (k + 1) * n * (n + 1) / 2 + n * static_cast<int64_t>(i));
}

// Thousands of tiny all-reduces back to back, ranks running ahead of each
// other in turn: each must reduce its own op's inputs, never a slot that a
// faster rank has already refilled for a later op (shm keeps the smallest
// inline in two lines per rank, reused every other op).
TEST(Allreduce, ABurstOfTinyOpsEachReducesItsOwnInputs) {
  const int n = comm().size(), r = comm().rank();
  constexpr int kOps = 3000;
  std::vector<Work> works;
  std::vector<std::array<int64_t, 3>> bufs(kOps);
  for (int k = 0; k < kOps; ++k) {
    // A different rank dawdles in each stretch of 100 ops, so the others run
    // ahead of it by as much as the protocol allows.
    if ((k / 100) % n == r) {
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    for (int i = 0; i < 3; ++i) bufs[k][i] = int64_t{1000003} * k + 1009 * i + r;
    works.push_back(comm().allreduce(view_of(bufs[k].data(), 3), ReduceOp::sum));
    if (k % 7 == 0) works.back().wait();  // some waited at once, some in a batch
  }
  wait_all(works);
  int wrong = 0;
  for (int k = 0; k < kOps; ++k)
    for (int i = 0; i < 3; ++i)
      wrong += bufs[k][i] != n * (int64_t{1000003} * k + 1009 * i) + n * (n - 1) / 2;
  EXPECT_EQ(wrong, 0);
}

// The blocking forms: the same results as through a Work, whether the op
// runs at once on the calling thread (nothing queued) or queues behind ops
// issued before it; ranks may mix the two forms for one op.
TEST(Blocking, EveryCollectiveMatchesTheReferenceAlsoBehindQueuedOps) {
  const int n = comm().size(), r = comm().rank();
  uint64_t salt = 5000;
  // 1 to 224 B travel inline on shm, 4099 x 4 B in one step, 1 MiB read
  // directly or in rounds.
  for (size_t count : {size_t{1}, size_t{7}, size_t{56}, size_t{4099}, size_t{1} << 18})
    for (DType t : {DType::f32, DType::i64})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
        if (!supports(op, t)) continue;
        const size_t es = dtype_size(t);
        // An op issued first and waited for after the blocking one: the
        // blocking op queues behind it on every rank.
        std::vector<uint8_t> first(count * es), in(count * es), out(count * es);
        const uint64_t s0 = ++salt, s1 = ++salt;
        for (size_t i = 0; i < count; ++i) {
          put(t, first.data(), i, exact_value(op, r, i, s0));
          put(t, in.data(), i, exact_value(op, r, i, s1));
        }
        const TensorView vfirst{first.data(), t, count, Device::cpu()};
        const TensorView vin{in.data(), t, count, Device::cpu()};
        const TensorView vout{out.data(), t, count, Device::cpu()};
        const bool queued = salt % 4 == 2;
        std::optional<Work> w;
        if (queued) w = comm().allreduce(vfirst, op);
        // Odd ranks use the Work form for this op now and then.
        if (r % 2 == 1 && salt % 3 == 0)
          comm().allreduce(vin, vout, op).wait();
        else
          comm().allreduce(vin, vout, op, blocking);
        if (w) {
          w->wait();
          EXPECT_EQ(wrong_sums(t, op, first.data(), count, s0), "")
              << "the op before: " << label(t, op, count, true);
        }
        EXPECT_EQ(wrong_sums(t, op, out.data(), count, s1), "")
            << label(t, op, count, false) << (queued ? " behind a queued op" : "");
      }
  for (size_t count : {size_t{1}, size_t{61}, size_t{65537}}) {
    for (int root = 0; root < n; ++root) {
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i)
        buf[i] = r == root ? static_cast<int32_t>(i * 7 + root) : -1;
      comm().broadcast(view_of(buf.data(), count), root, blocking);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += buf[i] != static_cast<int32_t>(i * 7 + root);
      EXPECT_EQ(wrong, 0u) << "broadcast from " << root << ", count " << count;
    }
    std::vector<double> mine(count), all(count * n, -1);
    for (size_t i = 0; i < count; ++i) mine[i] = r * 1e6 + static_cast<double>(i);
    comm().allgather(view_of(mine.data(), count), view_of(all.data(), all.size()), blocking);
    size_t wrong = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i)
        wrong += all[q * count + i] != q * 1e6 + static_cast<double>(i);
    EXPECT_EQ(wrong, 0u) << "allgather, count " << count;
    std::vector<int64_t> whole(count * n), block(count);
    for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<int64_t>(i) * (r + 1);
    comm().reduce_scatter(view_of(whole.data(), whole.size()), view_of(block.data(), count),
                          ReduceOp::sum, blocking);
    wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += block[i] != static_cast<int64_t>(r * count + i) * n * (n + 1) / 2;
    EXPECT_EQ(wrong, 0u) << "reduce_scatter, count " << count;
    comm().barrier(blocking);
  }
  // Bad arguments are refused at the call, as for the Work form.
  std::vector<float> a(4), b(3);
  try {
    comm().allreduce(view_of(a.data(), 4), view_of(b.data(), 3), ReduceOp::sum, blocking);
    ADD_FAILURE() << "a size mismatch was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r)), std::string::npos)
        << e.what();
  }
}

TEST(Broadcast, EveryRootAndCount) {
  const int n = comm().size(), r = comm().rank();
  for (int root = 0; root < n; ++root)
    for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{4099}, size_t{1u << 20}}) {
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i)
        buf[i] = r == root ? static_cast<int32_t>(i * 31 + root) : -1;
      comm().broadcast(view_of(buf.data(), count), root).wait();
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += buf[i] != static_cast<int32_t>(i * 31 + root);
      EXPECT_EQ(wrong, 0u) << "root " << root << " count " << count;
    }
}

TEST(Allgather, InPlaceAndOutOfPlace) {
  const int n = comm().size(), r = comm().rank();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{65537}})
    for (bool in_place : {false, true}) {
      std::vector<double> out(count * n, -1.0), in(count);
      double* mine = in_place ? out.data() + count * r : in.data();
      for (size_t i = 0; i < count; ++i) mine[i] = r * 1e6 + static_cast<double>(i);
      comm().allgather(view_of(mine, count), view_of(out.data(), out.size())).wait();
      size_t wrong = 0;
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i)
          wrong += out[q * count + i] != q * 1e6 + static_cast<double>(i);
      EXPECT_EQ(wrong, 0u) << "count " << count << (in_place ? " in place" : "");
    }
}

// The value rank `src` sends rank `dst` at element i of its block: every
// element says where it came from and where it was going.
double routed(int src, int dst, size_t i) {
  return src * 1e6 + dst * 1e4 + static_cast<double>(i % 10000);
}

// Every dtype (the values fit each exactly: small integers), empty blocks,
// odd counts, against the routing each element encodes.
TEST(Alltoall, EveryDtypeAndCountArrivesFromItsRank) {
  const int n = comm().size(), r = comm().rank();
  for (DType t : kDTypes)
    for (size_t block : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      const size_t es = dtype_size(t);
      std::vector<uint8_t> in(block * n * es), out(block * n * es, 0xEE);
      // u8 holds 0..255, f16 and bf16 integers to 256: small codes.
      auto code = [&](int src, int dst, size_t i) {
        return static_cast<double>((src * 5 + dst * 3 + i) % 97);
      };
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < block; ++i) put(t, in.data(), j * block + i, code(r, j, i));
      comm()
          .alltoall(TensorView{in.data(), t, in.size() / es, Device::cpu()},
                    TensorView{out.data(), t, out.size() / es, Device::cpu()})
          .wait();
      size_t wrong = 0;
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < block; ++i)
          wrong += get(t, out.data(), q * block + i) != code(q, r, i);
      EXPECT_EQ(wrong, 0u) << to_string(t) << " block " << block;
    }
}

// Uneven blocks, some empty, every pair's count different; the blocking
// form; queued behind and ahead of other collectives.
TEST(Alltoall, UnevenCountsAgreeWithThePeersAndQueueInOrder) {
  const int n = comm().size(), r = comm().rank();
  auto count = [](int src, int dst) { return static_cast<size_t>((src * 7 + dst * 3) % 5) * 333; };
  std::vector<size_t> sc(n), rc(n);
  for (int q = 0; q < n; ++q) {
    sc[q] = count(r, q);
    rc[q] = count(q, r);
  }
  std::vector<double> in, out;
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < sc[j]; ++i) in.push_back(routed(r, j, i));
  size_t total_in = 0;
  for (size_t c : rc) total_in += c;
  out.assign(total_in, -1.0);
  std::vector<float> before(1000, static_cast<float>(r + 1)), after(1000, 1.0f);
  Work w0 = comm().allreduce(view_of(before.data(), before.size()), ReduceOp::sum);
  Work w1 =
      comm().alltoallv(view_of(in.data(), in.size()), sc, view_of(out.data(), out.size()), rc);
  Work w2 = comm().allreduce(view_of(after.data(), after.size()), ReduceOp::sum);
  w2.wait();
  w1.wait();
  w0.wait();
  size_t at = 0, wrong = 0;
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < rc[q]; ++i) wrong += out[at++] != routed(q, r, i);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(before[999], n * (n + 1) / 2.0f);
  EXPECT_EQ(after[0], static_cast<float>(n));
  // The blocking form, equal blocks.
  std::vector<int64_t> a(3 * n), b(3 * n, -1);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < 3; ++i) a[3 * j + i] = r * 100 + j * 10 + i;
  comm().alltoall(view_of(a.data(), a.size()), view_of(b.data(), b.size()), blocking);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[3 * q + i], q * 100 + r * 10 + i);
}

TEST(ReduceScatter, EveryOpAgainstSerialReference) {
  const int n = comm().size(), r = comm().rank();
  uint64_t salt = 1000;
  for (DType t : {DType::f32, DType::bf16, DType::i64})
    for (ReduceOp op : kOps) {
      if (!supports(op, t)) continue;
      for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{4099}, size_t{200003}}) {
        ++salt;
        size_t es = dtype_size(t);
        std::vector<uint8_t> in(count * n * es + 1), out(count * es + 1);
        for (size_t i = 0; i < count * n; ++i) put(t, in.data(), i, exact_value(op, r, i, salt));
        comm()
            .reduce_scatter(TensorView{in.data(), t, count * n, Device::cpu()},
                            TensorView{out.data(), t, count, Device::cpu()}, op)
            .wait();
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          size_t g = r * count + i;
          double want = exact_value(op, 0, g, salt);
          for (int q = 1; q < n; ++q) want = combine(op, want, exact_value(op, q, g, salt));
          if (op == ReduceOp::avg) want = testing::rounded(t, want / n);
          wrong += get(t, out.data(), i) != want;
        }
        EXPECT_EQ(wrong, 0u) << label(t, op, count, false);
      }
    }
}

// After a barrier, every rank has done what it did before it: each rank
// leaves a file, then checks that all ranks' files exist.
TEST(Barrier, NoRankPassesBeforeAllArrive) {
  const int n = comm().size(), r = comm().rank();
  const char* port = std::getenv("COLLIE_MASTER_PORT");
  auto dir = std::filesystem::temp_directory_path() /
             ("collie-barrier-" + std::string(port ? port : "solo"));
  std::filesystem::create_directories(dir);
  for (int round = 0; round < 3; ++round) {
    std::ofstream(dir / (std::to_string(round) + "-" + std::to_string(r))) << r;
    comm().barrier().wait();
    for (int q = 0; q < n; ++q)
      EXPECT_TRUE(std::filesystem::exists(dir / (std::to_string(round) + "-" + std::to_string(q))))
          << "round " << round << ": rank " << q << " had not arrived";
  }
  comm().barrier().wait();
  if (r == 0) std::filesystem::remove_all(dir);
}

// Each rank sends a message far larger than the buffers between ranks to
// its right neighbour and receives its left one's; `pause` between issuing
// the send and the receive.
void ring_exchange(int tag, std::chrono::milliseconds pause) {
  const int n = comm().size(), r = comm().rank();
  const size_t count = 3u << 20;
  int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> out(count), in(count, -1.0f);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(r * 10 + (i % 1000));
  Work s = comm().send(view_of(out.data(), count), right, tag);
  if (pause.count() > 0) std::this_thread::sleep_for(pause);
  Work v = comm().recv(view_of(in.data(), count), left, tag);
  s.wait();
  v.wait();
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += in[i] != static_cast<float>(left * 10 + (i % 1000));
  EXPECT_EQ(wrong, 0u);
}

// Both neighbours send first and receive second, with messages far larger
// than the socket buffers: back-to-back point-to-point ops progress together.
TEST(SendRecv, RingExchangeOfLargeMessagesDoesNotDeadlock) {
  if (comm().size() == 1) GTEST_SKIP() << "needs two ranks";
  ring_exchange(5, std::chrono::milliseconds(0));
}

// The same exchange with the receive issued only once the send has
// started on the executor's thread (after its grace of 100 us) and filled
// the buffers between the ranks (shm's mailbox, MPI's eager limit; TCP's
// loopback buffers may hold all of it): the running batch must take the
// receive in. shm's batch once slept on through the executor's wake-up,
// because it did not change the word its sleep waits on: every rank's send
// waited for a receive that never joined (a hang under ThreadSanitizer, 3
// ranks).
TEST(SendRecv, AReceiveIssuedWhileTheSendRunsJoinsIt) {
  if (comm().size() == 1) GTEST_SKIP() << "needs two ranks";
  ring_exchange(6, std::chrono::milliseconds(200));
}

TEST(SendRecv, MessagesBetweenAPairArriveInOrder) {
  const int n = comm().size(), r = comm().rank();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  if (r < 2) {
    int peer = 1 - r;
    for (int k = 0; k < 20; ++k) {
      int64_t x = r == 0 ? k * 100 : -1;
      if (r == 0)
        comm().send(view_of(&x, 1), peer, k).wait();
      else
        comm().recv(view_of(&x, 1), peer, k).wait();
      EXPECT_EQ(x, k * 100);
    }
  }
  comm().barrier().wait();
}

TEST(Split, EvenAndOddRanksReduceSeparately) {
  const int n = comm().size(), r = comm().rank();
  // Rank 0 of a 3+ rank job stays out (color -1) to cover joining no group.
  int color = (n >= 3 && r == 0) ? -1 : r % 2;
  auto sub = comm().split(color, /*key=*/-r);  // reversed order inside each group
  if (color < 0) {
    EXPECT_EQ(sub, nullptr);
    return;
  }
  ASSERT_NE(sub, nullptr);
  std::vector<int> members;
  for (int q = 0; q < n; ++q)
    if (!(n >= 3 && q == 0) && q % 2 == color) members.push_back(q);
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  // Keys are -rank, so the highest world rank is rank 0 of the group.
  int expect_rank = 0;
  for (int q : members)
    if (q > r) ++expect_rank;
  EXPECT_EQ(sub->rank(), expect_rank);
  int64_t x = r, want = 0;
  for (int q : members) want += q;
  sub->allreduce(view_of(&x, 1), ReduceOp::sum).wait();
  EXPECT_EQ(x, want);
}

TEST(Work, ThenRunsAfterCompletionAndChainsAnotherOp) {
  const int n = comm().size();
  std::vector<double> a(1000, 1.0);
  bool saw_done = false;
  Work w = comm().allreduce(view_of(a.data(), a.size()), ReduceOp::sum).then([&](const Work& prev) {
    saw_done = prev.done() && !prev.error();
    for (auto& x : a) x *= 2;
  });
  w.wait();
  EXPECT_TRUE(saw_done);
  EXPECT_EQ(a[0], 2.0 * n);
  Work chained =
      comm().allreduce(view_of(a.data(), a.size()), ReduceOp::sum).then_work([&](const Work&) {
        return comm().allreduce(view_of(a.data(), a.size()), ReduceOp::sum);
      });
  chained.wait();
  EXPECT_EQ(a[999], 2.0 * n * n * n);
}

// The review's reproducer: a continuation that waits for another operation
// of the same communicator. Continuations used to run while the executor
// was still held, so the inner op could not run until the outer wait gave up
// (twice the timeout). The bounded wait turns a hang into a failure.
TEST(Work, AContinuationCanWaitForAnotherOpOfTheSameCommunicator) {
  const int n = comm().size();
  std::vector<float> x(1000, 1.0f), y(3, 2.0f);
  comm()
      .allreduce(view_of(x.data(), x.size()), ReduceOp::sum)
      .then(
          [&](const Work&) { comm().allreduce(view_of(y.data(), y.size()), ReduceOp::sum).wait(); })
      .wait(std::chrono::seconds(60));
  EXPECT_EQ(x[999], static_cast<float>(n));
  EXPECT_EQ(y[2], 2.0f * n);
}

// A reference from share() that outlives the communicator: a call through
// it fails with `unavailable` at once (with a raw pointer it would touch
// freed memory, which the asan build reports). So do calls made by a chain
// that runs after the destruction.
TEST(Lifetime, CallsThroughAShareAfterDestructionFailAtOnce) {
  auto sub = comm().split(0, comm().rank());
  ASSERT_TRUE(sub);
  std::shared_ptr<Communicator> ref = sub->share();
  std::vector<float> v(4, 1.0f);
  ref->allreduce(view_of(v.data(), v.size()), ReduceOp::sum).wait();
  EXPECT_EQ(v[0], static_cast<float>(comm().size()));
  Work gate = Work::pending("gate", std::chrono::seconds(10));
  Work chained = gate.then_work([ref, &v](const Work&) {
    return ref->allreduce(view_of(v.data(), v.size()), ReduceOp::sum);
  });
  sub.reset();
  gate.complete();
  auto e = chained.error();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::unavailable);
  EXPECT_NE(std::string(e->what()).find("destroyed"), std::string::npos) << e->what();
  EXPECT_EQ(ref->rank(), comm().rank());  // the reference itself stays valid
}

TEST(Errors, BadArgumentsAreRefusedAtTheCallNamingTheRank) {
  const int n = comm().size(), r = comm().rank();
  std::vector<float> a(10), b(11);
  std::vector<int32_t> ints(10);
  auto expect_invalid = [&](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      std::string msg = e.what();
      EXPECT_NE(msg.find("rank " + std::to_string(r)), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expect_invalid(
      [&] { comm().allreduce(view_of(a.data(), 10), view_of(b.data(), 11), ReduceOp::sum); },
      "elements");
  expect_invalid([&] { comm().allreduce(view_of(ints.data(), 10), ReduceOp::avg); }, "avg");
  expect_invalid([&] { comm().broadcast(view_of(a.data(), 10), n); }, "root");
  expect_invalid([&] { comm().allgather(view_of(a.data(), 10), view_of(b.data(), 11)); }, "output");
  expect_invalid([&] { comm().send(view_of(a.data(), 10), r, 0); }, "itself");
  expect_invalid(
      [&] {
        comm().allreduce(TensorView{a.data(), DType::f32, 10, Device::cuda(0)}, ReduceOp::sum);
      },
      "cuda:0");
  std::vector<float> c(10 * n), d(10 * n);
  expect_invalid([&] { comm().alltoall(view_of(c.data(), c.size()), view_of(c.data(), c.size())); },
                 "overlap");
  expect_invalid([&] { comm().alltoall(view_of(c.data(), c.size()), view_of(d.data(), 1)); },
                 "elements");
  if (n > 1)
    expect_invalid(
        [&] { comm().alltoall(view_of(c.data(), 10 * n + 1), view_of(d.data(), 10 * n + 1)); },
        "multiple");
  expect_invalid(
      [&] {
        comm().alltoallv(view_of(c.data(), c.size()), std::vector<size_t>(n + 1, 1),
                         view_of(d.data(), d.size()), std::vector<size_t>(n, 10));
      },
      "one per rank");
  expect_invalid(
      [&] {
        comm().alltoallv(view_of(c.data(), c.size()), std::vector<size_t>(n, 9),
                         view_of(d.data(), d.size()), std::vector<size_t>(n, 10));
      },
      "add up");
  if (n > 1)
    expect_invalid([&] { comm().send(view_of(a.data(), 10), (r + 1) % n, kAlltoallTag); },
                   "alltoall's own");
  // The communicator is still usable after refused calls.
  float x = 1.0f;
  comm().allreduce(view_of(&x, 1), ReduceOp::sum).wait();
  EXPECT_EQ(x, static_cast<float>(n));
}

}  // namespace
}  // namespace collie
