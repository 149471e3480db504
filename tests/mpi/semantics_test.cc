// TensorFlow's run and partial-run semantics on a graph split across ranks
// (part of mpi_test, under mpirun on 1, 2 and 4 ranks): each case runs one
// script of calls against an ordinary Session in the driver's process and
// against a DistributedSession whose graph has nodes on the last rank, and
// every call must come out the same: the same values, the same error code
// and message (a worker's "rank N: " prefix aside). The cases follow the
// one-process suites (tests/scheduler/partial_run_test.cc, tests/api):
// pruning, feeding any tensor, unfed placeholders, the seed example's
// stage once per partial run, fetching earlier values, inputs computed
// outside the graph from earlier outputs, stateful ops once, awaited
// targets, misuse leaving the run usable, a kernel error ending it,
// cancel and close.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;

int rank() { return mpi::World::current()->rank(); }
int size() { return mpi::World::current()->size(); }
std::string far() { return "/rank:" + std::to_string(size() - 1); }

RunOptions bounded() {
  RunOptions options;
  options.timeout = 60s;
  return options;
}

// The calls a case makes: one partial run open at a time.
class Driver {
 public:
  virtual ~Driver() = default;
  virtual Result<std::vector<Tensor>> run(const FeedList& feeds,
                                          const std::vector<TensorRef>& fetches,
                                          const std::vector<TargetRef>& targets) = 0;
  virtual Status setup(const std::vector<TensorRef>& fetches, const std::vector<TensorRef>& feeds,
                       const std::vector<TargetRef>& targets) = 0;
  virtual Result<std::vector<Tensor>> call(const FeedList& feeds,
                                           const std::vector<TensorRef>& fetches,
                                           const std::vector<TargetRef>& targets) = 0;
  virtual Status cancel() = 0;
  virtual Status close() = 0;
};

class LocalDriver final : public Driver {
 public:
  explicit LocalDriver(const Graph& g) : s_(Session::create(g).value()) {}
  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets) override {
    return s_->run(feeds, fetches, targets, bounded());
  }
  Status setup(const std::vector<TensorRef>& fetches, const std::vector<TensorRef>& feeds,
               const std::vector<TargetRef>& targets) override {
    Result<PartialRunHandle> h = s_->partial_run_setup(fetches, feeds, targets, bounded());
    if (!h.is_ok()) return h.status();
    h_ = std::move(*h);
    return Status::ok();
  }
  Result<std::vector<Tensor>> call(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                   const std::vector<TargetRef>& targets) override {
    return s_->partial_run(h_, feeds, fetches, targets, bounded());
  }
  Status cancel() override { return s_->cancel_partial_run(h_); }
  Status close() override { return s_->close(); }

 private:
  std::unique_ptr<Session> s_;
  PartialRunHandle h_;
};

class RanksDriver final : public Driver {
 public:
  explicit RanksDriver(mpi::DistributedSession& s) : s_(s) {}
  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets) override {
    return s_.run(feeds, fetches, targets, bounded());
  }
  Status setup(const std::vector<TensorRef>& fetches, const std::vector<TensorRef>& feeds,
               const std::vector<TargetRef>& targets) override {
    Result<mpi::DistributedSession::PartialRun> h =
        s_.partial_run_setup(fetches, feeds, targets, bounded());
    if (!h.is_ok()) return h.status();
    h_ = std::move(*h);
    return Status::ok();
  }
  Result<std::vector<Tensor>> call(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                   const std::vector<TargetRef>& targets) override {
    return s_.partial_run(h_, feeds, fetches, targets, bounded());
  }
  Status cancel() override { return s_.cancel_partial_run(h_); }
  Status close() override { return s_.close(); }

 private:
  mpi::DistributedSession& s_;
  mpi::DistributedSession::PartialRun h_;
};

// What one call gave, as compared between the two drivers.
struct Outcome {
  std::string what;  // the call, for the failure message
  StatusCode code = StatusCode::kOk;
  std::string message;  // without a worker's "rank N: " prefix
  std::vector<Tensor> values;
};

