// Session::run on the scheduler, with private test ops: pruning, feeds,
// fetch order, errors, state of instances across runs. Every test runs twice:
// with default-policy nodes, and with cheap kernels run as lightweight
// (inline) nodes.
#include <gtest/gtest.h>

#include <stop_token>
#include <thread>

#include "tests/scheduler/test_ops.h"
#include "tests/testing/op_harness.h"

namespace graphrun::testing {
namespace {

class SessionRunTest : public ::testing::TestWithParam<bool> {
 protected:
  ExecCounter counter_;
  std::unique_ptr<OpRegistry> registry_ = make_test_registry(&counter_, /*cheap=*/GetParam());
  Graph g_{*registry_};
};

INSTANTIATE_TEST_SUITE_P(Policies, SessionRunTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Lightweight" : "Default";
                         });

TEST_P(SessionRunTest, ComputesFetchInCallerOrder) {
  Output a = value(g_, 1.0f, "a");
  Output b = value(g_, 2.0f, "b");
  Output c = sum2(g_, a, b, "c");
  ASSERT_TRUE(g_.status().is_ok()) << g_.status().to_string();
  auto s = make_session(g_);
  auto out = s->run({}, {c, a, "b:0", c});
  ASSERT_THAT(out, IsOk());
  ASSERT_EQ(out->size(), 4u);
  EXPECT_EQ((*out)[0].scalar<float>(), 3.0f);
  EXPECT_EQ((*out)[1].scalar<float>(), 1.0f);
  EXPECT_EQ((*out)[2].scalar<float>(), 2.0f);
  EXPECT_EQ((*out)[3].scalar<float>(), 3.0f);
  EXPECT_EQ(counter_.count("c"), 1) << "a repeated fetch must not run its node twice";
}

TEST_P(SessionRunTest, ASessionTakesAMovedGraphOverWithoutACopy) {
  Output a = value(g_, 1.0f, "a");
  Output b = value(g_, 2.0f, "b");
  Output c = sum2(g_, a, b, "c");
  const Node* c_node = c.node();
  ASSERT_TRUE(g_.status().is_ok()) << g_.status().to_string();
  Result<std::unique_ptr<Session>> s = Session::create(std::move(g_));
  ASSERT_THAT(s.status(), IsOk());
  // The source is empty and usable; the Outputs now name the session's nodes.
  EXPECT_EQ(g_.num_nodes(), 0);
  EXPECT_TRUE(g_.status().is_ok());
  EXPECT_EQ(&c_node->graph(), &(*s)->graph());
  auto out = (*s)->run({}, {c, "a:0"});
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)[0].scalar<float>(), 3.0f);
  EXPECT_EQ((*out)[1].scalar<float>(), 1.0f);
  EXPECT_EQ(counter_.count("c"), 1);
  // A new graph in the moved-from one is independent of the session's.
  value(g_, 5.0f, "a");
  EXPECT_TRUE(g_.status().is_ok());
  EXPECT_EQ(g_.num_nodes(), 1);
  EXPECT_EQ((*s)->graph().num_nodes(), 3);
}

TEST_P(SessionRunTest, AMovedGraphWithABuildErrorIsRefused) {
  value(g_, 1.0f, "a");
  g_.record_error(invalid_argument("broken on purpose"));
  Result<std::unique_ptr<Session>> s = Session::create(std::move(g_));
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("broken on purpose"), std::string::npos)
      << s.status().to_string();
}

TEST_P(SessionRunTest, RunsOnlyWhatFetchesNeed) {
  Output a = value(g_, 1.0f, "a");
  Output x = sum2(g_, a, a, "x");
  Output y = sum2(g_, a, a, "y");
  auto s = make_session(g_);
  ASSERT_THAT(s->run({}, {x}), IsOk());
  EXPECT_EQ(counter_.count("x"), 1);
  EXPECT_EQ(counter_.count("y"), 0);
  (void)y;
}

TEST_P(SessionRunTest, FeedCutsTheGraphAndSkipsTheProducer) {
  Output src = source(g_, "src");
  Output x = sum2(g_, src, src, "x");
  auto s = make_session(g_);
  auto out = s->run({{src, Tensor(5.0f)}}, {x});
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)[0].scalar<float>(), 10.0f);
  EXPECT_EQ(counter_.count("src"), 0);
  // Fetching a fed tensor returns the fed value.
  auto fed = s->run({{"src", Tensor(7.0f)}}, {src});
  ASSERT_THAT(fed, IsOk());
  EXPECT_EQ((*fed)[0].scalar<float>(), 7.0f);
  EXPECT_EQ(counter_.count("src"), 0);
}

