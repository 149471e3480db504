// Gate: holds kernels until a test opens it, so that a test can keep a
// pool's threads busy without timing anything. Every wait gives up after
// 20 s, so that a regression fails instead of hanging.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace graphrun::testing {

// Thread safety: thread-safe.
class Gate {
 public:
  void open() {
    const std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool is_open() {
    const std::lock_guard lock(mu_);
    return open_;
  }
  // A kernel's part: counts itself in, then waits until open().
  void enter_and_wait() {
    std::unique_lock lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(20), [this] { return open_; });
  }
  // Waits until `n` kernels have entered (false after 20 s).
  bool await_entered(int n = 1) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return entered_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int entered_ = 0;
};

}  // namespace graphrun::testing
