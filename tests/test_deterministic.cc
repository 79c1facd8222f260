// tests/test_deterministic.cc: COLLIE_DETERMINISTIC's all-reduce and
// reduce-scatter (comm/deterministic.h) over the fake backend, 1 to 8 ranks
// as threads: bit for bit the serial sum in rank order
// (deterministic_reference.h) for every dtype, op and count, in place and
// not; the plan's choices at their edges; and a rank without the mode told
// so at the first all-reduce.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "collie/collie.h"
#include "comm/deterministic.h"
#include "deterministic_reference.h"
#include "fake_device.h"
#include "fake_world.h"

namespace collie {
namespace {

using testing::det_input;
using testing::det_reference;

void deterministic(Options& o) {
  o.deterministic = 1;
}

TEST(Deterministic, EveryDtypeOpAndCountIsTheRankOrderSumBitForBit) {
  // 3 and 97 against every rank count: below the ranks, a tail, gathered
  // whole; 20000 (f32: 80 KB x ranks) by all-to-all, with and without a tail.
  for (int n : {1, 2, 3, 5, 8}) {
    auto ended = run_world(
        n,
        [&](Communicator& c) {
          return testing::check_deterministic(c, {1, 3, 97, 20001});
        },
        std::chrono::milliseconds(60000), deterministic);
    expect_all_ok(ended, std::to_string(n) + " ranks");
  }
}

TEST(Deterministic, WithoutTheModeTheSumsDependOnTheAlgorithm) {
  // What the mode is for: at 5 ranks the default all-reduce of these
  // inputs is not the rank-order sum (the check above would be vacuous if
  // it were).
  auto ended = run_world(5, [&](Communicator& c) -> std::string {
    const size_t count = 20000;
    std::vector<std::vector<uint8_t>> in;
    for (int q = 0; q < 5; ++q) in.push_back(det_input(DType::f32, ReduceOp::sum, q, count, 3));
    const auto want = det_reference(DType::f32, ReduceOp::sum, in, count);
    std::vector<uint8_t> buf = in[c.rank()];
    c.allreduce(TensorView{buf.data(), DType::f32, count, Device::cpu()}, ReduceOp::sum).wait();
    return std::memcmp(buf.data(), want.data(), want.size()) == 0 ? "the same bits" : "";
  });
  expect_all_ok(ended, "default mode");
}

TEST(Deterministic, ARankWithoutTheModeIsToldSoAtTheFirstAllreduce) {
  auto ended = run_world(
      3,
      [&](Communicator& c) -> std::string {
        std::vector<float> v(50000, 1.0f);
        c.allreduce(view_of(v.data(), v.size()), ReduceOp::sum).wait();
        return "no error";
      },
      std::chrono::milliseconds(5000), [](Options& o) { o.deterministic = o.rank == 1 ? 0 : 1; });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(ended[r].error.find("COLLIE_DETERMINISTIC (Options::deterministic) is on for one "
                                  "and off for the other"),
              std::string::npos)
        << "rank " << r << ": " << ended[r].error << ended[r].failures;
}

TEST(Deterministic, ThePlanGathersSmallOpsWholeAndCutsLargeOnesInBlocks) {
  // All-reduce: under 64 KiB gathered in all, or fewer elements than ranks,
  // or no all-to-all of the backend's own: one all-gather.
  auto p = plan_deterministic(OpKind::allreduce, 4096, 4, 4, true);  // 64 KiB gathered
  EXPECT_TRUE(p.gather_all);
  EXPECT_EQ(p.steps, 1);
  p = plan_deterministic(OpKind::allreduce, 4097, 4, 4, true);
  EXPECT_FALSE(p.gather_all);
  EXPECT_EQ(p.block, 1024u);
  EXPECT_EQ(p.tail, 1u);
  EXPECT_EQ(p.steps, 3);
  p = plan_deterministic(OpKind::allreduce, 8192, 4, 4, true);
  EXPECT_EQ(p.tail, 0u);
  EXPECT_EQ(p.steps, 2);
  EXPECT_TRUE(plan_deterministic(OpKind::allreduce, 1 << 20, 4, 4, false).gather_all);
  p = plan_deterministic(OpKind::reduce_scatter, 1 << 20, 4, 4, true);
  EXPECT_FALSE(p.gather_all);
  EXPECT_EQ(p.block, 1u << 20);
  EXPECT_EQ(p.steps, 1);
}

TEST(Deterministic, ARankThatVanishesMidwayIsNamedNotWaitedFor) {
  // Rank 2 vanishes at its 4th posted message: inside the all-to-all or
  // the all-gather of a large all-reduce's steps.
  ScopedEnv vanish("COLLIE_FAKE_VANISH", "2:4");
  auto ended = run_world(
      4,
      [](Communicator& c) -> std::string {
        std::vector<float> v(100000, 1.f);
        try {
          for (int i = 0; i < 3; ++i)
            c.allreduce(view_of(v.data(), v.size()), ReduceOp::sum).wait();
          return "finished although rank 2 vanished";
        } catch (const Error& e) {
          const std::string what = e.what();
          if (c.rank() != 2 && what.find("rank 2") == std::string::npos)
            return "the error does not name rank 2: " + what;
          return "";
        }
      },
      std::chrono::milliseconds(20000), deterministic);
  expect_all_ok(ended, "a vanished rank");
}

TEST(Deterministic, DeviceTensorsAreRefusedWhereTheirBitsWouldDependOnTheBackend) {
  // A fake device (its memory is host memory), installed for this process;
  // only the front's refusals are asked of it here. At three ranks every
  // device reduction is refused; at two, the device average only (NCCL's
  // multiplies each input by 1/n before summing).
  static const auto device = [] {
    auto a = std::make_shared<fake::FakeCuda>(1);
    cuda::set_device_api(a);
    return a;
  }();
  for (int n : {2, 3})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      if (n == 2 && op == ReduceOp::sum) continue;  // allowed: it would reach the backend
      auto ended = run_world(
          n,
          [&](Communicator& c) -> std::string {
            std::vector<float> v(64, 1.0f);
            TensorView t = view_of(v.data(), v.size());
            t.device = Device::cuda(0);
            try {
              c.allreduce(t, t, op).wait();
            } catch (const Error& e) {
              return std::string(e.what()).find(
                         "COLLIE_DETERMINISTIC (Options::deterministic) "
                         "reduces host memory only; this tensor is on "
                         "cuda:0") == std::string::npos
                         ? std::string("told: ") + e.what()
                         : "";
            }
            return "not refused";
          },
          milliseconds(20000), [](Options& o) { o.deterministic = 1; });
      expect_all_ok(ended, std::to_string(n) + " ranks, " + std::string(to_string(op)));
    }
}

TEST(Deterministic, TheCAbiTurnsItOnAndOff) {
  // 3 ranks through the C ABI with the mode on and then off: on, the
  // rank-order sum to the bit; off, these inputs give other bits (the fake
  // backend runs tcp's ring).
  constexpr int n = 3;
  const size_t count = 30001;
  std::vector<std::vector<uint8_t>> in;
  for (int q = 0; q < n; ++q) in.push_back(det_input(DType::f32, ReduceOp::sum, q, count, 5));
  const auto want = det_reference(DType::f32, ReduceOp::sum, in, count);
  for (int mode : {1, 0}) {
    std::vector<int> same(n, -1);
    const auto bad = run_c_world(
        n, "det_c_abi",
        [&](collie_comm* comm, int r) -> std::string {
          std::vector<uint8_t> buf = in[r];
          collie_tensor t{};
          t.data = buf.data();
          t.numel = count;
          t.dtype = COLLIE_F32;
          if (collie_comm_allreduce(comm, t, t, COLLIE_SUM, nullptr) != COLLIE_OK)
            return std::string("allreduce: ") + collie_last_error();
          same[r] = std::memcmp(buf.data(), want.data(), want.size()) == 0;
          return "";
        },
        [&](collie_comm_options& o) { o.deterministic = mode; });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(bad[r], "") << "rank " << r;
      EXPECT_EQ(same[r], mode) << "rank " << r << ", deterministic=" << mode;
    }
  }
}

}  // namespace
}  // namespace collie
