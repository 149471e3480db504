// Test helpers: run a graph through the public Session in one call, and
// gtest matchers for Status, Result and Tensor.
//
//   Graph g;
//   Output y = ops::Relu(g, ops::Const(g, Tensor{-1.0f, 2.0f}));
//   EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor{0.0f, 2.0f})));
#pragma once

#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace graphrun::testing {

// Creates a session over `g`, runs once, returns the single fetch.
Result<Tensor> run_one(const Graph& g, const TensorRef& fetch, const FeedList& feeds = {},
                       const std::vector<TargetRef>& targets = {});
// Same with many fetches.
Result<std::vector<Tensor>> run_all(const Graph& g, const std::vector<TensorRef>& fetches,
                                    const FeedList& feeds = {},
                                    const std::vector<TargetRef>& targets = {});

// A session that aborts the test when creation fails.
std::unique_ptr<Session> make_session(const Graph& g, SessionOptions options = {});

inline Status to_status(const Status& s) { return s; }
template <typename T>
Status to_status(const Result<T>& r) {
  return r.status();
}

// Works on Status and Result<T>.
MATCHER(IsOk, "is OK") {
  const Status s = ::graphrun::testing::to_status(arg);
  if (s.is_ok()) return true;
  *result_listener << "status is " << s.to_string();
  return false;
}

// EXPECT_THAT(status_or_result, StatusIs(StatusCode::kInvalidArgument, "fed twice"))
MATCHER_P2(StatusIs, code, substring,
           std::string("has code ") + std::string(status_code_name(code)) +
               " and a message containing \"" + std::string(substring) + "\"") {
  const Status s = ::graphrun::testing::to_status(arg);
  *result_listener << "status is " << s.to_string();
  return s.code() == code && s.message().find(substring) != std::string::npos;
}

MATCHER_P(IsOkAndHolds, inner, "is OK and holds a value that matches") {
  if (!arg.is_ok()) {
    *result_listener << "status is " << arg.status().to_string();
    return false;
  }
  return ::testing::ExplainMatchResult(inner, *arg, result_listener);
}

// Same dtype, shape and elements.
MATCHER_P(TensorEq, expected, "equals " + ::testing::PrintToString(expected)) {
  return arg.equals(expected);
}
// Same dtype and shape, elements within tolerance.
MATCHER_P(TensorNear, expected, "is close to " + ::testing::PrintToString(expected)) {
  return arg.all_close(expected, 1e-5, 1e-6);
}

}  // namespace graphrun::testing
