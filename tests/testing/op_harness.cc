#include "tests/testing/op_harness.h"

namespace graphrun::testing {

std::unique_ptr<Session> make_session(const Graph& g, SessionOptions options) {
  Result<std::unique_ptr<Session>> s = Session::create(g, options);
  if (!s.is_ok()) {
    ADD_FAILURE() << "Session::create failed: " << s.status().to_string();
    return nullptr;
  }
  return std::move(*s);
}

Result<std::vector<Tensor>> run_all(const Graph& g, const std::vector<TensorRef>& fetches,
                                    const FeedList& feeds, const std::vector<TargetRef>& targets) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::create(g));
  return session->run(feeds, fetches, targets);
}

Result<Tensor> run_one(const Graph& g, const TensorRef& fetch, const FeedList& feeds,
                       const std::vector<TargetRef>& targets) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out, run_all(g, {fetch}, feeds, targets));
  return out.at(0);
}

}  // namespace graphrun::testing
