// CallExecutor: the threads that run the steps of Run and PartialRun calls.
//
// A gRPC callback handler must return its reactor before gRPC can tell it
// that the client cancelled (ServerUnaryReactor::OnCancel), and it must not
// block gRPC's callback threads; a step may run for minutes. So the handler
// hands the step to this executor and returns at once.
//
// A call gets an idle thread if there is one, else a new thread, up to
// max_threads; past that, calls queue (in order) until a thread is free. A
// thread idle for keep_idle exits. A partial-run call never waits for
// another call's feed (the session answers "not yet computable" instead),
// so queued calls cannot deadlock the running ones.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace graphrun::service_internal {

// Thread safety: submit() may be called from any thread. The destructor
// runs the queued work, then waits for every thread to exit; no submit()
// may race with it.
class CallExecutor {
 public:
  explicit CallExecutor(std::size_t max_threads = 256,
                        std::chrono::milliseconds keep_idle = std::chrono::seconds(10));
  ~CallExecutor();
  CallExecutor(const CallExecutor&) = delete;
  CallExecutor& operator=(const CallExecutor&) = delete;

  void submit(std::function<void()> work);

  // Threads alive now (running or idle), for tests.
  std::size_t num_threads() const;

 private:
  void work_until_idle();

  const std::size_t max_threads_;
  const std::chrono::milliseconds keep_idle_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;          // work queued, or stopping
  std::condition_variable exit_cv_;          // a thread exited
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  std::size_t threads_ = 0;                  // guarded by mu_
  std::size_t idle_ = 0;                     // guarded by mu_; threads waiting for work
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace graphrun::service_internal