TEST_P(SessionRunTest, UnfedPlaceholderNamesItWithDtypeAndShape) {
  Output p = placeholder(g_, Shape{2, -1}, "input");
  Output x = sum2(g_, p, p, "x");
  auto s = make_session(g_);
  EXPECT_THAT(
      s->run({}, {x}),
      StatusIs(StatusCode::kInvalidArgument,
               "You must feed a value for placeholder tensor 'input' with dtype float32 and "
               "shape [2,?]"));
  auto ok = s->run({{p, Tensor::matrix<float>({{1, 2}, {3, 4}})}}, {x});
  ASSERT_THAT(ok, IsOk());
  EXPECT_THAT((*ok)[0], TensorEq(Tensor::matrix<float>({{2, 4}, {6, 8}})));
}

TEST_P(SessionRunTest, FeedOfWrongDtypeOrShapeNamesTheTensor) {
  Output p = placeholder(g_, Shape{2}, "p");
  Output x = sum2(g_, p, p, "x");
  auto s = make_session(g_);
  EXPECT_THAT(s->run({{p, Tensor(1)}}, {x}),
              StatusIs(StatusCode::kInvalidArgument, "feed 'p:0' expects float32[2], got int32[]"));
  EXPECT_THAT(
      s->run({{p, Tensor{1.0f, 2.0f, 3.0f}}}, {x}),
      StatusIs(StatusCode::kInvalidArgument, "feed 'p:0' expects float32[2], got float32[3]"));
}

TEST_P(SessionRunTest, NameErrors) {
  Output a = value(g_, 1.0f, "a");
  const Node* k = sink(g_, {a}, "k");
  auto s = make_session(g_);
  EXPECT_THAT(s->run({}, {"nope:0"}), StatusIs(StatusCode::kNotFound, "nope"));
  EXPECT_THAT(s->run({}, {"a:1"}), StatusIs(StatusCode::kInvalidArgument, "a:1"));
  EXPECT_THAT(s->run({}, {"a:x"}), StatusIs(StatusCode::kInvalidArgument, "a:x"));
  EXPECT_THAT(s->run({}, {"k"}), StatusIs(StatusCode::kInvalidArgument, "produces no output"));
  EXPECT_THAT(s->run({}, {}, {"ghost"}), StatusIs(StatusCode::kNotFound, "ghost"));
  EXPECT_THAT(s->run({}, {}), StatusIs(StatusCode::kInvalidArgument, "at least one target"));
  EXPECT_THAT(s->run({{a, Tensor(1.0f)}, {"a:0", Tensor(2.0f)}}, {a}),
              StatusIs(StatusCode::kInvalidArgument, "fed more than once"));
  EXPECT_THAT(s->run({}, {}, {k}), IsOk());
  EXPECT_EQ(counter_.count("k"), 1);
}

TEST_P(SessionRunTest, KernelErrorNamesNodeOpAndShapes) {
  Output a = value(g_, 1.0f, "a");
  Output f = fail(g_, a, "bad");
  Output after = sum2(g_, f, f, "after");
  auto s = make_session(g_);
  EXPECT_THAT(s->run({}, {after}), StatusIs(StatusCode::kInvalidArgument,
                                            "node 'bad' (Fail): boom (inputs: float32[])"));
  EXPECT_EQ(counter_.count("after"), 0) << "successors of a failed node are skipped";
  // The session stays usable and the pooled instance is clean.
  auto ok = s->run({}, {a});
  ASSERT_THAT(ok, IsOk());
}

TEST_P(SessionRunTest, CycleThroughControlEdgesIsAnError) {
  Output a = source(g_, "a");
  Output b = sum2(g_, a, a, "b");
  ASSERT_TRUE(g_.add_control_input(g_.mutable_node(a.node()->id()), b.node()).is_ok());
  auto s = make_session(g_);
  EXPECT_THAT(s->run({}, {b}), StatusIs(StatusCode::kInvalidArgument, "cycle"));
}

