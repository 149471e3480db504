// Variables through the public Session: Variable, Assign, AssignAdd,
// AssignSub, ReadVariable and GlobalVariablesInitializer.
#include <graphrun/graphrun.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::make_session;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs `targets` and returns the single fetch (or the error).
Result<Tensor> fetch(Session& s, const Output& out, const std::vector<TargetRef>& targets = {}) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> values, s.run({}, {out}, targets));
  return values.at(0);
}

TEST(VariableOpsTest, InitializeThenRead) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_EQ(v.node()->op(), "Variable");
  EXPECT_EQ(v.dtype(), DType::kFloat32);
  EXPECT_EQ(v.shape(), (Shape{2}));
  ASSERT_NE(g.find_node("v/Assign"), nullptr);
  ASSERT_NE(g.find_node("v/initial_value"), nullptr);
  EXPECT_THAT(g.collection("variable_initializers"), ElementsAre(g.find_node("v/Assign")));
  EXPECT_EQ(init->name(), "init");
  EXPECT_THAT(init->control_inputs(), ElementsAre(g.find_node("v/Assign")));

  auto s = make_session(g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f})));
}

TEST(VariableOpsTest, NamesFollowTheScope) {
  Graph g;
  Output v;
  {
    auto scope = g.name_scope("layer");
    v = ops::Variable(g, Tensor(1.0), "w");
    ops::Variable(g, Tensor(2.0), "w");
  }
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_EQ(v.node()->name(), "layer/w");
  EXPECT_NE(g.find_node("layer/w/Assign"), nullptr);
  EXPECT_NE(g.find_node("layer/w_1/Assign"), nullptr);
  EXPECT_EQ(g.find_node("layer/w_1/Assign")->attrs().at("var"),
            AttrValue(std::string("layer/w_1")));
  EXPECT_EQ(g.collection("variable_initializers").size(), 2u);
}

TEST(VariableOpsTest, InitialValueFromAnOutput) {
  Graph g;
  Output v = ops::Variable(g, ops::Const(g, Tensor::matrix<int32_t>({{1, 2}, {3, 4}})), "m");
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_EQ(v.shape(), (Shape{2, 2}));
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{1, 2}, {3, 4}}))));
}

TEST(VariableOpsTest, UninitializedReadIsFailedPrecondition) {
  Graph g;
  Output v = ops::Variable(g, Tensor(1.0f), "my_var");
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_THAT(run_one(g, v), StatusIs(StatusCode::kFailedPrecondition,
                                      "Attempting to use uninitialized value my_var"));
}

TEST(VariableOpsTest, UninitializedAssignAddIsFailedPrecondition) {
  Graph g;
  Output v = ops::Variable(g, Tensor(1.0f), "counter");
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor(1.0f)));
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_THAT(run_one(g, add), StatusIs(StatusCode::kFailedPrecondition,
                                        "Attempting to use uninitialized value counter"));
  Output sub = ops::AssignSub(g, v, ops::Const(g, Tensor(1.0f)), {.use_locking = false});
  EXPECT_THAT(run_one(g, sub), StatusIs(StatusCode::kFailedPrecondition, "counter"));
}

TEST(VariableOpsTest, AssignAssignAddAssignSub) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1, 2, 3}, "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output set = ops::Assign(g, v, ops::Const(g, Tensor{10, 20, 30}));
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor{1, 1, 1}));
  Output sub = ops::AssignSub(g, v, ops::Const(g, Tensor{5, 5, 5}), {.use_locking = false});
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_EQ(set.node()->attrs().at("validate_shape"), AttrValue(true));
  EXPECT_EQ(sub.node()->attrs().at("use_locking"), AttrValue(false));

  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s, add), IsOkAndHolds(TensorEq(Tensor{2, 3, 4})));
  EXPECT_THAT(fetch(*s, add), IsOkAndHolds(TensorEq(Tensor{3, 4, 5})));
  EXPECT_THAT(fetch(*s, sub), IsOkAndHolds(TensorEq(Tensor{-2, -1, 0})));
  EXPECT_THAT(fetch(*s, set), IsOkAndHolds(TensorEq(Tensor{10, 20, 30})));
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{10, 20, 30})));
  // The initializer resets it.
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{1, 2, 3})));
}

