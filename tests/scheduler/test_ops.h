// Minimal ops for scheduler tests, registered in a private OpRegistry so the
// engine is tested independently of the built-in op library:
//   "Value"   attr value (float32 scalar) -> output
//   "Sum2"    x, y (float32) -> x + y; counts executions in the node's counter
//   "Fail"    x -> error (InvalidArgument "boom")
//   "Source"  no inputs, float32 scalar 1; counts executions
//   "Sink"    variadic inputs, no outputs; counts executions
//   "Placeholder" float32, attr dtype/shape (unfed -> plan error)
//   "Slow"    x -> x after sleeping attr `ms` milliseconds; never cheap
// With `cheap`, every kernel but Slow's reports is_cheap(), so the scheduler
// runs them as lightweight (inline) flow-graph nodes.
#pragma once

#include <graphrun/graphrun.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace graphrun::testing {

// Execution counts by node name, shared by every kernel of the registry.
class ExecCounter {
 public:
  void hit(const std::string& node) {
    std::lock_guard lock(mu_);
    ++counts_[node];
  }
  int count(const std::string& node) {
    std::lock_guard lock(mu_);
    return counts_[node];
  }
  void reset() {
    std::lock_guard lock(mu_);
    counts_.clear();
  }

 private:
  std::mutex mu_;
  std::map<std::string, int> counts_;
};

// A registry with the ops above; `counter` must outlive it.
std::unique_ptr<OpRegistry> make_test_registry(ExecCounter* counter, bool cheap = false);

Output value(Graph& g, float v, std::string_view name = {});
Output sum2(Graph& g, Output x, Output y, std::string_view name = {});
Output fail(Graph& g, Output x, std::string_view name = {});
Output source(Graph& g, std::string_view name = {});
const Node* sink(Graph& g, std::vector<Output> inputs, std::string_view name = {});
Output placeholder(Graph& g, Shape shape, std::string_view name = {});
Output slow(Graph& g, Output x, int ms, std::string_view name = {});

}  // namespace graphrun::testing
