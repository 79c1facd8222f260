// tests/test_shm_steps.cc: the shm backend's collectives (comm/shm/steps.h)
// over the in-process fake segment (tests/fake_segment.h), every path of
// each (inline, one step, rounds, direct reads, the whole buffer at two
// ranks, in place over registered memory) at 1 to 8 ranks, against serial
// float64 references; then ranks that disagree, one that never calls, one
// that vanishes and one that aborts, each named on every other rank. The
// multi-process suites (shm_collectives_np*) run the same steps over the
// real segment.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/trace.h"
#include "comm/deterministic.h"
#include "comm/shm/region.h"
#include "comm/shm/steps.h"
#include "fake_segment.h"
#include "mp_common.h"

// Its own namespace: the sanitizer builds compile the test files as one
// (a unity build), beside test_algorithms.cc's helpers of the same names.
namespace collie::shm_steps_test {
namespace {

using namespace std::chrono_literals;
using shm::ShmSteps;
using testing::combine;
using testing::exact_value;
using testing::FakeSegment;
using testing::FakeShmWorld;
using testing::get;
using testing::put;
using Steps = ShmSteps<FakeSegment>;

// fn(rank, steps) on one thread per rank of `w`; what each returned, or
// "error <code>: <message>" where it threw.
std::vector<std::string> on_ranks(FakeShmWorld& w,
                                  const std::function<std::string(int, Steps&)>& fn) {
  std::vector<std::string> said(static_cast<size_t>(w.n));
  std::vector<std::thread> threads;
  for (int r = 0; r < w.n; ++r)
    threads.emplace_back([&, r] {
      try {
        Steps steps(r, w.n, RankNames{}, w, r);
        said[r] = fn(r, steps);
      } catch (const Error& e) {
        said[r] = "error " + std::string(to_string(e.code())) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return said;
}

double want_reduced(ReduceOp op, DType t, int n, size_t i, uint64_t salt) {
  double want = exact_value(op, 0, i, salt);
  for (int q = 1; q < n; ++q) want = combine(op, want, exact_value(op, q, i, salt));
  if (op == ReduceOp::avg) want = testing::rounded(t, want / n);
  return want;
}

// A buffer of `bytes` in ordinary memory or in a registered region (which
// peers map: the in-place path).
struct Buffer {
  std::vector<uint8_t> plain;
  std::shared_ptr<void> region;
  uint8_t* data = nullptr;
  Buffer(size_t bytes, bool registered, uint8_t fill) {
    if (registered) {
      region = shm::allocate_region(bytes + 1);
      data = static_cast<uint8_t*>(region.get());
    } else {
      plain.resize(bytes + 1);
      data = plain.data();
    }
    std::memset(data, fill, bytes + 1);
  }
};

struct Call {
  OpKind kind;
  DType t;
  ReduceOp op;
  size_t count;  // elements per rank's block (all-reduce: the buffer)
  bool in_place;
  bool registered;
  int root;
  int32_t tag;
  std::string label(int n) const {
    return std::string(to_string(kind)) + " " + std::string(to_string(t)) + " " +
           std::string(to_string(op)) + " x" + std::to_string(count) +
           (in_place ? " in place" : "") + (registered ? " registered" : "") + " root " +
           std::to_string(root) + " at " + std::to_string(n) + " ranks";
  }
};

// Runs `c` as op number `seq` on rank r and checks what it ended with
// against the serial reference; returns what is wrong ("" if nothing) and
// sets `path` to the algorithm the steps took.
std::string run_call(const Call& c, uint32_t seq, int r, int n, Steps& steps, const char*& path) {
  const size_t es = dtype_size(c.t);
  const uint64_t salt = seq;
  Op op;
  op.desc.op = c.kind;
  op.desc.dtype = c.t;
  op.desc.redop = c.op;
  op.desc.seq = seq;
  op.desc.tag = c.kind == OpKind::broadcast ? c.root : c.tag;
  trace::OpSpan span;
  op.trace = &span;
  const size_t blocks = (c.kind == OpKind::allreduce || c.kind == OpKind::broadcast) ? 1 : n;
  const size_t in_elems = c.kind == OpKind::allgather ? c.count : c.count * blocks;
  const size_t out_elems = c.kind == OpKind::reduce_scatter ? c.count : c.count * blocks;
  Buffer in(in_elems * es, c.registered, 0), out(out_elems * es, c.registered, 0xcd);
  auto value = [&](int rank, size_t i) { return exact_value(c.op, rank, i, salt); };
  for (size_t i = 0; i < in_elems; ++i) put(c.t, in.data, i, value(r, i));
  uint8_t* dst = out.data;
  if (c.in_place) {
    if (c.kind == OpKind::allgather) {  // this rank's block of the output is the input
      for (size_t i = 0; i < c.count; ++i) put(c.t, out.data, r * c.count + i, value(r, i));
      op.in = TensorView{out.data + r * c.count * es, c.t, c.count, Device::cpu()};
    } else {
      dst = in.data;
    }
  }
  if (!op.in.data) op.in = TensorView{in.data, c.t, in_elems, Device::cpu()};
  op.out = TensorView{dst, c.t, out_elems, Device::cpu()};
  if (c.kind == OpKind::broadcast) op.out = op.in;
  op.desc.count = op.in.numel;
  steps.collective(op, Deadline::clock::now() + 60s);
  path = span.algorithm.load();
  size_t wrong = 0;
  std::string first;
  auto check = [&](size_t i, double got, double want) {
    if (got != want && wrong++ == 0)
      first = "element " + std::to_string(i) + " is " + std::to_string(got) + ", not " +
              std::to_string(want);
  };
  switch (c.kind) {
    case OpKind::allreduce:
      for (size_t i = 0; i < c.count; ++i)
        check(i, get(c.t, dst, i), want_reduced(c.op, c.t, n, i, salt));
      break;
    case OpKind::broadcast:
      for (size_t i = 0; i < c.count; ++i) check(i, get(c.t, op.in.data, i), value(c.root, i));
      break;
    case OpKind::allgather:
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < c.count; ++i)
          check(q * c.count + i, get(c.t, out.data, q * c.count + i), value(q, i));
      break;
    case OpKind::reduce_scatter:
      for (size_t i = 0; i < c.count; ++i)
        check(i, get(c.t, dst, i), want_reduced(c.op, c.t, n, r * c.count + i, salt));
      break;
    case OpKind::alltoall:
      // Block q of this rank's output is block r of rank q's input.
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < c.count; ++i)
          check(q * c.count + i, get(c.t, dst, q * c.count + i), value(q, r * c.count + i));
      break;
    default:
      break;
  }
  // Nothing written past the output.
  if (c.kind != OpKind::broadcast && !c.in_place && out.data[out_elems * es] != 0xcd)
    return c.label(n) + ": wrote past the output";
  if (wrong)
    return c.label(n) + " on rank " + std::to_string(r) + " (" + (path ? path : "?") +
           "): " + std::to_string(wrong) + " wrong, " + first;
  return "";
}

// The calls of one sweep: every collective, at counts that take each path
// in a FakeShmWorld(n, kChunk, 512, ...): inline up to 224 bytes, one step
// up to 512, then rounds of kChunk per rank, or direct reads from 32 KiB
// where the world allows them (a broadcast up to two rounds).
constexpr size_t kChunk = 20480;

std::vector<Call> sweep_calls(int n) {
  std::vector<Call> calls;
  for (DType t : {DType::f32, DType::f64, DType::i32})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && t == DType::i32) continue;
      for (size_t bytes : {size_t{16}, size_t{200}, size_t{480}, size_t{10000}, size_t{40000}}) {
        const size_t count = bytes / dtype_size(t);
        for (bool in_place : {false, true}) {
          calls.push_back({OpKind::allreduce, t, op, count, in_place, false, 0, 0});
          if (in_place && bytes >= 10000)
            calls.push_back({OpKind::allreduce, t, op, count, true, true, 0, 0});
        }
        if (t != DType::f32) continue;  // the data movers once, the reducers in every dtype
        const size_t block = std::max<size_t>(count / static_cast<size_t>(n), 1);
        calls.push_back({OpKind::reduce_scatter, t, op, block, false, false, 0, 0});
        calls.push_back(
            {OpKind::reduce_scatter, t, op, block, false, false, 0, kDeterministicReduceScatter});
        if (op != ReduceOp::sum) continue;
        calls.push_back({OpKind::broadcast, t, op, count, true, false, n - 1, 0});
        calls.push_back({OpKind::allgather, t, op, block, false, false, 0, 0});
        calls.push_back({OpKind::allgather, t, op, block, true, false, 0, 0});
        calls.push_back({OpKind::alltoall, t, op, block, false, false, 0, 0});
        calls.push_back({OpKind::barrier, t, op, 0, false, false, 0, 0});
      }
    }
  return calls;
}

// Runs the sweep at n ranks on `w`; returns every rank's failures and
// adds the paths taken, per collective, to `paths`.
std::string run_sweep(FakeShmWorld& w, std::map<std::string, std::set<std::string>>& paths) {
  const int n = w.n;
  const std::vector<Call> calls = sweep_calls(n);
  std::vector<std::vector<const char*>> taken(static_cast<size_t>(n));
  auto said = on_ranks(w, [&](int r, Steps& steps) {
    std::string wrong;
    uint32_t seq = 1;
    for (const Call& c : calls) {
      const char* path = nullptr;
      std::string why = run_call(c, seq++, r, n, steps, path);
      taken[r].push_back(path);
      if (!why.empty()) wrong += why + "\n";
    }
    return wrong;
  });
  std::string all;
  for (int r = 0; r < n; ++r) all += said[r];
  for (size_t i = 0; i < calls.size(); ++i)
    for (int r = 0; r < n; ++r)
      if (taken[r].size() > i && taken[r][i])
        paths[std::string(to_string(calls[i].kind))].insert(taken[r][i]);
  return all;
}

TEST(ShmSteps, EveryPathMatchesTheSerialReferenceAt1To8Ranks) {
  std::map<std::string, std::set<std::string>> paths;
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int variant = 0; variant < 3; ++variant) {
      // 0: no direct reads (rounds); 1: every rank reads its peers' memory;
      // 2: it could, but the last rank cannot pin its buffers (every rank
      // must then take the rounds).
      FakeShmWorld w(n, kChunk, 512, variant != 0);
      if (variant == 2) w.offers_direct[n - 1] = false;
      SCOPED_TRACE(std::to_string(n) + " ranks, variant " + std::to_string(variant));
      EXPECT_EQ(run_sweep(w, paths), "");
    }
  // Every path of each collective ran somewhere in the sweep.
  const std::map<std::string, std::set<std::string>> want = {
      {"allreduce", {"local", "inline", "one_step", "rounds", "direct", "whole", "in_place"}},
      {"broadcast", {"direct", "rounds"}},
      {"allgather", {"direct", "rounds"}},
      {"reduce_scatter", {"direct", "rounds"}},
      {"alltoall", {"local", "inline", "one_step", "direct", "rounds"}},
      {"barrier", {"flags"}},
  };
  for (const auto& [kind, names] : want)
    for (const std::string& name : names)
      EXPECT_TRUE(paths[kind].count(name)) << kind << " never took its " << name << " path";
}