TEST(VariableOpsTest, ReadVariableAfterAControlDependency) {
  Graph g;
  Output v = ops::Variable(g, Tensor(1.0), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor(2.0)));
  Output read;
  {
    auto deps = g.control_dependencies({add.node()});
    read = ops::ReadVariable(g, v, "read");
  }
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  EXPECT_EQ(read.shape(), Shape{});
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s, read), IsOkAndHolds(TensorEq(Tensor(3.0))));
  EXPECT_THAT(fetch(*s, read), IsOkAndHolds(TensorEq(Tensor(5.0))));
}

TEST(VariableOpsTest, StatePersistsAcrossRunsAndIsPerSession) {
  Graph g;
  Output v = ops::Variable(g, Tensor(int64_t{0}), "steps");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor(int64_t{1})));
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));

  auto s1 = make_session(g);
  ASSERT_THAT(s1->run({}, {}, {init}), IsOk());
  for (int i = 0; i < 5; ++i) ASSERT_THAT(s1->run({}, {}, {add.node()}), IsOk());
  EXPECT_THAT(fetch(*s1, v), IsOkAndHolds(TensorEq(Tensor(int64_t{5}))));

  auto s2 = make_session(g);
  EXPECT_THAT(fetch(*s2, v), StatusIs(StatusCode::kFailedPrecondition, "steps"));
  ASSERT_THAT(s2->run({}, {}, {init}), IsOk());
  EXPECT_THAT(fetch(*s2, add), IsOkAndHolds(TensorEq(Tensor(int64_t{1}))));
  EXPECT_THAT(fetch(*s1, v), IsOkAndHolds(TensorEq(Tensor(int64_t{5}))));
}

TEST(VariableOpsTest, SnapshotsDoNotChangeUnderLaterUpdates) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 1.0f}, "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor{1.0f, 1.0f}));
  Output set = ops::Assign(g, v, ops::Const(g, Tensor{7.0f, 7.0f}));
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  Result<Tensor> read = fetch(*s, v);
  ASSERT_THAT(read, IsOk());
  Result<Tensor> after_one = fetch(*s, add);
  ASSERT_THAT(after_one, IsOk());
  Result<Tensor> after_two = fetch(*s, add);
  ASSERT_THAT(after_two, IsOk());
  ASSERT_THAT(fetch(*s, set), IsOk());
  EXPECT_THAT(*read, TensorEq(Tensor{1.0f, 1.0f}));
  EXPECT_THAT(*after_one, TensorEq(Tensor{2.0f, 2.0f}));
  EXPECT_THAT(*after_two, TensorEq(Tensor{3.0f, 3.0f}));
  EXPECT_FALSE(read->shares_buffer_with(*after_one));

  // Once no snapshot is held, updates are free to go in place; the values
  // are the same either way.
  read = Tensor();
  after_one = Tensor();
  after_two = Tensor();
  ASSERT_THAT(s->run({}, {}, {add.node()}), IsOk());
  ASSERT_THAT(s->run({}, {}, {add.node()}), IsOk());
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{9.0f, 9.0f})));
}

TEST(VariableOpsTest, AssignDoesNotAliasAFedValue) {
  Graph g;
  Output v = ops::Variable(g, Tensor{0.0f, 0.0f}, "v");
  Output value = ops::Placeholder(g, DType::kFloat32, Shape{2}, "value");
  Output set = ops::Assign(g, v, value);
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  auto s = make_session(g);
  Tensor fed{1.0f, 2.0f};
  ASSERT_THAT(s->run({{value, fed}}, {}, {set.node()}), IsOk());
  fed.flat<float>()[0] = 100.0f;
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f})));
}

TEST(VariableOpsTest, BuildTimeDtypeMismatch) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
  Output bad = ops::AssignAdd(g, v, ops::Const(g, Tensor{1, 2}, "ints"), {}, "bad_add");
  EXPECT_FALSE(bad.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "bad_add"));
  EXPECT_THAT(g.status().message(), HasSubstr("int32"));
  EXPECT_THAT(g.status().message(), HasSubstr("float32"));
  EXPECT_THAT(g.status().message(), HasSubstr("'v'"));
}

TEST(VariableOpsTest, BuildTimeShapeMismatchNamesBothShapes) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
  Output bad = ops::Assign(g, v, ops::Const(g, Tensor{1.0f, 2.0f, 3.0f}));
  EXPECT_FALSE(bad.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[3]"));
  EXPECT_THAT(g.status().message(), HasSubstr("[2]"));
}

