// TensorRowsIterator and RangeIterator (IteratorGetNext, IteratorReset)
// through the public Session.
#include <graphrun/graphrun.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::make_session;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::HasSubstr;

#define ASSERT_GRAPH_OK(g) ASSERT_THAT((g).status(), StatusIs(StatusCode::kOk, ""))

Result<Tensor> fetch(Session& s, const Output& out) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> values, s.run({}, {out}));
  return values.at(0);
}

TEST(IteratorOpsTest, RowsThenEndOfSequence) {
  Graph g;
  ops::Iterator it =
      ops::TensorRowsIterator(g, Tensor::matrix<int32_t>({{1, 2}, {3, 4}, {5, 6}}), "rows");
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(it.next.node()->name(), "rows");
  EXPECT_EQ(it.next.dtype(), DType::kInt32);
  EXPECT_EQ(it.next.shape(), (Shape{2}));
  ASSERT_NE(it.initializer, nullptr);
  EXPECT_EQ(it.initializer->name(), "rows/initializer");

  auto s = make_session(g);
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor{1, 2})));
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor{3, 4})));
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor{5, 6})));
  Result<Tensor> end = fetch(*s, it.next);
  EXPECT_THAT(end, StatusIs(StatusCode::kOutOfRange, "End of sequence"));
  EXPECT_THAT(end.status().message(), HasSubstr("rows"));
  EXPECT_THAT(fetch(*s, it.next), StatusIs(StatusCode::kOutOfRange, "End of sequence"));
}

TEST(IteratorOpsTest, RowsOfHigherRankAndBool) {
  Graph g;
  ops::Iterator cube =
      ops::TensorRowsIterator(g, Tensor(Shape{2, 2, 2}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}));
  ops::Iterator flags = ops::TensorRowsIterator(g, Tensor{true, false});
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(cube.next.shape(), (Shape{2, 2}));
  EXPECT_EQ(flags.next.shape(), Shape{});
  auto s = make_session(g);
  ASSERT_THAT(fetch(*s, cube.next), IsOk());
  EXPECT_THAT(fetch(*s, cube.next),
              IsOkAndHolds(TensorEq(Tensor::matrix<double>({{5.0, 6.0}, {7.0, 8.0}}))));
  EXPECT_THAT(fetch(*s, flags.next), IsOkAndHolds(TensorEq(Tensor(true))));
  EXPECT_THAT(fetch(*s, flags.next), IsOkAndHolds(TensorEq(Tensor(false))));
}

TEST(IteratorOpsTest, RowsAreCopies) {
  Graph g;
  ops::Iterator it = ops::TensorRowsIterator(g, Tensor::matrix<float>({{1, 2}, {3, 4}}));
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  Result<Tensor> row = fetch(*s, it.next);
  ASSERT_THAT(row, IsOk());
  row->flat<float>()[0] = 100.0f;
  ASSERT_THAT(s->run({}, {}, {it.initializer}), IsOk());
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f})));
}

TEST(IteratorOpsTest, Range) {
  Graph g;
  ops::Iterator up = ops::RangeIterator(g, 0, 10, 3, "up");
  ops::Iterator down = ops::RangeIterator(g, 5, 0, -2, "down");
  ops::Iterator empty = ops::RangeIterator(g, 3, 3, 1, "empty");
  ASSERT_GRAPH_OK(g);
  EXPECT_EQ(up.next.dtype(), DType::kInt64);
  EXPECT_EQ(up.next.shape(), Shape{});
  auto s = make_session(g);
  for (int64_t v : {0, 3, 6, 9}) {
    EXPECT_THAT(fetch(*s, up.next), IsOkAndHolds(TensorEq(Tensor(v))));
  }
  EXPECT_THAT(fetch(*s, up.next), StatusIs(StatusCode::kOutOfRange, "up"));
  for (int64_t v : {5, 3, 1}) {
    EXPECT_THAT(fetch(*s, down.next), IsOkAndHolds(TensorEq(Tensor(v))));
  }
  EXPECT_THAT(fetch(*s, down.next), StatusIs(StatusCode::kOutOfRange, "down"));
  EXPECT_THAT(fetch(*s, empty.next), StatusIs(StatusCode::kOutOfRange, "End of sequence"));
}

TEST(IteratorOpsTest, RangeAtTheInt64Limits) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, kMin, kMax, kMax);
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(kMin))));
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{-1}))));
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(kMax - 1))));
  EXPECT_THAT(fetch(*s, it.next), StatusIs(StatusCode::kOutOfRange, "End of sequence"));
}

TEST(IteratorOpsTest, InitializerRewinds) {
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, 0, 2);
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{0}))));
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{1}))));
  EXPECT_THAT(fetch(*s, it.next), StatusIs(StatusCode::kOutOfRange, "End of sequence"));
  ASSERT_THAT(s->run({}, {}, {it.initializer}), IsOk());
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{0}))));
  // Mid-sequence too.
  ASSERT_THAT(s->run({}, {}, {it.initializer}), IsOk());
  EXPECT_THAT(fetch(*s, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{0}))));
}

TEST(IteratorOpsTest, StateIsPerSession) {
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, 0, 5);
  ASSERT_GRAPH_OK(g);
  auto s1 = make_session(g);
  auto s2 = make_session(g);
  EXPECT_THAT(fetch(*s1, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{0}))));
  EXPECT_THAT(fetch(*s1, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{1}))));
  EXPECT_THAT(fetch(*s2, it.next), IsOkAndHolds(TensorEq(Tensor(int64_t{0}))));
}

TEST(IteratorOpsTest, OneAdvancePerRunEvenWhenFetchedTwice) {
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, 0, 10);
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  for (int64_t i = 0; i < 3; ++i) {
    Result<std::vector<Tensor>> r = s->run({}, {it.next, it.next});
    ASSERT_THAT(r, IsOk());
    EXPECT_THAT(r->at(0), TensorEq(Tensor(i)));
    EXPECT_THAT(r->at(1), TensorEq(Tensor(i)));
  }
}

TEST(IteratorOpsTest, BuildTimeErrors) {
  {
    Graph g;
    ops::Iterator it = ops::RangeIterator(g, 0, 10, 0, "zero_step");
    EXPECT_FALSE(it.next.is_valid());
    EXPECT_EQ(it.initializer, nullptr);
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "zero_step"));
    EXPECT_THAT(g.status().message(), HasSubstr("step"));
  }
  {
    Graph g;
    ops::Iterator it = ops::TensorRowsIterator(g, Tensor(1.0f), "scalar");
    EXPECT_FALSE(it.next.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "scalar"));
  }
  {
    Graph g;
    ops::Iterator it = ops::TensorRowsIterator(g, Tensor(), "nothing");
    EXPECT_FALSE(it.next.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "nothing"));
  }
}

// 4 threads pull from one iterator until it ends: every element is seen
// exactly once.
TEST(IteratorOpsTest, ConcurrentRunsGetEachElementOnce) {
  constexpr int64_t kCount = 1000;
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, 0, kCount);
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  std::vector<std::vector<int64_t>> seen(4);
  std::atomic<int> other_errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (;;) {
        Result<std::vector<Tensor>> r = s->run({}, {it.next});
        if (!r.is_ok()) {
          if (r.status().code() != StatusCode::kOutOfRange) other_errors.fetch_add(1);
          return;
        }
        seen[t].push_back(r->at(0).scalar<int64_t>());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(other_errors.load(), 0);
  std::vector<int64_t> all;
  for (const auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kCount);
  for (int64_t i = 0; i < kCount; ++i) expected[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(all, expected);
}

}  // namespace
}  // namespace graphrun
