// tests/test_buckets.cc: bucket assignment against hand-worked answers.
#include <gtest/gtest.h>

#include "buckets/bucket_plan.h"
#include "collie/error.h"

namespace collie {
namespace {

constexpr size_t KiB = 1024;

std::vector<ParamSpec> f32_params(std::vector<size_t> numels) {
  std::vector<ParamSpec> v;
  for (size_t n : numels) v.push_back({n, DType::f32, Device::cpu()});
  return v;
}

TEST(BucketPlan, ReverseRegistrationOrderWithSmallFirstBucket) {
  // 6 params of 256 KiB (f32 x 65536). First cap 512 KiB: params 5, 4.
  // Then 1 MiB caps: 3, 2, 1, 0 fill exactly one bucket.
  auto params = f32_params(std::vector<size_t>(6, 65536));
  auto plan = BucketPlan::build(params, {}, 512 * KiB, 1024 * KiB);
  ASSERT_EQ(plan.buckets().size(), 2u);
  EXPECT_EQ(plan.buckets()[0].params, (std::vector<size_t>{5, 4}));
  EXPECT_EQ(plan.buckets()[0].offsets, (std::vector<size_t>{0, 65536}));
  EXPECT_EQ(plan.buckets()[1].params, (std::vector<size_t>{3, 2, 1, 0}));
  EXPECT_EQ(plan.buckets()[1].numel, 4u * 65536);
  EXPECT_EQ(plan.bucket_of(4), 0u);
  EXPECT_EQ(plan.slot_of(4), 1u);
  EXPECT_EQ(plan.bucket_of(0), 1u);
  EXPECT_EQ(plan.slot_of(0), 3u);
}

TEST(BucketPlan, OversizedParameterGetsABucketOfItsOwn) {
  auto params = f32_params({10, 1u << 20, 10});  // 4 MiB in the middle
  auto plan = BucketPlan::build(params, {}, 1024 * KiB, 1024 * KiB);
  ASSERT_EQ(plan.buckets().size(), 2u);
  EXPECT_EQ(plan.buckets()[0].params, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(plan.buckets()[1].params, (std::vector<size_t>{0}));
}

TEST(BucketPlan, DtypesAndDevicesNeverShareABucket) {
  std::vector<ParamSpec> params = {{100, DType::f32, Device::cpu()},
                                   {100, DType::f16, Device::cpu()},
                                   {100, DType::f32, Device::cpu()},
                                   {100, DType::f32, Device::cuda(0)},
                                   {100, DType::f16, Device::cpu()}};
  auto plan = BucketPlan::build(params, {}, 1 << 20, 25 << 20);
  ASSERT_EQ(plan.buckets().size(), 3u);
  for (const auto& b : plan.buckets())
    for (size_t p : b.params) {
      EXPECT_EQ(params[p].dtype, b.dtype);
      EXPECT_EQ(params[p].device, b.device);
    }
  EXPECT_EQ(plan.buckets()[0].params, (std::vector<size_t>{4, 1}));  // f16, first seen
  EXPECT_EQ(plan.buckets()[1].params, (std::vector<size_t>{3}));     // cuda:0
  EXPECT_EQ(plan.buckets()[2].params, (std::vector<size_t>{2, 0}));  // f32 cpu
  EXPECT_EQ(plan.buckets()[0].nbytes(), 400u);
}

TEST(BucketPlan, RebuiltFromObservedOrder) {
  auto params = f32_params({1000, 1000, 1000, 1000});
  auto plan = BucketPlan::build(params, {1, 3, 0, 2}, 8000, 8000);
  ASSERT_EQ(plan.buckets().size(), 2u);
  EXPECT_EQ(plan.buckets()[0].params, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(plan.buckets()[1].params, (std::vector<size_t>{0, 2}));
  EXPECT_NE(plan.fingerprint(), BucketPlan::build(params, {}, 8000, 8000).fingerprint());
  EXPECT_EQ(plan.fingerprint(), BucketPlan::build(params, {1, 3, 0, 2}, 8000, 8000).fingerprint());
}

TEST(BucketPlan, BadOrdersAreRefused) {
  auto params = f32_params({1, 2, 3});
  EXPECT_THROW(BucketPlan::build(params, {0, 1}, 10, 10), Error);
  EXPECT_THROW(BucketPlan::build(params, {0, 1, 1}, 10, 10), Error);
  EXPECT_THROW(BucketPlan::build(params, {0, 1, 3}, 10, 10), Error);
}

TEST(FlatBuffer, AllocatedZeroedAndSliced) {
  auto f = FlatBuffer::allocate(DType::f64, 10);
  auto* d = static_cast<double*>(f.view().data);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(d[i], 0.0);
  auto s = f.slice(4, 3);
  static_cast<double*>(s.data)[0] = 7.0;
  EXPECT_EQ(d[4], 7.0);
  f.zero();
  EXPECT_EQ(d[4], 0.0);
  EXPECT_THROW(f.slice(8, 3), Error);
  std::vector<double> mine(5, 1.0);
  auto b = FlatBuffer::borrow(view_of(mine.data(), 5));
  b.zero();
  EXPECT_EQ(mine[2], 0.0);
}

}  // namespace
}  // namespace collie
