// RandomUniform and RandomStandardNormal through the public Session, the
// builders' seed rules, and the Philox4x32-10 generator itself.
#include <graphrun/graphrun.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "ops/internal/philox.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::make_session;
using ::graphrun::testing::run_all;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::Not;

#define ASSERT_GRAPH_OK(g) ASSERT_THAT((g).status(), StatusIs(StatusCode::kOk, ""))

Tensor fetch(Session& s, const Output& out) {
  Result<std::vector<Tensor>> r = s.run({}, {out});
  EXPECT_THAT(r, IsOk());
  return r.is_ok() ? r->at(0) : Tensor();
}

template <typename T>
void mean_and_variance(const Tensor& t, double* mean, double* variance) {
  double sum = 0, sum_sq = 0;
  for (T x : t.flat<T>()) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const auto n = static_cast<double>(t.num_elements());
  *mean = sum / n;
  *variance = sum_sq / n - *mean * *mean;
}

int64_t int_attr(const Output& o, const char* name) {
  return o.node()->attr<int64_t>(name).value();
}

// Random123's known-answer vectors for philox4x32_10.
TEST(PhiloxTest, KnownAnswers) {
  using ops_internal::Philox4x32;
  EXPECT_EQ(Philox4x32::compute({0, 0, 0, 0}, {0, 0}),
            (Philox4x32::Block{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32::compute({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                {0xffffffff, 0xffffffff}),
            (Philox4x32::Block{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32::compute({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                                {0xa4093822, 0x299f31d0}),
            (Philox4x32::Block{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(PhiloxTest, StreamLayout) {
  using ops_internal::Philox4x32;
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t seed2 = 0x0370734413198a2eull;
  const uint64_t index = 0x85a308d3243f6a88ull;
  EXPECT_EQ(Philox4x32(seed, seed2)(index),
            Philox4x32::compute({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                                {0xa4093822, 0x299f31d0}));
}

TEST(PhiloxTest, UnitConversions) {
  EXPECT_EQ(ops_internal::uint32_to_unit_float(0), 0.0f);
  EXPECT_LT(ops_internal::uint32_to_unit_float(0xffffffff), 1.0f);
  EXPECT_EQ(ops_internal::uint64_to_unit_double(0, 0), 0.0);
  EXPECT_LT(ops_internal::uint64_to_unit_double(0xffffffff, 0xffffffff), 1.0);
  EXPECT_EQ(ops_internal::uint64_to_unit_double(0x00080000, 0), 0.5);
  const auto z = ops_internal::box_muller(0.0f, 0.0f);  // u1 -> 1: radius 0
  EXPECT_EQ(z[0], 0.0f);
  EXPECT_TRUE(std::isfinite(ops_internal::box_muller(0.9999999, 0.25)[0]));
}

TEST(RandomOpsTest, UniformShapeDtypeAndRange) {
  Graph g;
  Output f = ops::RandomUniform(g, Shape{3, 4});
  Output d = ops::RandomUniform(g, Shape{5}, DType::kFloat64);
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(f.node()->op(), "RandomUniform");
  EXPECT_EQ(f.shape(), (Shape{3, 4}));
  EXPECT_EQ(d.dtype(), DType::kFloat64);
  Result<std::vector<Tensor>> r = run_all(g, {f, d});
  ASSERT_THAT(r, IsOk());
  const Tensor& tf = r->at(0);
  const Tensor& td = r->at(1);
  EXPECT_EQ(tf.debug_type(), "float32[3,4]");
  EXPECT_EQ(td.debug_type(), "float64[5]");
  for (float x : tf.flat<float>()) {
    EXPECT_GE(x, 0.0f);
    EXPECT_LT(x, 1.0f);
  }
  for (double x : td.flat<double>()) {
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
}

TEST(RandomOpsTest, ScalarAndEmptyShapes) {
  Graph g;
  Output scalar = ops::RandomNormal(g, Shape{});
  Output empty = ops::RandomUniform(g, Shape{0, 3});
  ASSERT_GRAPH_OK(g);
  Result<std::vector<Tensor>> r = run_all(g, {scalar, empty});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->at(0).debug_type(), "float32[]");
  EXPECT_EQ(r->at(1).debug_type(), "float32[0,3]");
}

TEST(RandomOpsTest, UniformMoments) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Graph g;
    Output u = ops::RandomUniform(g, Shape{100000}, dtype, {.seed = 7});
    ASSERT_GRAPH_OK(g);
    Result<Tensor> t = run_one(g, u);
    ASSERT_THAT(t, IsOk());
    double mean = 0, variance = 0;
    if (dtype == DType::kFloat32) {
      mean_and_variance<float>(*t, &mean, &variance);
    } else {
      mean_and_variance<double>(*t, &mean, &variance);
    }
    EXPECT_NEAR(mean, 0.5, 0.01) << dtype_name(dtype);
    EXPECT_NEAR(variance, 1.0 / 12, 0.005) << dtype_name(dtype);
  }
}

TEST(RandomOpsTest, StandardNormalMoments) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Graph g;
    Output z = ops::RandomNormal(g, Shape{100000}, dtype, 0.0, 1.0, {.seed = 11});
    ASSERT_GRAPH_OK(g);
    EXPECT_EQ(z.node()->op(), "RandomStandardNormal");
    Result<Tensor> t = run_one(g, z);
    ASSERT_THAT(t, IsOk());
    double mean = 0, variance = 0;
    if (dtype == DType::kFloat32) {
      mean_and_variance<float>(*t, &mean, &variance);
    } else {
      mean_and_variance<double>(*t, &mean, &variance);
    }
    EXPECT_NEAR(mean, 0.0, 0.02) << dtype_name(dtype);
    EXPECT_NEAR(variance, 1.0, 0.03) << dtype_name(dtype);
  }
}

TEST(RandomOpsTest, NormalWithMeanAndStddev) {
  Graph g;
  Output z = ops::RandomNormal(g, Shape{100000}, DType::kFloat32, 3.0, 2.0, {.seed = 5}, "noise");
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(z.node()->name(), "noise");
  EXPECT_EQ(z.node()->op(), "Add");
  ASSERT_NE(g.find_node("noise/RandomStandardNormal"), nullptr);
  ASSERT_NE(g.find_node("noise/mul"), nullptr);
  EXPECT_EQ(z.shape(), (Shape{100000}));
  Result<Tensor> t = run_one(g, z);
  ASSERT_THAT(t, IsOk());
  double mean = 0, variance = 0;
  mean_and_variance<float>(*t, &mean, &variance);
  EXPECT_NEAR(mean, 3.0, 0.05);
  EXPECT_NEAR(variance, 4.0, 0.15);
}

TEST(RandomOpsTest, SameSeedsReplayInANewSession) {
  Graph g;
  Output u = ops::RandomUniform(g, Shape{8}, DType::kFloat32, {.seed = 42});
  ASSERT_GRAPH_OK(g);
  auto s1 = make_session(g);
  Tensor a1 = fetch(*s1, u);
  Tensor a2 = fetch(*s1, u);
  EXPECT_THAT(a2, Not(TensorEq(a1)));  // consecutive runs differ
  auto s2 = make_session(g);
  EXPECT_THAT(fetch(*s2, u), TensorEq(a1));
  EXPECT_THAT(fetch(*s2, u), TensorEq(a2));

  // A separately built graph with the same seeds replays it too.
  Graph g2;
  Output u2 = ops::RandomUniform(g2, Shape{8}, DType::kFloat32, {.seed = 42});
  auto s3 = make_session(g2);
  EXPECT_THAT(fetch(*s3, u2), TensorEq(a1));
}

TEST(RandomOpsTest, UnseededSessionsDiffer) {
  Graph g;
  Output u = ops::RandomUniform(g, Shape{8});
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(int_attr(u, "seed"), 0);
  EXPECT_EQ(int_attr(u, "seed2"), 0);
  auto s1 = make_session(g);
  auto s2 = make_session(g);
  Tensor a = fetch(*s1, u);
  EXPECT_THAT(fetch(*s1, u), Not(TensorEq(a)));
  EXPECT_THAT(fetch(*s2, u), Not(TensorEq(a)));
}

TEST(RandomOpsTest, FetchedTwiceInOneStepIsOneDraw) {
  Graph g;
  Output u = ops::RandomUniform(g, Shape{4}, DType::kFloat32, {.seed = 1});
  Output n = ops::RandomNormal(g, Shape{4}, DType::kFloat64, 0.0, 1.0, {.seed = 1});
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  Result<std::vector<Tensor>> r = s->run({}, {u, n, u, n});
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->at(2), TensorEq(r->at(0)));
  EXPECT_THAT(r->at(3), TensorEq(r->at(1)));
  // And the next step draws new values.
  EXPECT_THAT(fetch(*s, u), Not(TensorEq(r->at(0))));
}

TEST(RandomOpsTest, SeedRules) {
  {
    Graph g;
    g.set_seed(123);
    Output a = ops::RandomUniform(g, Shape{2});
    Output b = ops::RandomUniform(g, Shape{2});
    Output c = ops::RandomUniform(g, Shape{2}, DType::kFloat32, {.seed = 9});
    ASSERT_GRAPH_OK(g);
    EXPECT_EQ(int_attr(a, "seed"), 123);
    EXPECT_EQ(int_attr(b, "seed"), 123);
    EXPECT_NE(int_attr(a, "seed2"), int_attr(b, "seed2"));
    EXPECT_EQ(int_attr(c, "seed"), 123);
    EXPECT_EQ(int_attr(c, "seed2"), 9);
  }
  {
    Graph g;
    Output a = ops::RandomUniform(g, Shape{2}, DType::kFloat32, {.seed = 9});
    ASSERT_GRAPH_OK(g);
    EXPECT_EQ(int_attr(a, "seed"), 87654321);
    EXPECT_EQ(int_attr(a, "seed2"), 9);
  }
  {
    // (0, 0) would read as "unseeded": TF turns it into (0, INT32_MAX).
    Graph g;
    g.set_seed(0);
    Output a = ops::RandomUniform(g, Shape{2}, DType::kFloat32, {.seed = 0});
    ASSERT_GRAPH_OK(g);
    EXPECT_EQ(int_attr(a, "seed"), 0);
    EXPECT_EQ(int_attr(a, "seed2"), 2147483647);
  }
}

TEST(RandomOpsTest, GraphSeedGivesDistinctReproducibleStreams) {
  auto build_and_draw = [](Tensor* a, Tensor* b) {
    Graph g;
    g.set_seed(2024);
    Output x = ops::RandomUniform(g, Shape{16});
    Output y = ops::RandomUniform(g, Shape{16});
    ASSERT_GRAPH_OK(g);
    Result<std::vector<Tensor>> r = run_all(g, {x, y});
    ASSERT_THAT(r, IsOk());
    *a = r->at(0);
    *b = r->at(1);
  };
  Tensor a1, b1, a2, b2;
  build_and_draw(&a1, &b1);
  build_and_draw(&a2, &b2);
  EXPECT_THAT(b1, Not(TensorEq(a1)));
  EXPECT_THAT(a2, TensorEq(a1));
  EXPECT_THAT(b2, TensorEq(b1));
}

TEST(RandomOpsTest, ShapeFromAFedTensor) {
  Graph g;
  Output dims = ops::Placeholder(g, DType::kInt32, Shape{2}, "dims");
  Output u = ops::RandomUniform(g, dims, DType::kFloat64);
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(u.shape().rank(), 2);
  EXPECT_FALSE(u.shape().is_fully_defined());
  auto s = make_session(g);
  Result<std::vector<Tensor>> r = s->run({{dims, Tensor{2, 3}}}, {u});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->at(0).debug_type(), "float64[2,3]");
  EXPECT_THAT(s->run({{dims, Tensor{2, -3}}}, {u}),
              StatusIs(StatusCode::kInvalidArgument, "negative"));
}

TEST(RandomOpsTest, BuildTimeErrors) {
  {
    Graph g;
    Output u = ops::RandomUniform(g, Shape{-1, 2}, DType::kFloat32, {}, "r");
    EXPECT_FALSE(u.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[?,2]"));
  }
  {
    Graph g;
    Output u = ops::RandomUniform(g, Shape{2}, DType::kInt32);
    EXPECT_FALSE(u.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "int32"));
  }
  {
    Graph g;
    Output u = ops::RandomNormal(g, ops::Const(g, Tensor{2.0f}));
    EXPECT_FALSE(u.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "float32"));
  }
  {
    Graph g;
    Output u = ops::RandomUniform(g, ops::Const(g, Tensor{int64_t{2}, int64_t{-1}}));
    EXPECT_FALSE(u.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "negative"));
  }
}

// Concurrent runs reserve disjoint counter ranges: 4 threads x 50 runs draw
// exactly the 200 blocks 200 sequential runs draw, in some order.
TEST(RandomOpsTest, ConcurrentRunsDrawDisjointBlocks) {
  Graph g;
  Output u = ops::RandomUniform(g, Shape{4}, DType::kFloat32, {.seed = 3});
  ASSERT_GRAPH_OK(g);
  auto to_vector = [](const Tensor& t) {
    return std::vector<float>(t.flat<float>().begin(), t.flat<float>().end());
  };
  std::vector<std::vector<float>> sequential;
  {
    auto s = make_session(g);
    for (int i = 0; i < 200; ++i) sequential.push_back(to_vector(fetch(*s, u)));
  }
  auto s = make_session(g);
  std::vector<std::vector<std::vector<float>>> per_thread(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        Result<std::vector<Tensor>> r = s->run({}, {u});
        if (r.is_ok()) per_thread[t].push_back(to_vector(r->at(0)));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::vector<float>> concurrent;
  for (auto& v : per_thread) concurrent.insert(concurrent.end(), v.begin(), v.end());
  std::sort(sequential.begin(), sequential.end());
  std::sort(concurrent.begin(), concurrent.end());
  EXPECT_EQ(concurrent, sequential);
}

}  // namespace
}  // namespace graphrun
