// Concurrency stress tests of one session (docs/concurrency.md,
// "Tests"): locked variable updates from many threads (TensorFlow's
// dense_update_ops_test locking tests), snapshot reads, random streams and
// iterators shared by concurrent runs, a mixed load closed mid-way, calls
// from inside oneTBB tasks and kernels, blocking kernels, plans evicted from
// the plan cache while their runs are in flight, deadlines and close()
// while kernels run, and destroying a session under open handles.
//
// Every test body runs under a watchdog (run_bounded): a deadlock fails the
// test and aborts the binary instead of hanging until ctest's timeout.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "scheduler/flow_graph.h"
#include "tests/testing/op_harness.h"
#include "tests/testing/threads.h"

namespace graphrun {
namespace {

using ::testing::ElementsAre;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::make_session;
using testing::run_bounded;
using testing::run_together;
using testing::StatusIs;
using testing::TensorEq;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

#define ASSERT_GRAPH_OK(g) ASSERT_THAT((g).status(), StatusIs(StatusCode::kOk, ""))

// Runs with `feeds` and returns the value of `out`.
Result<Tensor> fetch(Session& s, const TensorRef& out, const FeedList& feeds = {},
                     const RunOptions& options = {}) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> values, s.run(feeds, {out}, {}, options));
  return values.at(0);
}

template <typename T>
bool all_elements_equal(const Tensor& t) {
  std::span<const T> x = t.flat<T>();
  return std::all_of(x.begin(), x.end(), [&](T e) { return e == x[0]; });
}

template <typename T>
std::vector<T> to_vector(const Tensor& t) {
  std::span<const T> x = t.flat<T>();
  return std::vector<T>(x.begin(), x.end());
}

// A latch of one that may be signalled any number of times (a kernel and a
// failure path may both signal it). Thread safety: thread-safe.
class Signal {
 public:
  void notify() {
    if (!notified_.exchange(true)) latch_.count_down();
  }
  void wait() { latch_.wait(); }

 private:
  std::atomic<bool> notified_{false};
  std::latch latch_{1};
};

// Failures seen on other threads, counted, with the first few kept for the
// report (EXPECT_* inside hot loops would print thousands of lines).
// Thread safety: thread-safe.
class Problems {
 public:
  void add(std::string what) {
    std::lock_guard lock(mu_);
    ++count_;
    if (examples_.size() < 8) examples_.push_back(std::move(what));
  }
  int count() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  std::string report() const {
    std::lock_guard lock(mu_);
    std::string r;
    for (const std::string& e : examples_) r += "\n  " + e;
    return r;
  }

 private:
  mutable std::mutex mu_;
  int count_ = 0;
  std::vector<std::string> examples_;
};

// ---- 1. Locked AssignAdd / AssignSub from many threads ----

// 8 threads x 200 AssignAdd(v, 1) (use_locking by default), half through
// run() and half through a Callable: the variable ends at exactly 1600, and
// the new values the runs return are exactly 1..1600, each once, increasing
// on every thread (each update is atomic and sees all earlier ones).
TEST(ConcurrencyStressTest, EightThreadsTimesTwoHundredAssignAddsSumExactly) {
  constexpr int kThreads = 8;
  constexpr int kRuns = 200;
  Graph g;
  Output v = ops::Variable(g, Tensor(int64_t{0}), "counter");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor(int64_t{1})), {}, "add");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  Result<Callable> callable = s->make_callable({}, {add});
  ASSERT_THAT(callable, IsOk());

  std::vector<std::vector<int64_t>> seen(kThreads);
  Problems problems;
  run_together("8 x 200 AssignAdd", kThreads, [&](int t) {
    seen[t].reserve(kRuns);
    for (int i = 0; i < kRuns; ++i) {
      Tensor out;
      if (t % 2 == 0) {
        Result<std::vector<Tensor>> r = s->run({}, {add});
        if (!r.is_ok()) {
          problems.add(r.status().to_string());
          continue;
        }
        out = r->at(0);
      } else {
        Tensor slot[1];
        Status st = callable->run({}, slot);
        if (!st.is_ok()) {
          problems.add(st.to_string());
          continue;
        }
        out = slot[0];
      }
      seen[t].push_back(out.scalar<int64_t>());
    }
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  std::vector<int64_t> all;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(std::is_sorted(seen[t].begin(), seen[t].end())) << "thread " << t;
    EXPECT_EQ(std::adjacent_find(seen[t].begin(), seen[t].end()), seen[t].end()) << "thread " << t;
    all.insert(all.end(), seen[t].begin(), seen[t].end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kRuns);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i) + 1;
  EXPECT_EQ(all, expected);
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor(int64_t{kThreads * kRuns}))));
}

// 4 threads x 200 AssignAdd(v, 3) race 4 threads x 300 AssignSub(v, 2) on a
// 16-element variable: the updates net out to exactly the initial value, and
// every value a run returns is whole (all elements equal).
TEST(ConcurrencyStressTest, ConcurrentAssignAddsAndAssignSubsNetOutExactly) {
  constexpr int kAdders = 4;
  constexpr int kAdds = 200;
  constexpr int kSubbers = 4;
  constexpr int kSubs = 300;
  static_assert(kAdders * kAdds * 3 == kSubbers * kSubs * 2);
  const Shape shape{16};
  Graph g;
  Output v = ops::Variable(g, Tensor::filled(shape, int32_t{1000}), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor::filled(shape, int32_t{3})), {}, "add");
  Output sub = ops::AssignSub(g, v, ops::Const(g, Tensor::filled(shape, int32_t{2})), {}, "sub");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  Problems problems;
  run_together("AssignAdd vs AssignSub", kAdders + kSubbers, [&](int t) {
    const bool adder = t < kAdders;
    for (int i = 0; i < (adder ? kAdds : kSubs); ++i) {
      Result<std::vector<Tensor>> r = s->run({}, {adder ? add : sub});
      if (!r.is_ok()) {
        problems.add(r.status().to_string());
      } else if (!all_elements_equal<int32_t>(r->at(0))) {
        problems.add("torn update result " + r->at(0).to_string());
      }
    }
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor::filled(shape, int32_t{1000}))));
}

// ---- 2. TensorFlow's locking tests (dense_update_ops_test.py) ----

// testParallelUpdateWithLocking: 20 AssignAdd(p, ones) ops on a 1024x1024
// float variable of zeros, each run by its own thread at once: every element
// is exactly 20 (and 40 after a second round).
TEST(ConcurrencyStressTest, TwentyConcurrentAssignAddsOn1024x1024SumExactly) {
  constexpr int kThreads = 20;
  const Shape shape{1024, 1024};
  Graph g;
  Output p = ops::Variable(g, ops::Zeros(g, shape), "p");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output ones = ops::Ones(g, shape);
  std::vector<const Node*> adds;
  for (int i = 0; i < kThreads; ++i) {
    adds.push_back(ops::AssignAdd(g, p, ones, {.use_locking = true}).node());
  }
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  for (int round = 1; round <= 2; ++round) {
    Problems problems;
    run_together("20 concurrent AssignAdd", kThreads, [&](int t) {
      Result<std::vector<Tensor>> r = s->run({}, {}, {adds[t]});
      if (!r.is_ok()) problems.add(r.status().to_string());
    });
    EXPECT_EQ(problems.count(), 0) << problems.report();
    Result<Tensor> value = fetch(*s, p);
    ASSERT_THAT(value, IsOk());
    const auto expected = static_cast<float>(kThreads * round);
    std::span<const float> x = value->flat<float>();
    const auto wrong = std::count_if(x.begin(), x.end(), [&](float e) { return e != expected; });
    EXPECT_EQ(wrong, 0) << "round " << round << ": element 0 is " << x[0] << ", expected "
                        << expected;
  }
}