// Op number 1, an in-place f32 sum over the first `count` elements of buf.
Op first_allreduce(std::vector<float>& buf, size_t count) {
  Op op;
  op.desc.op = OpKind::allreduce;
  op.desc.dtype = DType::f32;
  op.desc.seq = 1;
  op.desc.count = count;
  op.in = op.out = TensorView{buf.data(), DType::f32, count, Device::cpu()};
  return op;
}

// Ranks that call different collectives: every rank's error names the other
// call, before any data moves.
TEST(ShmSteps, RanksThatDisagreeGetAMismatchNamingTheOther) {
  FakeShmWorld w(3, 4096, 512, true);
  auto said = on_ranks(w, [&](int r, Steps& steps) {
    std::vector<float> buf(100, 1.0f);
    const Op op = first_allreduce(buf, r == 2 ? 99 : 100);  // rank 2 passes one element fewer
    steps.collective(op, Deadline::clock::now() + 10s);
    return std::string("returned");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(said[r].find("error mismatch"), std::string::npos) << "rank " << r << ": " << said[r];
    EXPECT_NE(said[r].find(r == 2 ? "rank 0" : "rank 2"), std::string::npos)
        << "rank " << r << ": " << said[r];
  }
}

// A rank that never calls: its partners time out at their deadline, naming it.
TEST(ShmSteps, ARankThatNeverCallsTimesOutItsPartnersNamingIt) {
  FakeShmWorld w(4, 4096, 512, true);
  auto said = on_ranks(w, [&](int r, Steps& steps) {
    if (r == 3) return std::string("stayed away");
    std::vector<float> buf(20000, 1.0f);  // a direct all-reduce
    const Op op = first_allreduce(buf, buf.size());
    steps.collective(op, Deadline::clock::now() + 200ms);
    return std::string("returned");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(said[r].find("error timeout"), std::string::npos) << "rank " << r << ": " << said[r];
    EXPECT_NE(said[r].find("waiting for rank 3"), std::string::npos)
        << "rank " << r << ": " << said[r];
  }
}

// A rank that vanishes, or aborts, mid-collective (after its arrival, in
// the rounds): every other rank's error names it.
TEST(ShmSteps, AVanishingOrAbortingRankIsNamedOnEverySurvivor) {
  for (bool vanish : {true, false}) {
    FakeShmWorld w(3, 4096, 512, false);
    auto said = on_ranks(w, [&](int r, Steps& steps) {
      std::vector<float> buf(20000, 1.0f);  // rounds: several waits
      const Op op = first_allreduce(buf, buf.size());
      if (r == 1) {
        // Its arrival, then nothing more: gone, or given up.
        FakeSegment& seg = steps.segment();
        seg.desc(1, 1).seq = 1;
        seg.desc(1, 1).op = static_cast<uint8_t>(OpKind::allreduce);
        seg.desc(1, 1).dtype = static_cast<uint8_t>(DType::f32);
        seg.desc(1, 1).count = buf.size();
        seg.advance();
        if (vanish)
          w.dead[1] = true;
        else
          seg.abort("out of memory on rank 1");
        return std::string("left");
      }
      steps.collective(op, Deadline::clock::now() + 30s);
      return std::string("returned");
    });
    for (int r : {0, 2}) {
      const std::string want = vanish ? "error peer_lost" : "error aborted";
      EXPECT_NE(said[r].find(want), std::string::npos) << "rank " << r << ": " << said[r];
      EXPECT_NE(said[r].find("rank 1"), std::string::npos) << "rank " << r << ": " << said[r];
    }
  }
}

}  // namespace
}  // namespace collie::shm_steps_test