// A case's script: its calls go through `d` and are noted in `log`.
class Script {
 public:
  Script(Driver& d, std::vector<Outcome>& log) : d_(d), log_(log) {}
  Driver& driver() { return d_; }
  // Notes a call's outcome; returns its values (empty on an error).
  std::vector<Tensor> note(std::string what, const Result<std::vector<Tensor>>& r) {
    Outcome o{.what = std::move(what)};
    if (r.is_ok()) {
      o.values = *r;
    } else {
      o.code = r.status().code();
      // Partial-run handles have ids of their own session.
      o.message = std::regex_replace(std::regex_replace(std::string(r.status().message()),
                                                        std::regex("(^|: )rank [0-9]+: "), "$1"),
                                     std::regex("partial run pr-[0-9a-f]+"), "the partial run");
    }
    log_.push_back(o);
    return o.values;
  }
  Status note(std::string what, const Status& s) {
    note(std::move(what), s.is_ok() ? Result<std::vector<Tensor>>(std::vector<Tensor>())
                                    : Result<std::vector<Tensor>>(s));
    return s;
  }
  std::vector<Tensor> run(const std::string& what, const FeedList& feeds,
                          const std::vector<TensorRef>& fetches,
                          const std::vector<TargetRef>& targets = {}) {
    return note("run " + what, d_.run(feeds, fetches, targets));
  }
  Status setup(const std::string& what, const std::vector<TensorRef>& fetches,
               const std::vector<TensorRef>& feeds, const std::vector<TargetRef>& targets = {}) {
    return note("setup " + what, d_.setup(fetches, feeds, targets));
  }
  std::vector<Tensor> call(const std::string& what, const FeedList& feeds,
                           const std::vector<TensorRef>& fetches,
                           const std::vector<TargetRef>& targets = {}) {
    return note("partial_run " + what, d_.call(feeds, fetches, targets));
  }

 private:
  Driver& d_;
  std::vector<Outcome>& log_;
};

// Runs `script` on one process and across the ranks (the other ranks serve
// `g`), and compares every call.
void same_as_one_process(const Graph& g, const std::function<void(Script&)>& script) {
  ASSERT_THAT(g.status(), IsOk());
  if (rank() != 0) {
    SessionOptions options;
    options.inter_op_threads = 2;
    EXPECT_THAT(mpi::serve(g, options), IsOk());
    return;
  }
  std::vector<Outcome> want, got;
  {
    LocalDriver local(g);
    Script s(local, want);
    script(s);
  }
  SessionOptions options;
  options.inter_op_threads = 2;
  auto session = mpi::DistributedSession::create(g, options);
  ASSERT_THAT(session, IsOk());
  {
    RanksDriver ranks(**session);
    Script s(ranks, got);
    script(s);
  }
  EXPECT_THAT((*session)->close(), IsOk());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Outcome& w = want[i];
    const Outcome& o = got[i];
    SCOPED_TRACE(fmt::format("call {}: {}", i, w.what));
    EXPECT_EQ(o.code, w.code) << o.message;
    EXPECT_EQ(o.message, w.message);
    ASSERT_EQ(o.values.size(), w.values.size());
    for (std::size_t k = 0; k < w.values.size(); ++k) {
      EXPECT_TRUE(o.values[k].equals(w.values[k]))
          << "value " << k << ": " << o.values[k].to_string() << " vs " << w.values[k].to_string();
    }
  }
}

class SemanticsAcrossRanksTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

// The seed example split across ranks: x on rank 0; the expensive stage
// (with a counter bumped each time it runs) on the far rank; a cheap head
// on rank 0.
struct Seed {
  Graph g;
  Output x, w, stage, head, counter, count;
  const Node* init = nullptr;
  Seed() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{2, 2}, "x");
    {
      auto scope = g.device(far());
      counter = ops::Variable(g, Tensor(int64_t{0}), "stage_runs");
      Output bump = ops::AssignAdd(g, counter, ops::Const(g, Tensor(int64_t{1})), {}, "bump");
      w = ops::Const(g, Tensor::matrix<float>({{0.5f, -1}, {2, 0.25f}}), "w");
      stage = ops::Tanh(g, ops::MatMul(g, x, w, {}, "mm"), "stage");
      static_cast<void>(g.add_control_input(g.mutable_node(stage.node()->id()), bump.node()));
      count = ops::Identity(g, ops::ReadVariable(g, counter), "count");
    }
    auto scope = g.device("/rank:0");
    head = ops::Add(g, ops::Square(g, stage, "sq"), ops::Const(g, Tensor(1.0f)), "head");
    init = ops::GlobalVariablesInitializer(g);
  }
};