// testParallelAssignWithLocking: 20 Assign(p, i * ones) ops (i = 1..20),
// each run by its own thread at once: afterwards every element equals the
// same value, one of 1..20. A second round does the same through one Assign
// node fed i * ones by thread i.
TEST(ConcurrencyStressTest, TwentyConcurrentAssignsOn1024x1024LeaveOneWholeValue) {
  constexpr int kThreads = 20;
  const Shape shape{1024, 1024};
  Graph g;
  Output p = ops::Variable(g, ops::Zeros(g, shape), "p");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output ones = ops::Ones(g, shape);
  std::vector<const Node*> assigns;
  for (int i = 1; i <= kThreads; ++i) {
    Output scaled = ops::Mul(g, ones, ops::Const(g, Tensor(static_cast<float>(i))));
    assigns.push_back(ops::Assign(g, p, scaled, {.use_locking = true}).node());
  }
  Output fed = ops::Placeholder(g, DType::kFloat32, shape, "fed");
  const Node* assign_fed = ops::Assign(g, p, fed, {.use_locking = true}, "assign_fed").node();
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  std::vector<Tensor> values;  // made before the threads start
  for (int i = 1; i <= kThreads; ++i) {
    values.push_back(Tensor::filled(shape, static_cast<float>(i)));
  }
  for (const bool use_feed : {false, true}) {
    Problems problems;
    run_together("20 concurrent Assign", kThreads, [&](int t) {
      Result<std::vector<Tensor>> r =
          use_feed ? s->run({{fed, values[t]}}, {}, {assign_fed}) : s->run({}, {}, {assigns[t]});
      if (!r.is_ok()) problems.add(r.status().to_string());
    });
    EXPECT_EQ(problems.count(), 0) << problems.report();
    Result<Tensor> value = fetch(*s, p);
    ASSERT_THAT(value, IsOk());
    const float first = value->flat<float>()[0];
    EXPECT_TRUE(first >= 1.0f && first <= 20.0f &&
                first == static_cast<float>(static_cast<int>(first)))
        << (use_feed ? "fed: " : "consts: ") << first;
    EXPECT_TRUE(all_elements_equal<float>(*value)) << (use_feed ? "fed" : "consts");
    // The fed tensors were copied, never aliased.
    for (int i = 1; i <= kThreads; ++i) {
      EXPECT_EQ(values[static_cast<std::size_t>(i - 1)].flat<float>()[0], static_cast<float>(i));
    }
  }
}

// ---- 3. Snapshot consistency ----

