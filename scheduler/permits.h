// Permits: a counting semaphore whose release makes no system call unless
// a thread is waiting.
//
// libstdc++ 12's std::counting_semaphore wakes through a futex every time
// the count rises from zero, waiter or not: with as many callers as permits
// (2 on 2 cores, the common case) that was a futex syscall on about every
// other run, measured as a third of Session::run's cost at 2 threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace graphrun::sched {

// Thread safety: thread-safe. Not FIFO: a releasing thread's next acquire
// can win over a sleeping waiter.
class Permits {
 public:
  explicit Permits(int n) : available_(n) {}

  void acquire() {
    if (try_acquire()) return;
    std::unique_lock lock(mu_);
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    // The predicate re-reads available_ after waiters_ is published: a
    // release either sees the waiter (and notifies under mu_) or made its
    // increment visible before this read (seq_cst on both sides).
    cv_.wait(lock, [this] { return try_acquire(); });
    waiters_.fetch_sub(1, std::memory_order_relaxed);
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
  std::atomic<int> available_;
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace graphrun::sched