const Tensor kX = Tensor::matrix<float>({{1, 2}, {-0.5f, 0.75f}});

TEST_F(SemanticsAcrossRanksTest, RunPrunesFeedsAnyTensorAndNamesAnUnfedPlaceholder) {
  Seed m;
  Output y, far_sum;
  {
    auto scope = m.g.device(far());
    y = ops::Placeholder(m.g, DType::kFloat32, Shape{}, "y");
    far_sum = ops::Add(m.g, y, ops::Const(m.g, Tensor(1.0f)), "far_sum");
  }
  same_as_one_process(m.g, [&](Script& s) {
    s.run("init", {}, {}, {m.init});
    s.run("head", {{m.x, kX}}, {m.head, m.stage, m.head});
    // The stage fed: its MatMul and its counter do not run.
    s.run("head with the stage fed", {{m.stage, Tensor::matrix<float>({{1, 0}, {0, 2}})}},
          {m.head});
    // Only what the fetches need: the counter is read, nothing else runs.
    s.run("count", {}, {m.count});
    s.run("needs y", {}, {far_sum});
    s.run("needs x", {}, {m.head});
    s.run("y fed", {{y, Tensor(41.0f)}}, {far_sum});
    s.run("nothing", {}, {});
    s.run("wrong dtype", {{m.x, Tensor::matrix<int32_t>({{1, 2}, {3, 4}})}}, {m.head});
    s.run("count again", {}, {m.count});
  });
}

TEST_F(SemanticsAcrossRanksTest, ThePartialRunRunsTheStageOnceAndFetchesEarlierValuesFree) {
  Seed m;
  same_as_one_process(m.g, [&](Script& s) {
    s.run("init", {}, {}, {m.init});
    ASSERT_THAT(s.setup("stage and head", {m.stage, m.head}, {m.x}), IsOk());
    s.call("stage", {{m.x, kX}}, {m.stage});
    s.call("head", {}, {m.head});
    s.run("count", {}, {m.count});
    // Fetched in the reverse order, the stage computed by the first call.
    ASSERT_THAT(s.setup("head first", {m.stage, m.head}, {m.x}), IsOk());
    s.call("head", {{m.x, kX}}, {m.head});
    s.call("stage", {}, {m.stage});
    s.run("count", {}, {m.count});
  });
}

TEST_F(SemanticsAcrossRanksTest, ALaterInputComputedOutsideFromAnEarlierOutput) {
  Seed m;
  Output b, second;
  {
    auto scope = m.g.device(far());
    b = ops::Placeholder(m.g, DType::kFloat32, Shape{}, "b");
  }
  {
    auto scope = m.g.device("/rank:0");
    second = ops::Mul(m.g, m.head, b, "second");
  }
  same_as_one_process(m.g, [&](Script& s) {
    s.run("init", {}, {}, {m.init});
    ASSERT_THAT(s.setup("two feeds", {m.stage, second}, {m.x, b}), IsOk());
    std::vector<Tensor> first = s.call("stage", {{m.x, kX}}, {m.stage});
    ASSERT_EQ(first.size(), 1u);
    float total = 0;
    for (float v : first[0].flat<float>()) total += v;
    s.call("second", {{b, Tensor(total)}}, {second});
    s.run("count", {}, {m.count});
  });
}

TEST_F(SemanticsAcrossRanksTest, StatefulOpsActOncePerPartialRunAndTargetsAreAwaited) {
  Graph g;
  g.set_seed(7);
  Output x, rnd, twice, var, inc, read;
  x = ops::Placeholder(g, DType::kFloat32, Shape{3}, "x");
  {
    auto scope = g.device(far());
    rnd = ops::RandomUniform(g, Shape{3}, DType::kFloat32, {}, "rnd");
    var = ops::Variable(g, Tensor(int64_t{100}), "var");
    inc = ops::AssignAdd(g, var, ops::Const(g, Tensor(int64_t{5})), {}, "inc");
    read = ops::Identity(g, ops::ReadVariable(g, var), "read");
  }
  {
    auto scope = g.device("/rank:0");
    twice = ops::Add(g, ops::Add(g, rnd, rnd, "doubled"), x, "twice");
  }
  const Node* init = ops::GlobalVariablesInitializer(g);
  same_as_one_process(g, [&](Script& s) {
    s.run("init", {}, {}, {init});
    ASSERT_THAT(s.setup("random and update", {rnd, twice}, {x}, {inc.node()}), IsOk());
    std::vector<Tensor> drawn = s.call("rnd", {}, {rnd});
    std::vector<Tensor> derived =
        s.call("twice, inc awaited", {{x, Tensor{0.0f, 0.0f, 0.0f}}}, {twice}, {inc.node()});
    // Drawn once: the second call's sum is of the first call's draw.
    ASSERT_EQ(drawn.size(), 1u);
    ASSERT_EQ(derived.size(), 1u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(derived[0].flat<float>()[i], 2 * drawn[0].flat<float>()[i]) << i;
    }
    s.run("read", {}, {read});
    s.run("inc alone", {}, {}, {inc.node()});
    s.run("read again", {}, {read});
  });
}