TEST_P(SessionRunTest, PlansAreCachedPerSignature) {
  Output a = value(g_, 1.0f, "a");
  Output b = sum2(g_, a, a, "b");
  auto s = make_session(g_);
  for (int i = 0; i < 5; ++i) ASSERT_THAT(s->run({}, {b}), IsOk());
  EXPECT_EQ(s->num_cached_plans(), 1u);
  ASSERT_THAT(s->run({}, {a}), IsOk());
  EXPECT_EQ(s->num_cached_plans(), 2u);
}

TEST_P(SessionRunTest, PlanCacheIsBounded) {
  Output a = value(g_, 1.0f, "a");
  std::vector<Output> outs;
  for (int i = 0; i < 10; ++i) outs.push_back(sum2(g_, a, a));
  SessionOptions o;
  o.plan_cache_capacity = 3;
  auto s = make_session(g_, o);
  for (const Output& x : outs) ASSERT_THAT(s->run({}, {x}), IsOk());
  EXPECT_EQ(s->num_cached_plans(), 3u);
}

TEST_P(SessionRunTest, ConcurrentRunsOfOneSignatureAreIndependent) {
  Output p = placeholder(g_, Shape{}, "p");
  Output x = sum2(g_, p, p, "x");
  Output y = sum2(g_, x, p, "y");
  auto s = make_session(g_);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const auto v = static_cast<float>(t * 1000 + i);
        auto out = s->run({{p, Tensor(v)}}, {y});
        if (!out.is_ok() || (*out)[0].scalar<float>() != 3 * v) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(counter_.count("y"), 800);
}

TEST_P(SessionRunTest, CallableRunsPositionally) {
  Output p = placeholder(g_, Shape{}, "p");
  Output x = sum2(g_, p, p, "x");
  auto s = make_session(g_);
  auto c = s->make_callable({p}, {x, p});
  ASSERT_THAT(c, IsOk());
  Tensor feed(2.0f);
  std::vector<Tensor> out(2);
  ASSERT_TRUE(c->run({&feed, 1}, out).is_ok());
  EXPECT_EQ(out[0].scalar<float>(), 4.0f);
  EXPECT_EQ(out[1].scalar<float>(), 2.0f);
  EXPECT_THAT(c->run({}, out), StatusIs(StatusCode::kInvalidArgument, "expected 1 feed"));
}

TEST_P(SessionRunTest, ClosedSessionRefusesRuns) {
  Output a = value(g_, 1.0f, "a");
  auto s = make_session(g_);
  ASSERT_TRUE(s->close().is_ok());
  EXPECT_THAT(s->run({}, {a}), StatusIs(StatusCode::kCancelled, "Session has been closed."));
  ASSERT_TRUE(s->close().is_ok());
}

TEST_P(SessionRunTest, TracingRecordsEveryExecutedNode) {
  Output a = value(g_, 1.0f, "a");
  Output b = sum2(g_, a, a, "b");
  auto s = make_session(g_);
  RunOptions opts;
  opts.trace = true;
  RunMetadata md;
  ASSERT_THAT(s->run({}, {b}, {}, opts, &md), IsOk());
  ASSERT_EQ(md.step_stats.size(), 2u);
  for (const auto& st : md.step_stats) {
    EXPECT_LE(st.start_ns, st.end_ns);
    EXPECT_GE(st.thread, 0);
  }
}

TEST_P(SessionRunTest, DeadlineSkipsTheNodesAfterASlowOne) {
  Output p = placeholder(g_, Shape{}, "p");
  Output late = slow(g_, p, 300, "late");
  Output x = sum2(g_, late, p, "x");
  Output y = sum2(g_, x, x, "y");
  auto s = make_session(g_);
  // Compile the signature first, and leave 'late' 100 ms to start: under
  // TSan or on a loaded machine, a 5 ms window passed before it started.
  ASSERT_THAT(s->make_callable({p}, {y}), IsOk());
  RunOptions opts;
  opts.timeout = std::chrono::milliseconds(100);
  EXPECT_THAT(s->run({{p, Tensor(1.0f)}}, {y}, {}, opts),
              StatusIs(StatusCode::kDeadlineExceeded, "while node 'late' (Slow)"));
  EXPECT_EQ(counter_.count("x"), 0);
  EXPECT_EQ(counter_.count("y"), 0);
  auto ok = s->run({{p, Tensor(1.0f)}}, {y});
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ((*ok)[0].scalar<float>(), 4.0f);
}