TEST(VariableOpsTest, BuildTimeNotAVariable) {
  Graph g;
  Output c = ops::Const(g, Tensor(1.0f), "not_var");
  Output bad = ops::AssignAdd(g, c, ops::Const(g, Tensor(1.0f)));
  EXPECT_FALSE(bad.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "not_var"));
  EXPECT_THAT(g.status().message(), HasSubstr("not a Variable"));
}

TEST(VariableOpsTest, BuildTimeBoolAssignAddRejected) {
  Graph g;
  Output v = ops::Variable(g, Tensor(true), "flag");
  Output bad = ops::AssignAdd(g, v, ops::Const(g, Tensor(true)));
  EXPECT_FALSE(bad.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "bool"));
}

TEST(VariableOpsTest, RunTimeShapeMismatchNamesBothShapes) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output delta = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "delta");
  Output add = ops::AssignAdd(g, v, delta);
  Output set = ops::Assign(g, v, delta);
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  Result<std::vector<Tensor>> r = s->run({{delta, Tensor{1.0f, 2.0f, 3.0f}}}, {add});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "[3]"));
  EXPECT_THAT(r.status().message(), HasSubstr("[2]"));
  EXPECT_THAT(s->run({{delta, Tensor{1.0f}}}, {set}),
              StatusIs(StatusCode::kInvalidArgument, "[1]"));
  // The variable is unchanged.
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f})));
}

TEST(VariableOpsTest, VariableShapeMustBeFullyDefined) {
  Graph g;
  Output p = ops::Placeholder(g, DType::kFloat32, Shape{-1, 2}, "p");
  Output v = ops::Variable(g, p, "v");
  EXPECT_FALSE(v.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[?,2]"));
}

// 4 threads x 250 locked AssignAdd(v, 1) on one session: no update is lost.
TEST(VariableOpsTest, ConcurrentLockedAssignAddLosesNothing) {
  Graph g;
  Output v = ops::Variable(g, Tensor(int64_t{0}), "counter");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output add = ops::AssignAdd(g, v, ops::Const(g, Tensor(int64_t{1})), {.use_locking = true});
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  constexpr int kThreads = 4;
  constexpr int kRuns = 250;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRuns; ++i) {
        if (!s->run({}, {add}).is_ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_THAT(fetch(*s, v), IsOkAndHolds(TensorEq(Tensor(int64_t{kThreads * kRuns}))));
}

// Readers racing updates (locked and unlocked) never see a torn buffer: every
// snapshot has all elements equal, and it never changes after the fetch.
TEST(VariableOpsTest, ConcurrentReadersNeverSeeTornValues) {
  constexpr int64_t kSize = 4096;
  Graph g;
  Output v = ops::Variable(g, Tensor::filled(Shape{kSize}, 0.0), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output ones = ops::Const(g, Tensor::filled(Shape{kSize}, 1.0));
  Output locked = ops::AssignAdd(g, v, ones, {.use_locking = true});
  Output unlocked = ops::AssignAdd(g, v, ones, {.use_locking = false});
  ASSERT_THAT(g.status(), StatusIs(StatusCode::kOk, ""));
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());

  std::atomic<int> torn{0};
  std::atomic<int> failures{0};
  auto all_equal = [](const Tensor& t) {
    std::span<const double> x = t.flat<double>();
    for (double e : x) {
      if (e != x[0]) return false;
    }
    return true;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        if (!s->run({}, {}, {t == 0 ? locked.node() : unlocked.node()}).is_ok()) {
          failures.fetch_add(1);
        }
      }
    });
  }
  threads.emplace_back([&] {
    std::vector<Tensor> kept;
    for (int i = 0; i < 100; ++i) {
      Result<std::vector<Tensor>> r = s->run({}, {v});
      if (!r.is_ok()) {
        failures.fetch_add(1);
        continue;
      }
      if (!all_equal(r->at(0))) torn.fetch_add(1);
      kept.push_back(r->at(0));
    }
    // Still consistent after all the updates.
    for (const Tensor& k : kept) {
      if (!all_equal(k)) torn.fetch_add(1);
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  Result<Tensor> final_value = fetch(*s, v);
  ASSERT_THAT(final_value, IsOk());
  EXPECT_TRUE(all_equal(*final_value));
  const double x = final_value->flat<double>()[0];
  // Unlocked updates may lose others (as in TF), never add extra ones.
  EXPECT_GE(x, 1.0);
  EXPECT_LE(x, 200.0);
}

}  // namespace
}  // namespace graphrun