TEST_F(SemanticsAcrossRanksTest, MisuseLeavesThePartialRunUsable) {
  Seed m;
  Output y, far_sum;
  {
    auto scope = m.g.device(far());
    y = ops::Placeholder(m.g, DType::kFloat32, Shape{}, "y");
    far_sum = ops::Add(m.g, y, ops::Const(m.g, Tensor(1.0f)), "far_sum");
  }
  same_as_one_process(m.g, [&](Script& s) {
    s.run("init", {}, {}, {m.init});
    static_cast<void>(s.setup("an undeclared placeholder needed", {far_sum}, {}));
    ASSERT_THAT(s.setup("two feeds", {m.head, far_sum}, {m.x, y}), IsOk());
    s.call("not yet computable", {}, {far_sum});
    s.call("undeclared feed", {{"stage:0", Tensor::matrix<float>({{1, 1}, {1, 1}})}}, {});
    s.call("undeclared fetch", {{m.x, kX}}, {"x:0"});
    s.call("x of the wrong dtype", {{m.x, Tensor::matrix<int32_t>({{1, 2}, {3, 4}})}}, {m.head});
    s.call("y of the wrong shape", {{y, Tensor{1.0f, 2.0f}}}, {});
    s.call("feed x, fetch head", {{m.x, kX}}, {m.head});
    s.call("x again", {{m.x, kX}}, {});
    s.call("head again", {}, {m.head});
    s.call("feed y, fetch the sum", {{y, Tensor(1.5f)}}, {far_sum});
    s.call("after the end", {}, {m.head});
    s.run("count", {}, {m.count});
  });
}

TEST_F(SemanticsAcrossRanksTest, AKernelErrorEndsThePartialRunAndCancelAndCloseEndIt) {
  Seed m;
  Output z, checked, after;
  {
    auto scope = m.g.device(far());
    z = ops::Placeholder(m.g, DType::kFloat32, Shape{}, "z");
    // Reciprocal of a negative number: InvalidArgument naming the node.
    checked = ops::Call(
        m.g, {z}, {DType::kFloat32},
        [](OpKernelContext& ctx) -> Status {
          if (ctx.input(0).scalar<float>() < 0) return invalid_argument("negative input");
          return ctx.set_output(0, Tensor(1.0f / ctx.input(0).scalar<float>()));
        },
        {}, "check")[0];
  }
  {
    auto scope = m.g.device("/rank:0");
    after = ops::Add(m.g, checked, m.head, "after");
  }
  same_as_one_process(m.g, [&](Script& s) {
    s.run("init", {}, {}, {m.init});
    ASSERT_THAT(s.setup("a check", {checked, after, m.head}, {z, m.x}), IsOk());
    s.call("a negative input", {{z, Tensor(-2.0f)}}, {checked});
    s.call("the run has ended", {{m.x, kX}}, {m.head});
    ASSERT_THAT(s.setup("cancelled", {checked, m.head}, {z, m.x}), IsOk());
    s.call("head", {{m.x, kX}}, {m.head});
    static_cast<void>(s.note("cancel", s.driver().cancel()));
    s.call("after cancel", {{z, Tensor(4.0f)}}, {checked});
    ASSERT_THAT(s.setup("closed", {checked, m.head}, {z, m.x}), IsOk());
    static_cast<void>(s.note("close", s.driver().close()));
    s.call("after close", {{z, Tensor(4.0f)}}, {checked});
    s.run("run after close", {{m.x, kX}}, {m.head});
  });
}

}  // namespace
}  // namespace graphrun
