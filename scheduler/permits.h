// Permits: a counting semaphore whose release makes no system call unless
// a thread is waiting, and whose waits give up at a deadline, a stop
// request or a closed flag.
//
// libstdc++ 12's std::counting_semaphore wakes through a futex every time
// the count rises from zero, waiter or not: with as many callers as permits
// (2 on 2 cores, the common case) that was a futex syscall on about every
// other run, measured as a third of Session::run's cost at 2 threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>

namespace graphrun::sched {

// When a wait for a permit gives up (all optional).
struct WaitLimits {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  std::stop_token stop;                       // a stop request ends the wait
  const std::atomic<bool>* closed = nullptr;  // true ends the wait; see wake_all()
};

// Thread safety: thread-safe. Not FIFO: a releasing thread's next acquire
// can win over a sleeping waiter.
class Permits {
 public:
  enum class Outcome { kAcquired, kDeadline, kStopped, kClosed };

  explicit Permits(int n) : available_(n) {}

  // Waits for a permit with no limit.
  void acquire() { static_cast<void>(acquire(WaitLimits{})); }

  // Waits for a permit until one of `limits` ends the wait (a limit already
  // reached when a permit is free still acquires it).
  Outcome acquire(const WaitLimits& limits) {
    if (try_acquire()) return Outcome::kAcquired;
    return acquire_slow(limits);
  }

  void release() {
    available_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      // Under mu_: a waiter between its check and its sleep holds mu_, so
      // the notification cannot fall between the two.
      const std::lock_guard lock(mu_);
      cv_.notify_one();
    }
  }

  // Wakes every waiter to re-check its limits (a session's closed flag
  // was set).
  void wake_all() {
    if (waiters_.load(std::memory_order_seq_cst) == 0) return;
    const std::lock_guard lock(mu_);
    cv_.notify_all();
  }

  bool try_acquire() {
    int n = available_.load(std::memory_order_relaxed);
    while (n > 0) {
      // acquire: what the previous holder did happens before our use.
      if (available_.compare_exchange_weak(n, n - 1, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }

 private:
  struct Wake {
    Permits* permits;
    void operator()() const {
      const std::lock_guard lock(permits->mu_);
      permits->cv_.notify_all();
    }
  };

  Outcome acquire_slow(const WaitLimits& limits) {
    // Registered before mu_ is taken: a stop already requested runs Wake
    // here, which takes mu_.
    std::optional<std::stop_callback<Wake>> on_stop;
    if (limits.stop.stop_possible()) on_stop.emplace(limits.stop, Wake{this});
    Outcome outcome = Outcome::kAcquired;
    {
      std::unique_lock lock(mu_);
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      // Each check re-reads available_ after waiters_ is published: a
      // release either sees the waiter (and notifies under mu_) or made its
      // increment visible before this read (seq_cst on both sides).
      for (;;) {
        if (try_acquire()) break;
        if (limits.closed != nullptr && limits.closed->load(std::memory_order_acquire)) {
          outcome = Outcome::kClosed;
          break;
        }
        if (limits.stop.stop_requested()) {
          outcome = Outcome::kStopped;
          break;
        }
        if (!limits.deadline) {
          cv_.wait(lock);
        } else if (cv_.wait_until(lock, *limits.deadline) == std::cv_status::timeout) {
          if (try_acquire()) break;
          outcome = Outcome::kDeadline;
          break;
        }
      }
      waiters_.fetch_sub(1, std::memory_order_relaxed);
      // A waiter giving up may have taken the notification meant for a
      // permit that is free now: pass it on.
      if (outcome != Outcome::kAcquired && available_.load(std::memory_order_seq_cst) > 0) {
        cv_.notify_one();
      }
    }
    return outcome;
  }

  std::atomic<int> available_;
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace graphrun::sched