// A timeout past what the clock can count (a remote client may send
// INT64_MAX ms) means no deadline: adding it to now() overflowed the
// nanosecond count, which made the deadline some time in the past.
TEST_P(SessionRunTest, ATimeoutPastTheClocksRangeIsNoDeadline) {
  Output p = placeholder(g_, Shape{}, "p");
  Output x = sum2(g_, p, p, "x");
  auto s = make_session(g_);
  for (const auto timeout :
       {std::chrono::milliseconds::max(), std::chrono::milliseconds(int64_t{1} << 60),
        std::chrono::milliseconds(int64_t{1} << 44)}) {
    RunOptions opts;
    opts.timeout = timeout;
    auto out = s->run({{p, Tensor(1.5f)}}, {x}, {}, opts);
    ASSERT_THAT(out, IsOk()) << timeout.count() << " ms";
    EXPECT_EQ((*out)[0].scalar<float>(), 3.0f);
    auto partial = s->partial_run_setup({x}, {p}, {}, opts);
    ASSERT_THAT(partial, IsOk()) << timeout.count() << " ms";
    auto fed = s->partial_run(*partial, {{p, Tensor(2.0f)}}, {x});
    ASSERT_THAT(fed, IsOk()) << timeout.count() << " ms";
    EXPECT_EQ((*fed)[0].scalar<float>(), 4.0f);
  }
}

TEST_P(SessionRunTest, CloseCancelsARunBetweenNodes) {
  Output p = placeholder(g_, Shape{}, "p");
  Output late = slow(g_, p, 50, "late");
  Output x = sum2(g_, late, p, "x");
  auto s = make_session(g_);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_THAT(s->close(), IsOk());
  });
  EXPECT_THAT(s->run({{p, Tensor(1.0f)}}, {x}),
              StatusIs(StatusCode::kCancelled, "Session has been closed."));
  closer.join();
  EXPECT_EQ(counter_.count("x"), 0);
}

TEST_P(SessionRunTest, StopTokenCancelsARunBetweenNodes) {
  Output p = placeholder(g_, Shape{}, "p");
  Output late = slow(g_, p, 50, "late");
  Output x = sum2(g_, late, p, "x");
  auto s = make_session(g_);
  std::stop_source stop;
  RunOptions opts;
  opts.stop_token = stop.get_token();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop.request_stop();
  });
  EXPECT_THAT(s->run({{p, Tensor(1.0f)}}, {x}, {}, opts),
              StatusIs(StatusCode::kCancelled, "the run was cancelled by its caller"));
  stopper.join();
  EXPECT_EQ(counter_.count("x"), 0);
  // Stopped before it starts: no node runs; the session stays usable.
  EXPECT_THAT(s->run({{p, Tensor(1.0f)}}, {x}, {}, opts),
              StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
  EXPECT_EQ(counter_.count("x"), 0);
  std::stop_source unused;
  opts.stop_token = unused.get_token();
  auto ok = s->run({{p, Tensor(1.0f)}}, {x}, {}, opts);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ((*ok)[0].scalar<float>(), 2.0f);
  // A Callable honours the token too.
  auto callable = s->make_callable({p}, {x});
  ASSERT_THAT(callable, IsOk());
  std::vector<Tensor> out(1);
  const std::vector<Tensor> feeds{Tensor(1.0f)};
  opts.stop_token = stop.get_token();
  EXPECT_THAT(callable->run(feeds, out, opts),
              StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
}

TEST_P(SessionRunTest, TracingReportsInlineNodesWithTheirThread) {
  Output a = value(g_, 1.0f, "a");
  Output b = sum2(g_, a, a, "b");
  Output c = sum2(g_, b, a, "c");
  Output d = sum2(g_, c, b, "d");
  auto s = make_session(g_);
  RunOptions opts;
  opts.trace = true;
  RunMetadata md;
  auto out = s->run({}, {d}, {}, opts, &md);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)[0].scalar<float>(), 5.0f);
  ASSERT_EQ(md.step_stats.size(), 4u);
  for (const auto& st : md.step_stats) {
    EXPECT_LE(st.start_ns, st.end_ns) << st.node;
    EXPECT_GE(st.thread, 0) << st.node;
    EXPECT_EQ(st.output_shapes.size(), 1u) << st.node;
  }
}

}  // namespace
}  // namespace graphrun::testing