// 3 writers Assign whole tensors (each filled with one value unique to the
// write: fed, or made in-graph by Fill) while 3 readers fetch the variable's
// value and ReadVariable: every snapshot has all elements equal, holds a
// value that was written, and still does after all the writes.
TEST(ConcurrencyStressTest, ReadersNeverSeeATornAssignedValue) {
  constexpr int64_t kSize = 1 << 14;
  constexpr int kWriters = 3;
  constexpr int kWrites = 150;
  constexpr int kReaders = 3;
  constexpr int kReads = 150;
  const Shape shape{kSize};
  Graph g;
  Output v = ops::Variable(g, Tensor::filled(shape, 0.0), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output whole = ops::Placeholder(g, DType::kFloat64, shape, "whole");
  Output set_whole = ops::Assign(g, v, whole, {}, "set_whole");
  Output scalar = ops::Placeholder(g, DType::kFloat64, Shape{}, "scalar");
  Output filled = ops::Fill(g, ops::Const(g, Tensor{kSize}), scalar, "filled");
  Output set_filled = ops::Assign(g, v, filled, {}, "set_filled");
  Output read = ops::ReadVariable(g, v, "read");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  // Write i of writer t stores 1 + t * 1000 + i everywhere.
  auto was_written = [](double x) {
    if (x == 0.0) return true;  // the initial value
    const auto k = static_cast<int64_t>(x) - 1;
    return x == static_cast<double>(k + 1) && k >= 0 && k / 1000 < kWriters && k % 1000 < kWrites;
  };
  Problems problems;
  std::vector<std::vector<Tensor>> kept(kReaders);
  run_together("readers vs Assign writers", kWriters + kReaders, [&](int k) {
    if (k < kWriters) {
      const int t = k;  // writer t
      for (int i = 0; i < kWrites; ++i) {
        const double value = 1 + t * 1000 + i;
        Result<std::vector<Tensor>> r =
            i % 2 == 0 ? s->run({{whole, Tensor::filled(shape, value)}}, {}, {set_whole.node()})
                       : s->run({{scalar, Tensor(value)}}, {}, {set_filled.node()});
        if (!r.is_ok()) problems.add(r.status().to_string());
      }
      return;
    }
    const int t = k - kWriters;  // reader t
    for (int i = 0; i < kReads; ++i) {
      std::vector<TensorRef> fetches;
      if (i % 3 == 0) fetches = {v};
      if (i % 3 == 1) fetches = {read};
      if (i % 3 == 2) fetches = {v, read};
      Result<std::vector<Tensor>> r = s->run({}, fetches);
      if (!r.is_ok()) {
        problems.add(r.status().to_string());
        continue;
      }
      for (const Tensor& snapshot : *r) {
        if (!all_elements_equal<double>(snapshot) || !was_written(snapshot.flat<double>()[0])) {
          problems.add("torn or unknown snapshot starting " +
                       std::to_string(snapshot.flat<double>()[0]));
        }
        kept[t].push_back(snapshot);
      }
    }
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  int changed = 0;
  for (const auto& snapshots : kept) {
    for (const Tensor& snapshot : snapshots) {
      if (!all_elements_equal<double>(snapshot)) ++changed;
    }
  }
  EXPECT_EQ(changed, 0) << "snapshots changed after they were fetched";
  Result<Tensor> last = fetch(*s, v);
  ASSERT_THAT(last, IsOk());
  EXPECT_TRUE(all_elements_equal<double>(*last));
  // Each writer's last write is a candidate for the final value.
  const double final_value = last->flat<double>()[0];
  EXPECT_TRUE(final_value == kWrites || final_value == 1000 + kWrites ||
              final_value == 2000 + kWrites)
      << final_value;
}

// ---- 4. Random ops under concurrency ----

// A seeded RandomUniform (graph seed + op seed, 64 floats) and RandomNormal
// (32 doubles), fetched together by 8 threads x 50 runs (half through a
// Callable): no draw repeats, and each op's draws are exactly those of 400
// sequential runs in a fresh session (its stream is per session; concurrent
// runs take disjoint parts of it).
TEST(ConcurrencyStressTest, SeededRandomDrawsAreDisjointAcrossRunsAndMatchSequentialRuns) {
  constexpr int kThreads = 8;
  constexpr int kRuns = 50;
  Graph g;
  g.set_seed(1234);
  Output u = ops::RandomUniform(g, Shape{64}, DType::kFloat32, {.seed = 7}, "u");
  Output n = ops::RandomNormal(g, Shape{32}, DType::kFloat64, 0.0, 1.0, {.seed = 9}, "n");
  ASSERT_GRAPH_OK(g);

  std::vector<std::vector<float>> sequential_u;
  std::vector<std::vector<double>> sequential_n;
  {
    auto s = make_session(g);
    for (int i = 0; i < kThreads * kRuns; ++i) {
      Result<std::vector<Tensor>> r = s->run({}, {u, n});
      ASSERT_THAT(r, IsOk());
      sequential_u.push_back(to_vector<float>(r->at(0)));
      sequential_n.push_back(to_vector<double>(r->at(1)));
    }
  }

  auto s = make_session(g);
  Result<Callable> callable = s->make_callable({}, {u, n});
  ASSERT_THAT(callable, IsOk());
  std::vector<std::vector<std::vector<float>>> per_thread_u(kThreads);
  std::vector<std::vector<std::vector<double>>> per_thread_n(kThreads);
  Problems problems;
  run_together("concurrent random draws", kThreads, [&](int t) {
    for (int i = 0; i < kRuns; ++i) {
      Tensor out[2];
      if (t % 2 == 0) {
        Result<std::vector<Tensor>> r = s->run({}, {u, n});
        if (!r.is_ok()) {
          problems.add(r.status().to_string());
          continue;
        }
        out[0] = r->at(0);
        out[1] = r->at(1);
      } else if (Status st = callable->run({}, out); !st.is_ok()) {
        problems.add(st.to_string());
        continue;
      }
      per_thread_u[t].push_back(to_vector<float>(out[0]));
      per_thread_n[t].push_back(to_vector<double>(out[1]));
    }
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  std::vector<std::vector<float>> concurrent_u;
  std::vector<std::vector<double>> concurrent_n;
  for (int t = 0; t < kThreads; ++t) {
    concurrent_u.insert(concurrent_u.end(), per_thread_u[t].begin(), per_thread_u[t].end());
    concurrent_n.insert(concurrent_n.end(), per_thread_n[t].begin(), per_thread_n[t].end());
  }
  EXPECT_EQ(std::set<std::vector<float>>(concurrent_u.begin(), concurrent_u.end()).size(),
            concurrent_u.size())
      << "a uniform draw repeated";
  EXPECT_EQ(std::set<std::vector<double>>(concurrent_n.begin(), concurrent_n.end()).size(),
            concurrent_n.size())
      << "a normal draw repeated";
  std::sort(sequential_u.begin(), sequential_u.end());
  std::sort(sequential_n.begin(), sequential_n.end());
  std::sort(concurrent_u.begin(), concurrent_u.end());
  std::sort(concurrent_n.begin(), concurrent_n.end());
  EXPECT_TRUE(concurrent_u == sequential_u) << "uniform draws differ from the sequential ones";
  EXPECT_TRUE(concurrent_n == sequential_n) << "normal draws differ from the sequential ones";
}

// ---- 5. Iterators ----

// 8 threads pull rows of a [2000, 4] tensor from one iterator (through
// run(), a Callable and one-call partial runs) until it ends: every row
// arrives whole and exactly once, and every call past the end is
// OutOfRange. After the initializer rewinds it, a second pass does the same.
TEST(ConcurrencyStressTest, ThreadsPullingFromOneIteratorGetEveryRowOnceThenOutOfRange) {
  constexpr int64_t kRows = 2000;
  constexpr int64_t kCols = 4;
  constexpr int kThreads = 8;
  constexpr int kCallsPastTheEnd = 3;
  std::vector<int64_t> data(static_cast<std::size_t>(kRows * kCols));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int64_t>(i);
  Graph g;
  ops::Iterator it = ops::TensorRowsIterator(
      g, Tensor::from_span(Shape{kRows, kCols}, std::span<const int64_t>(data)), "rows");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  Result<Callable> callable = s->make_callable({}, {it.next});
  ASSERT_THAT(callable, IsOk());

  for (int pass = 0; pass < 2; ++pass) {
    if (pass > 0) {
      ASSERT_THAT(s->run({}, {}, {it.initializer}), IsOk());
    }
    std::vector<std::vector<int64_t>> seen(kThreads);
    Problems problems;
    run_together("iterator pass", kThreads, [&](int t) {
      // One next() through this thread's way of calling the session.
      auto next = [&]() -> Result<Tensor> {
        if (t % 3 == 0) return fetch(*s, it.next);
        if (t % 3 == 1) {
          Tensor out[1];
          GRAPHRUN_RETURN_IF_ERROR(callable->run({}, out));
          return out[0];
        }
        GRAPHRUN_ASSIGN_OR_RETURN(PartialRunHandle h, s->partial_run_setup({it.next}, {}));
        GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out, s->partial_run(h, {}, {it.next}));
        return out.at(0);
      };
      for (;;) {
        Result<Tensor> row = next();
        if (row.is_ok()) {
          std::span<const int64_t> x = row->flat<int64_t>();
          bool whole = x.size() == static_cast<std::size_t>(kCols) && x[0] % kCols == 0;
          for (std::size_t c = 0; whole && c < x.size(); ++c) {
            whole = x[c] == x[0] + static_cast<int64_t>(c);
          }
          if (!whole) problems.add("torn row " + row->to_string());
          seen[t].push_back(x[0] / kCols);
          continue;
        }
        if (row.status().code() != StatusCode::kOutOfRange || row.status().message().empty()) {
          problems.add("thread " + std::to_string(t) + ": " + row.status().to_string());
          return;
        }
        for (int k = 0; k < kCallsPastTheEnd; ++k) {
          Result<Tensor> again = next();
          if (again.is_ok() || again.status().code() != StatusCode::kOutOfRange) {
            problems.add("past the end: " +
                         (again.is_ok() ? again->to_string() : again.status().to_string()));
          }
        }
        return;
      }
    });
    EXPECT_EQ(problems.count(), 0) << "pass " << pass << problems.report();
    std::vector<int64_t> all;
    for (const auto& v : seen) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(kRows);
    for (int64_t i = 0; i < kRows; ++i) expected[static_cast<std::size_t>(i)] = i;
    EXPECT_EQ(all, expected) << "pass " << pass;
    EXPECT_EQ(s->num_open_partial_runs(), 0u);
  }
}

// ---- 6. Mixed load, closed mid-way ----

// 8 threads on one session: 3 run AssignAdd(v, 1) fetching the new value, 2
// finish partial runs (two calls, or one), 1 abandons partial runs (handle
// dropped after setup or after a call, or cancel_partial_run), 1 reads v
// (value and ReadVariable), and 1 closes the session once every worker has
// done 50 successful iterations. Each worker stops after 10 iterations begun
// after close() returned (the watchdog bounds the whole test). Every call returns a value or,
// once close() has begun, Cancelled with a message (always, for calls begun
// after it returned); nothing hangs; the increments add up; no partial run
// is left open.
TEST(ConcurrencyStressTest, MixedLoadClosedMidwayEndsEveryCallCleanly) {
  constexpr int kAdders = 3;
  constexpr int kItersAfterClose = 10;
  constexpr int kWorkers = kAdders + 4;
  constexpr int kWarmup = 50;  // successful iterations per worker before close()
  Graph g;
  Output v = ops::Variable(g, Tensor(int64_t{0}), "v");
  Output w = ops::Variable(g, Tensor(int64_t{0}), "w");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output one = ops::Const(g, Tensor(int64_t{1}), "one");
  Output add_v = ops::AssignAdd(g, v, one, {}, "add_v");
  Output bump_w = ops::AssignAdd(g, w, one, {}, "bump_w");
  Output x = ops::Placeholder(g, DType::kInt64, Shape{}, "x");
  Output y = ops::Add(g, x, x, "y");
  Output read_v = ops::ReadVariable(g, v, "read_v");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  std::atomic<bool> close_started{false};
  std::atomic<bool> close_returned{false};
  std::atomic<int> ok_adds{0};
  std::atomic<int> cancelled_adds{0};
  std::atomic<int> cancelled_calls{0};
  std::atomic<int> ok_partial_runs{0};
  std::atomic<int> abandoned{0};
  std::atomic<int> ok_reads{0};
  std::latch warmed_up(kWorkers);
  Problems problems;
  std::mutex values_mu;
  std::vector<int64_t> add_values;   // guarded by values_mu
  std::vector<int64_t> bump_values;  // guarded by values_mu

  // Runs step(i, after_close) (true when the iteration succeeded) until this
  // thread has made kItersAfterClose iterations begun after close() returned
  // (after_close: this one did). Counts down warmed_up once after kWarmup
  // successful iterations, or on leaving. No cap on iterations: between
  // close() beginning and returning, calls fail at once (Cancelled), and a
  // cap of 20000 was reached there in CI, leaving a worker short of its 10
  // iterations after close(); run_bounded's watchdog ends a hang.
  auto until_closed = [&](auto step) {
    int after = 0;
    int ok = 0;
    for (int i = 0; after < kItersAfterClose; ++i) {
      const bool after_close = close_returned.load();
      if (step(i, after_close) && ++ok == kWarmup) warmed_up.count_down();
      if (after_close) ++after;
    }
    if (ok < kWarmup) warmed_up.count_down();
  };
  // OK, or Cancelled with a message once close() has begun; never OK for a
  // call begun after close() returned. True if OK.
  auto check = [&](const Status& st, std::string_view what, bool after_close) {
    if (st.is_ok()) {
      if (after_close) problems.add(std::string(what) + " succeeded after close()");
      return true;
    }
    if (st.code() == StatusCode::kCancelled && !st.message().empty() && close_started.load()) {
      cancelled_calls.fetch_add(1);
    } else {
      problems.add(std::string(what) + ": " + st.to_string() +
                   (close_started.load() ? "" : " (before close)"));
    }
    return false;
  };
  auto record = [&](std::vector<int64_t>& into, const Tensor& t) {
    std::lock_guard lock(values_mu);
    into.push_back(t.scalar<int64_t>());
  };
  auto adder = [&] {
    until_closed([&](int, bool after_close) {
      Result<std::vector<Tensor>> r = s->run({}, {add_v});
      if (!check(r.status(), "add", after_close)) {
        cancelled_adds.fetch_add(1);
        return false;
      }
      record(add_values, r->at(0));
      ok_adds.fetch_add(1);
      return true;
    });
  };
  // A partial run finished in two calls (bump, then y) or one (both).
  auto finisher = [&](bool two_calls) {
    until_closed([&](int i, bool after_close) {
      Result<PartialRunHandle> h = s->partial_run_setup({bump_w, y}, {x});
      if (!check(h.status(), "setup", after_close)) return false;
      const auto xi = static_cast<int64_t>(i);
      Result<std::vector<Tensor>> r = two_calls
                                          ? s->partial_run(*h, {}, {bump_w})
                                          : s->partial_run(*h, {{x, Tensor(xi)}}, {bump_w, y});
      if (!check(r.status(), "first call", after_close)) return false;
      record(bump_values, r->at(0));
      if (two_calls) {
        r = s->partial_run(*h, {{x, Tensor(xi)}}, {y});
        if (!check(r.status(), "second call", after_close)) return false;
      }
      const Tensor& yv = r->back();
      if (yv.scalar<int64_t>() != 2 * xi) problems.add("y = " + yv.to_string());
      if (!h->is_done()) problems.add("a finished partial run is not done");
      ok_partial_runs.fetch_add(1);
      return true;
    });
  };
  auto abandoner = [&] {
    until_closed([&](int i, bool after_close) {
      Result<PartialRunHandle> h = s->partial_run_setup({bump_w, y}, {x});
      if (!check(h.status(), "setup", after_close)) return false;
      abandoned.fetch_add(1);
      if (i % 3 == 0) return true;  // dropped untouched
      Result<std::vector<Tensor>> r = s->partial_run(*h, {}, {bump_w});
      if (!check(r.status(), "first call", after_close)) return false;
      record(bump_values, r->at(0));
      if (i % 3 == 1) return true;  // dropped mid-way
      Status cancel = s->cancel_partial_run(*h);
      if (!cancel.is_ok()) problems.add("cancel_partial_run: " + cancel.to_string());
      r = s->partial_run(*h, {{x, Tensor(int64_t{1})}}, {y});
      if (r.is_ok() || r.status().code() != StatusCode::kCancelled ||
          r.status().message().empty()) {
        problems.add("a call after cancel_partial_run: " +
                     (r.is_ok() ? std::string("OK") : r.status().to_string()));
      }
      if (!h->is_done()) problems.add("a cancelled partial run is not done");
      return true;
    });
  };
  auto reader = [&] {
    int64_t last = 0;
    until_closed([&](int, bool after_close) {
      Result<std::vector<Tensor>> r = s->run({}, {v, read_v, w});
      if (!check(r.status(), "read", after_close)) return false;
      ok_reads.fetch_add(1);
      // v only grows and each run here starts after the previous one ended.
      const int64_t a = r->at(0).scalar<int64_t>();
      const int64_t b = r->at(1).scalar<int64_t>();
      if (a < last || b < last) {
        problems.add("v went back: " + std::to_string(last) + " then " + std::to_string(a) + ", " +
                     std::to_string(b));
      }
      last = std::max(a, b);
      return true;
    });
  };
  auto closer = [&] {
    warmed_up.wait();
    close_started.store(true);
    Status st = s->close();
    close_returned.store(true);
    if (!st.is_ok()) problems.add("close: " + st.to_string());
  };

  run_bounded("mixed load", [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < kAdders; ++t) threads.emplace_back(adder);
    threads.emplace_back(finisher, true);
    threads.emplace_back(finisher, false);
    threads.emplace_back(abandoner);
    threads.emplace_back(reader);
    threads.emplace_back(closer);
    for (std::thread& th : threads) th.join();
  });

  EXPECT_EQ(problems.count(), 0) << problems.report();
  EXPECT_TRUE(close_returned.load());
  // Every kind of work overlapped the session's open life.
  EXPECT_GE(ok_partial_runs.load(), 2 * kWarmup);
  EXPECT_GE(abandoned.load(), kWarmup);
  EXPECT_GE(ok_reads.load(), kWarmup);
  EXPECT_GE(cancelled_calls.load(), kWorkers * kItersAfterClose);
  EXPECT_EQ(s->num_open_partial_runs(), 0u);

  // The increments add up: the OK AssignAdd runs returned distinct values,
  // and the largest is their number. A run in flight when close() landed
  // may have incremented and still returned Cancelled (close cancels runs in
  // flight), so the largest may exceed the count by at most one such run
  // per adder thread, and only by runs that did return Cancelled.
  std::sort(add_values.begin(), add_values.end());
  EXPECT_EQ(std::adjacent_find(add_values.begin(), add_values.end()), add_values.end());
  ASSERT_EQ(static_cast<int>(add_values.size()), ok_adds.load());
  ASSERT_GE(ok_adds.load(), kAdders * kWarmup);
  const int64_t max_value = add_values.back();
  const int64_t unreported = max_value - ok_adds.load();
  EXPECT_GE(unreported, 0);
  EXPECT_LE(unreported, std::min<int64_t>(kAdders, cancelled_adds.load()))
      << "max returned value " << max_value << ", " << ok_adds.load() << " OK AssignAdd runs";
  if (unreported != 0) {
    std::printf("note: %lld increment(s) by runs that returned Cancelled\n",
                static_cast<long long>(unreported));
  }
  std::sort(bump_values.begin(), bump_values.end());
  EXPECT_EQ(std::adjacent_find(bump_values.begin(), bump_values.end()), bump_values.end());

  // Closed: everything says so, and close() stays OK.
  EXPECT_THAT(s->run({}, {v}), StatusIs(StatusCode::kCancelled, "Session has been closed."));
  EXPECT_THAT(s->make_callable({}, {v}), StatusIs(StatusCode::kCancelled, "closed"));
  EXPECT_THAT(s->partial_run_setup({y}, {x}), StatusIs(StatusCode::kCancelled, "closed"));
  EXPECT_THAT(s->close(), IsOk());
}

// While close() or cancel_partial_run() ends an open partial run whose
// kernel takes 200 ms to stop, the handle's only user makes a call: it is
// refused with Cancelled (the run was cancelled), not FailedPrecondition
// "in use by another call" (no other call exists).
TEST(ConcurrencyStressTest, PartialRunCallWhileTheRunIsBeingCancelledReturnsCancelled) {
  for (const bool by_close : {true, false}) {
    Signal started;
    Signal stopping;
    Graph g;
    // Starts at setup (no feed); polls until cancelled, then takes 200 ms to
    // stop (20 ms in, it notifies `stopping`).
    Output slow_stop = ops::Call(
        g, {}, {DType::kFloat32},
        [&started, &stopping](OpKernelContext& ctx) -> Status {
          started.notify();
          const auto give_up = Clock::now() + seconds(10);
          while (!ctx.is_cancelled() && Clock::now() < give_up) {
            std::this_thread::sleep_for(milliseconds(1));
          }
          std::this_thread::sleep_for(milliseconds(20));
          stopping.notify();
          std::this_thread::sleep_for(milliseconds(180));
          return cancelled("stopped");
        },
        {.output_shapes = {Shape{}}}, "slow_stop")[0];
    Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    Output y = ops::Add(g, slow_stop, x, "y");
    ASSERT_GRAPH_OK(g);
    SessionOptions o;
    o.inter_op_threads = 2;
    auto s = make_session(g, o);
    Result<PartialRunHandle> h = s->partial_run_setup({y}, {x});
    ASSERT_THAT(h, IsOk());
    run_bounded("a call while the run is cancelled", [&] {
      std::thread canceller([&] {
        started.wait();  // cancelled before it starts, the kernel would just be skipped
        if (by_close) {
          EXPECT_THAT(s->close(), IsOk());
        } else {
          EXPECT_THAT(s->cancel_partial_run(*h), IsOk());
        }
        stopping.notify();  // in case the kernel never ran
      });
      stopping.wait();
      Result<std::vector<Tensor>> r = s->partial_run(*h, {{x, Tensor(1.0f)}}, {y});
      canceller.join();
      EXPECT_THAT(r, StatusIs(StatusCode::kCancelled, ""))
          << (by_close ? "close()" : "cancel_partial_run()");
      EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {y}),
                  StatusIs(StatusCode::kCancelled, ""));
      EXPECT_TRUE(h->is_done());
    });
    EXPECT_EQ(s->num_open_partial_runs(), 0u);
  }
}

// ---- 7. Calls from inside oneTBB tasks ----

// y = 2p + 1 over a float scalar placeholder p.
struct Affine {
  Graph g;
  Output p, y;
  Affine() {
    p = ops::Placeholder(g, DType::kFloat32, Shape{}, "p");
    y = ops::Add(g, ops::Mul(g, p, ops::Const(g, Tensor(2.0f))), ops::Const(g, Tensor(1.0f)), "y");
  }
};

// Runs p = i for i in [0, n) from tbb::parallel_for in the current arena
// (run() and a Callable alternately); returns the number of wrong results.
int parallel_runs(Session& s, const Affine& m, const Callable& callable, int n) {
  std::atomic<int> wrong{0};
  tbb::parallel_for(0, n, [&](int i) {
    const auto p = static_cast<float>(i);
    Tensor out[1];
    if (i % 2 == 0) {
      Result<std::vector<Tensor>> r = s.run({{m.p, Tensor(p)}}, {m.y});
      if (r.is_ok()) out[0] = r->at(0);
    } else {
      const Tensor feed[1] = {Tensor(p)};
      if (!callable.run(feed, out).is_ok()) out[0] = Tensor();
    }
    if (!out[0].is_initialized() || out[0].scalar<float>() != 2 * p + 1) wrong.fetch_add(1);
  });
  return wrong.load();
}

// (a) tbb::parallel_for over 64 iterations in the default arena, each
// calling the session (whose arena is its own).
TEST(ConcurrencyStressTest, RunsFromInsideTbbParallelForInTheDefaultArena) {
  Affine m;
  ASSERT_GRAPH_OK(m.g);
  for (int threads : {0, 1, 2}) {
    SessionOptions o;
    o.inter_op_threads = threads;
    auto s = make_session(m.g, o);
    Result<Callable> callable = s->make_callable({m.p}, {m.y});
    ASSERT_THAT(callable, IsOk());
    int wrong = -1;
    run_bounded("parallel_for in the default arena", [&] {
      wrong = 0;
      for (int round = 0; round < 4; ++round) wrong += parallel_runs(*s, m, *callable, 64);
    });
    EXPECT_EQ(wrong, 0) << "inter_op_threads " << threads;
  }
}

// (b) A second tbb::task_arena(2) whose execute() calls the session, once
// directly and from a parallel_for inside it; two such callers at once.
TEST(ConcurrencyStressTest, RunsFromInsideASecondTaskArena) {
  Affine m;
  ASSERT_GRAPH_OK(m.g);
  SessionOptions o;
  o.inter_op_threads = 2;
  auto s = make_session(m.g, o);
  Result<Callable> callable = s->make_callable({m.p}, {m.y});
  ASSERT_THAT(callable, IsOk());
  tbb::task_arena other(2);
  std::atomic<int> wrong{0};
  run_bounded("calls from a second arena", [&] {
    auto body = [&] {
      other.execute([&] {
        for (int i = 0; i < 16; ++i) {
          Result<Tensor> r = fetch(*s, m.y, {{m.p, Tensor(static_cast<float>(i))}});
          if (!r.is_ok() || r->scalar<float>() != 2.0f * static_cast<float>(i) + 1) {
            wrong.fetch_add(1);
          }
        }
        wrong.fetch_add(parallel_runs(*s, m, *callable, 64));
      });
    };
    std::thread second(body);
    body();
    second.join();
  });
  EXPECT_EQ(wrong.load(), 0);
}

// (c) A kernel that itself runs a second session and another signature of
// its own session (nested runs from a thread inside the session's arena),
// called from 4 threads and from a parallel_for: no deadlock, right values.
TEST(ConcurrencyStressTest, KernelRunsASecondSessionAndItsOwnSessionFromInside) {
  // Session B: by = bx + 100.
  Graph gb;
  Output bx = ops::Placeholder(gb, DType::kFloat32, Shape{}, "bx");
  Output by = ops::Add(gb, bx, ops::Const(gb, Tensor(100.0f)), "by");
  ASSERT_GRAPH_OK(gb);
  SessionOptions one_thread;
  one_thread.inter_op_threads = 1;
  auto sb = make_session(gb, one_thread);

  for (int a_threads : {1, 2}) {
    // Session A: same = 3x (a signature of its own); outer = B(x) + A.same(x)
    // computed by a kernel through nested runs, = 4x + 100.
    std::atomic<Session*> sa_ptr{nullptr};
    std::atomic<int> nested{0};
    Graph ga;
    Output x = ops::Placeholder(ga, DType::kFloat32, Shape{}, "x");
    Output same = ops::Mul(ga, x, ops::Const(ga, Tensor(3.0f)), "same");
    Output outer = ops::Call(
        ga, {x}, {DType::kFloat32},
        [&sa_ptr, &nested, session_b = sb.get(), bx, by, x, same](OpKernelContext& ctx) -> Status {
          const Tensor in = ctx.input(0);
          GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> from_b, session_b->run({{bx, in}}, {by}));
          GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> from_a,
                                    sa_ptr.load()->run({{x, in}}, {same}));
          nested.fetch_add(1);
          return ctx.set_output(
              0, Tensor(from_b.at(0).scalar<float>() + from_a.at(0).scalar<float>()));
        },
        {.output_shapes = {Shape{}}}, "outer")[0];
    ASSERT_GRAPH_OK(ga);
    SessionOptions oa;
    oa.inter_op_threads = a_threads;
    auto sa = make_session(ga, oa);
    sa_ptr.store(sa.get());

    constexpr int kThreads = 4;
    constexpr int kRuns = 25;
    constexpr int kParallel = 32;
    std::atomic<int> wrong{0};
    auto check = [&](int i) {
      const auto xi = static_cast<float>(i);
      Result<Tensor> r = fetch(*sa, outer, {{x, Tensor(xi)}});
      if (!r.is_ok() || r->scalar<float>() != 4 * xi + 100) wrong.fetch_add(1);
    };
    run_bounded("nested runs from a kernel", [&] {
      std::latch start(kThreads);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          start.arrive_and_wait();
          for (int i = 0; i < kRuns; ++i) check(t * 1000 + i);
        });
      }
      tbb::parallel_for(0, kParallel, [&](int i) { check(-i); });
      for (std::thread& th : threads) th.join();
    });
    EXPECT_EQ(wrong.load(), 0) << "A with " << a_threads << " thread(s)";
    EXPECT_EQ(nested.load(), kThreads * kRuns + kParallel);
  }
}

// ---- 8. Kernels that block ----

// Two 50 ms sleeping kernels per run (y = slow_a(x) + slow_b(x) = 4x), run
// from 4 threads at once, 3 rounds, on a session with 2 inter-op threads:
// every run completes with its own value.
TEST(ConcurrencyStressTest, BlockingKernelsFromFourThreadsOnTwoInterOpThreadsAllComplete) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 3;
  std::atomic<int> sleeps{0};
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  auto slow = [&](std::string_view name) {
    return ops::Call(
        g, {x}, {DType::kFloat32},
        [&sleeps](OpKernelContext& ctx) -> Status {
          std::this_thread::sleep_for(milliseconds(50));
          sleeps.fetch_add(1);
          return ctx.set_output(0, Tensor(2 * ctx.input(0).scalar<float>()));
        },
        {}, name)[0];
  };
  Output y = ops::Add(g, slow("slow_a"), slow("slow_b"), "y");
  ASSERT_GRAPH_OK(g);
  SessionOptions o;
  o.inter_op_threads = 2;
  auto s = make_session(g, o);

  Problems problems;
  run_together("blocking kernels", kThreads, [&](int t) {
    for (int round = 0; round < kRounds; ++round) {
      const auto xv = static_cast<float>(t * 10 + round);
      Result<Tensor> r = fetch(*s, y, {{x, Tensor(xv)}});
      if (!r.is_ok()) {
        problems.add(r.status().to_string());
      } else if (r->scalar<float>() != 4 * xv) {
        problems.add("thread " + std::to_string(t) + " got " + r->to_string());
      }
    }
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  EXPECT_EQ(sleeps.load(), kThreads * kRounds * 2);
}

// ---- 8b. Plans evicted from the cache while their runs are in flight ----

// A run holds its plan while a second signature evicts it (capacity 1) and
// a third evicts that one: the held plan stays valid until the run ends,
// and is rebuilt when asked for again. No flow-graph instance outlives the
// session.
TEST(ConcurrencyStressTest, PlanEvictedDuringItsRunStaysValidUntilTheRunEnds) {
  const int64_t live_before = sched::FlowInstance::live_count();
  run_bounded("eviction during a run", [&] {
    Signal started, release;
    Graph g;
    Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    Output held = ops::Call(
        g, {x}, {DType::kFloat32},
        [&](OpKernelContext& ctx) -> Status {
          started.notify();
          release.wait();
          return ctx.set_output(0, ctx.input(0));
        },
        {.output_shapes = {Shape{}}}, "held")[0];
    Output y = ops::Add(g, held, ops::Const(g, Tensor(1.0f)), "y");
    Output neg = ops::Neg(g, x, "neg");
    Output twice = ops::Add(g, x, x, "twice");
    ASSERT_GRAPH_OK(g);
    SessionOptions o;
    o.plan_cache_capacity = 1;
    auto s = make_session(g, o);
    std::future<Result<Tensor>> first = std::async(std::launch::async, [&] {
      return fetch(*s, y, {{x, Tensor(3.0f)}});
    });
    started.wait();
    // y's plan is evicted, then neg's, while y's run is still in its kernel.
    for (int i = 0; i < 3; ++i) {
      EXPECT_THAT(fetch(*s, neg, {{x, Tensor(2.0f)}}), IsOkAndHolds(TensorEq(Tensor(-2.0f))));
    }
    EXPECT_THAT(fetch(*s, twice, {{x, Tensor(2.0f)}}), IsOkAndHolds(TensorEq(Tensor(4.0f))));
    EXPECT_EQ(s->num_cached_plans(), 1u);
    release.notify();
    EXPECT_THAT(first.get(), IsOkAndHolds(TensorEq(Tensor(4.0f))));
    // Rebuilt on demand; the retired plan goes at this insert.
    EXPECT_THAT(fetch(*s, y, {{x, Tensor(5.0f)}}), IsOkAndHolds(TensorEq(Tensor(6.0f))));
    EXPECT_EQ(s->num_cached_plans(), 1u);
  });
  EXPECT_EQ(sched::FlowInstance::live_count(), live_before);
}

// Four threads cycle through five signatures (inline and flow-graph plans)
// on a cache of two: constant eviction under concurrent leases. Every
// result is right and nothing leaks.
TEST(ConcurrencyStressTest, ThreadsCyclingSignaturesThroughASmallPlanCacheGetRightResults) {
  const int64_t live_before = sched::FlowInstance::live_count();
  run_bounded("signatures through a small cache", [&] {
    Graph g;
    Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    std::vector<Output> outs;  // outs[k] = x * (k + 1)
    for (int k = 1; k <= 4; ++k) {
      outs.push_back(ops::Mul(g, x, ops::Const(g, Tensor(static_cast<float>(k)))));
    }
    // Not cheap: this signature's plan runs on the flow graph.
    outs.push_back(ops::Call(
        g, {x}, {DType::kFloat32},
        [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
          return std::vector<Tensor>{Tensor(5 * in[0].scalar<float>())};
        },
        {.output_shapes = {Shape{}}}, "times5")[0]);
    ASSERT_GRAPH_OK(g);
    SessionOptions o;
    o.plan_cache_capacity = 2;
    auto s = make_session(g, o);
    Problems problems;
    constexpr int kRuns = 300;
    run_together("cycling signatures", 4, [&](int t) {
      for (int r = 0; r < kRuns; ++r) {
        const auto k = static_cast<std::size_t>((t + r) % 5);
        const auto v = static_cast<float>(t * 1000 + r);
        Result<Tensor> got = fetch(*s, outs[k], {{x, Tensor(v)}});
        if (!got.is_ok()) {
          problems.add(got.status().to_string());
        } else if (got->scalar<float>() != v * static_cast<float>(k + 1)) {
          problems.add(fmt::format("signature {} of {} gave {}", k, v, got->to_string()));
        }
      }
    });
    EXPECT_EQ(problems.count(), 0) << problems.report();
    EXPECT_LE(s->num_cached_plans(), 2u);
  });
  EXPECT_EQ(sched::FlowInstance::live_count(), live_before);
}

// ---- 9. Deadlines and close() while kernels run ----

// A kernel (reading `inputs`, if any) that polls ctx.is_cancelled() every
// millisecond and gives up after 10 s. Notifies `started` (if any) first.
Output polling_kernel(Graph& g, std::vector<Output> inputs, std::atomic<bool>* saw_cancel,
                      Signal* started) {
  return ops::Call(
      g, std::move(inputs), {DType::kFloat32},
      [saw_cancel, started](OpKernelContext& ctx) -> Status {
        if (started != nullptr) started->notify();
        const auto give_up = Clock::now() + seconds(10);
        while (!ctx.is_cancelled()) {
          if (Clock::now() > give_up) return internal_error("never cancelled");
          std::this_thread::sleep_for(milliseconds(1));
        }
        saw_cancel->store(true);
        return cancelled("the polling kernel stopped");
      },
      {.output_shapes = {Shape{}}}, "polling")[0];
}

// (a) Under a 50 ms timeout the polling kernel sees the cancellation and the
// run (then a Callable run of the same plan, on its pooled instance) returns
// DeadlineExceeded naming the node, within 2 s, not the kernel's own status.
// Meanwhile two threads run another signature of the session without a
// deadline: none of them is affected.
TEST(ConcurrencyStressTest, PollingKernelSeesTheRunDeadlineAndTheRunReturnsDeadlineExceeded) {
  std::atomic<bool> saw_cancel{false};
  Graph g;
  Output polled = polling_kernel(g, {}, &saw_cancel, nullptr);
  Output p = ops::Placeholder(g, DType::kFloat32, Shape{}, "p");
  Output quick = ops::Add(g, p, ops::Const(g, Tensor(5.0f)), "quick");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  Result<Callable> callable = s->make_callable({}, {polled});
  ASSERT_THAT(callable, IsOk());
  RunOptions o;
  o.timeout = milliseconds(50);
  std::atomic<bool> done{false};
  std::atomic<int> quick_runs{0};
  Problems problems;
  run_bounded("deadline with a polling kernel", [&] {
    std::vector<std::thread> others;
    for (int t = 0; t < 2; ++t) {
      others.emplace_back([&, t] {
        for (int i = 0; !done.load(); ++i) {
          const auto pv = static_cast<float>(t * 100000 + i);
          Result<Tensor> r = fetch(*s, quick, {{p, Tensor(pv)}});
          if (!r.is_ok()) {
            problems.add(r.status().to_string());
          } else if (r->scalar<float>() != pv + 5) {
            problems.add("quick = " + r->to_string());
          }
          quick_runs.fetch_add(1);
        }
      });
    }
    for (const bool through_callable : {false, true}) {
      saw_cancel.store(false);
      const auto t0 = Clock::now();
      Status st;
      if (through_callable) {
        Tensor out[1];
        st = callable->run({}, out, o);
      } else {
        st = s->run({}, {polled}, {}, o).status();
      }
      const auto elapsed = Clock::now() - t0;
      EXPECT_THAT(st, StatusIs(StatusCode::kDeadlineExceeded, "'polling'"))
          << (through_callable ? "Callable" : "run");
      EXPECT_TRUE(saw_cancel.load()) << "the kernel never saw is_cancelled()";
      EXPECT_LT(elapsed, seconds(2)) << (through_callable ? "Callable" : "run");
    }
    done.store(true);
    for (std::thread& th : others) th.join();
  });
  EXPECT_EQ(problems.count(), 0) << problems.report();
  EXPECT_GT(quick_runs.load(), 0);
  EXPECT_THAT(fetch(*s, quick, {{p, Tensor(1.0f)}}), IsOkAndHolds(TensorEq(Tensor(6.0f))));
}

// (b) close() from another thread 50 ms into the polling kernel: the kernel
// sees the cancellation and the run returns Cancelled.
TEST(ConcurrencyStressTest, CloseCancelsAPollingKernelAndTheRunReturnsCancelled) {
  std::atomic<bool> saw_cancel{false};
  Signal started;
  Graph g;
  Output polled = polling_kernel(g, {}, &saw_cancel, &started);
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  run_bounded("close with a polling kernel", [&] {
    std::thread closer([&] {
      started.wait();
      std::this_thread::sleep_for(milliseconds(50));  // the scenario: close 50 ms in
      EXPECT_THAT(s->close(), IsOk());
    });
    const auto t0 = Clock::now();
    Result<std::vector<Tensor>> r = s->run({}, {polled});
    const auto elapsed = Clock::now() - t0;
    started.notify();  // in case the kernel never ran
    closer.join();
    EXPECT_THAT(r, StatusIs(StatusCode::kCancelled, ""));
    EXPECT_FALSE(r.status().message().empty());
    EXPECT_TRUE(saw_cancel.load()) << "the kernel never saw is_cancelled()";
    EXPECT_LT(elapsed, seconds(2));
  });
}

// (c) A kernel that blocks 200 ms without polling, under a 20 ms timeout,
// followed by a node that counts its executions: the run returns
// DeadlineExceeded and the second node never runs.
TEST(ConcurrencyStressTest, DeadlineDuringABlockingKernelStopsTheRunBeforeItsSuccessor) {
  std::atomic<int> blocked{0};
  std::atomic<int> after{0};
  Graph g;
  Output blocking = ops::Call(
      g, {}, {DType::kFloat32},
      [&blocked](OpKernelContext& ctx) -> Status {
        std::this_thread::sleep_for(milliseconds(200));
        blocked.fetch_add(1);
        return ctx.set_output(0, Tensor(1.0f));
      },
      {}, "blocking")[0];
  Output counted = ops::Call(
      g, {blocking}, {DType::kFloat32},
      [&after](OpKernelContext& ctx) -> Status {
        after.fetch_add(1);
        return ctx.set_output(0, ctx.input(0));
      },
      {}, "counted")[0];
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  RunOptions o;
  o.timeout = milliseconds(20);
  run_bounded("deadline during a blocking kernel", [&] {
    Result<std::vector<Tensor>> r = s->run({}, {counted}, {}, o);
    EXPECT_THAT(r, StatusIs(StatusCode::kDeadlineExceeded, "'blocking'"));
  });
  EXPECT_EQ(blocked.load(), 1);
  EXPECT_EQ(after.load(), 0) << "the successor ran after the deadline";
}

// ---- 10. Destroying a session under open handles ----

// One thread holds an open partial run (one call made, not complete) and a
// Callable it has finished using; another is blocked inside a partial-run
// call whose kernel polls is_cancelled(). Destroying the session: the
// blocked call returns Cancelled, both handles are done (inert: another
// session refuses them), and destroying them and the Callable afterwards is
// safe.
TEST(ConcurrencyStressTest, DestroyingASessionMakesOpenPartialRunHandlesInert) {
  std::atomic<bool> saw_cancel{false};
  Signal polling_started;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output a = ops::Mul(g, x, ops::Const(g, Tensor(2.0f)), "a");
  Output b = ops::Add(g, a, y, "b");
  // Reads x: it starts only once a call feeds x, never at setup.
  Output polled = polling_kernel(g, {x}, &saw_cancel, &polling_started);
  Output after_poll = ops::Add(g, polled, x, "after_poll");
  ASSERT_GRAPH_OK(g);
  auto s = make_session(g);
  auto other_session = make_session(g);

  run_bounded("destroying a session under open handles", [&] {
    Signal holder_ready;
    std::latch destroyed(1);
    Session* raw = s.get();
    std::thread holder([&] {
      Result<PartialRunHandle> h = raw->partial_run_setup({a, b}, {x, y});
      Result<Callable> c = raw->make_callable({x}, {a});
      const bool ready = h.is_ok() && c.is_ok();
      EXPECT_THAT(h, IsOk());
      EXPECT_THAT(c, IsOk());
      if (ready) {
        EXPECT_THAT(raw->partial_run(*h, {{x, Tensor(1.0f)}}, {a}),
                    IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
        Tensor out[1];
        const Tensor feed[1] = {Tensor(4.0f)};
        EXPECT_THAT(c->run(feed, out), IsOk());
        EXPECT_THAT(out[0], TensorEq(Tensor(8.0f)));
      }
      holder_ready.notify();
      destroyed.wait();
      if (!ready) return;
      EXPECT_TRUE(h->is_valid());
      EXPECT_TRUE(h->is_done()) << "an open partial run outlived its session";
      EXPECT_EQ(h->id().rfind("pr-", 0), 0u);
      EXPECT_THAT(other_session->partial_run(*h, {{y, Tensor(1.0f)}}, {b}),
                  StatusIs(StatusCode::kInvalidArgument, "does not belong"));
      EXPECT_THAT(other_session->cancel_partial_run(*h),
                  StatusIs(StatusCode::kInvalidArgument, "does not belong"));
      // Handle and Callable destroyed after the session.
    });
    std::thread blocked([&] {
      Result<PartialRunHandle> h = raw->partial_run_setup({after_poll}, {x});
      if (!h.is_ok()) {
        ADD_FAILURE() << h.status().to_string();
        polling_started.notify();
        return;
      }
      Result<std::vector<Tensor>> r = raw->partial_run(*h, {{x, Tensor(1.0f)}}, {after_poll});
      polling_started.notify();  // in case the kernel never ran (then r is an error)
      EXPECT_THAT(r, StatusIs(StatusCode::kCancelled, ""));
      EXPECT_FALSE(r.status().message().empty());
      EXPECT_TRUE(h->is_done());
    });
    holder_ready.wait();
    polling_started.wait();
    s.reset();  // waits for the blocked call to let go
    destroyed.count_down();
    holder.join();
    blocked.join();
  });
  EXPECT_TRUE(saw_cancel.load()) << "the kernel of the blocked call never saw is_cancelled()";
  // The other session never saw any of this.
  EXPECT_EQ(other_session->num_open_partial_runs(), 0u);
  EXPECT_THAT(fetch(*other_session, b, {{x, Tensor(1.0f)}, {y, Tensor(1.0f)}}),
              IsOkAndHolds(TensorEq(Tensor(3.0f))));
}

}  // namespace
}  // namespace graphrun
