// Permits: the pool's count of steps allowed to run at once, and the FIFO
// of calls waiting for one. A blocking caller sleeps in the queue; an
// asynchronous call leaves an entry (an AsyncPermitWaiter) and no thread:
// a release hands the freed permit to the queue's head, and a queued entry
// may leave the queue at its deadline, stop request or session close.
//
// A release makes no system call unless something is queued: libstdc++
// 12's std::counting_semaphore wakes through a futex every time the count
// rises from zero, waiter or not; with as many callers as permits (2 on 2
// cores, the common case) that was a futex syscall on about every other
// run, measured as a third of Session::run's cost at 2 threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <vector>

namespace graphrun::sched {

// When a wait for a permit gives up (all optional).
struct WaitLimits {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  std::stop_token stop;                       // a stop request ends the wait
  const std::atomic<bool>* closed = nullptr;  // true ends the wait; see wake_all()
};

// One queued call. Linked into Permits' queue while it waits (guarded by
// the Permits' lock).
class PermitWaiter {
 protected:
  PermitWaiter() = default;
  ~PermitWaiter() = default;

 private:
  friend class Permits;
  PermitWaiter* prev_ = nullptr;
  PermitWaiter* next_ = nullptr;
  bool queued_ = false;
  // Blocking waiters: woken when a permit is free for them, and to
  // re-check their limits.
  std::condition_variable* cv_ = nullptr;
  bool woken_ = false;
  // Asynchronous waiters: the closed flag close_queued() matches.
  const std::atomic<bool>* closed_ = nullptr;
};

// An asynchronous call waiting for a permit.
class AsyncPermitWaiter : public PermitWaiter {
 public:
  // The call got a permit (it now holds it). Called once, on the thread
  // that released the permit, without any lock of the Permits held.
  virtual void on_granted() = 0;
  // The call's session closed while it was queued: close_queued() took it
  // out of the queue. Called once, on the closing thread, without a lock.
  virtual void on_closed() = 0;

 protected:
  AsyncPermitWaiter() = default;
  ~AsyncPermitWaiter() = default;
};

// Thread safety: thread-safe. A freed permit goes to the queue's head:
// to an asynchronous call directly; a blocking caller is woken to take it,
// and competes with callers arriving meanwhile (a caller finding a permit
// free takes it), as a plain semaphore's waiters do.
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

  // Takes a permit now (true) or queues `waiter` (false): its on_granted()
  // runs when a permit is handed to it, unless remove() or close_queued()
  // takes it out of the queue first. `closed` is the flag close_queued()
  // matches.
  bool acquire_or_queue(AsyncPermitWaiter* waiter, const std::atomic<bool>* closed) {
    if (try_acquire()) return true;
    std::unique_lock lock(mu_);
    waiter->closed_ = closed;
    push(waiter);
    // seq_cst, after the push is published (see release()).
    if (available_.load(std::memory_order_seq_cst) > 0 && try_acquire()) {
      unlink(waiter);
      return true;
    }
    return false;
  }

  // Takes `waiter` out of the queue: true if it was still queued (it will
  // not be granted), false if a permit was handed to it already.
  bool remove(AsyncPermitWaiter* waiter) {
    const std::lock_guard lock(mu_);
    if (!waiter->queued_) return false;
    unlink(waiter);
    return true;
  }

  // Takes every queued asynchronous waiter whose closed flag is `closed`
  // out of the queue and returns them (a session closing).
  std::vector<AsyncPermitWaiter*> close_queued(const std::atomic<bool>* closed) {
    std::vector<AsyncPermitWaiter*> taken;
    const std::lock_guard lock(mu_);
    for (PermitWaiter* w = head_; w != nullptr;) {
      PermitWaiter* const next = w->next_;
      if (w->cv_ == nullptr && w->closed_ == closed) {
        unlink(w);
        taken.push_back(static_cast<AsyncPermitWaiter*>(w));
      }
      w = next;
    }
    return taken;
  }

  void release() {
    available_.fetch_add(1, std::memory_order_seq_cst);
    // seq_cst: a waiter publishes its entry (queued_count_), then re-reads
    // available_; this side publishes the permit, then reads the count
    // (Dekker): one of the two sees the other.
    if (queued_count_.load(std::memory_order_seq_cst) > 0) hand_over();
  }

  // Wakes every blocking waiter to re-check its limits (a session's closed
  // flag was set).
  void wake_all() {
    if (queued_count_.load(std::memory_order_seq_cst) == 0) return;
    const std::lock_guard lock(mu_);
    for (PermitWaiter* w = head_; w != nullptr; w = w->next_) {
      if (w->cv_ != nullptr) w->cv_->notify_one();
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

  // Calls queued now (a statistic for tests and metrics).
  int queued() const { return queued_count_.load(std::memory_order_relaxed); }

 private:
  struct SyncWaiter : PermitWaiter {};

  // Wakes one blocking waiter (its stop was requested).
  struct Wake {
    Permits* permits;
    SyncWaiter* waiter;
    void operator()() const {
      const std::lock_guard lock(permits->mu_);
      waiter->cv_->notify_one();
    }
  };

  // Requires mu_.
  void push(PermitWaiter* w) {
    w->prev_ = tail_;
    w->next_ = nullptr;
    if (tail_ != nullptr) {
      tail_->next_ = w;
    } else {
      head_ = w;
    }
    tail_ = w;
    w->queued_ = true;
    queued_count_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Requires mu_.
  void unlink(PermitWaiter* w) {
    (w->prev_ != nullptr ? w->prev_->next_ : head_) = w->next_;
    (w->next_ != nullptr ? w->next_->prev_ : tail_) = w->prev_;
    w->prev_ = w->next_ = nullptr;
    w->queued_ = false;
    queued_count_.fetch_sub(1, std::memory_order_relaxed);
  }

  // Hands free permits to the queue's head, in order: an asynchronous
  // waiter gets the permit itself; a blocking one is woken to take it
  // (another caller may take it first: blocking callers compete, which
  // keeps a thread that releases and re-acquires in a loop running instead
  // of handing every run to a thread that must wake up first).
  void hand_over() {
    std::vector<AsyncPermitWaiter*> granted;
    {
      const std::lock_guard lock(mu_);
      hand_over_locked(granted);
    }
    for (AsyncPermitWaiter* w : granted) w->on_granted();
  }
  // Requires mu_. Asynchronous waiters granted are appended to `granted`
  // (call their on_granted() after unlocking).
  void hand_over_locked(std::vector<AsyncPermitWaiter*>& granted) {
    int free = available_.load(std::memory_order_seq_cst);
    for (PermitWaiter* w = head_; w != nullptr && free > 0;) {
      PermitWaiter* const next = w->next_;
      if (w->cv_ != nullptr) {
        if (!w->woken_) {
          w->woken_ = true;
          w->cv_->notify_one();
        }
        --free;  // left for that waiter
      } else {
        if (!try_acquire()) break;
        --free;
        unlink(w);
        granted.push_back(static_cast<AsyncPermitWaiter*>(w));
      }
      w = next;
    }
  }

  Outcome acquire_slow(const WaitLimits& limits) {
    std::condition_variable cv;
    SyncWaiter self;
    self.cv_ = &cv;
    // Registered before mu_ is taken: a stop already requested runs Wake
    // here, which takes mu_.
    std::optional<std::stop_callback<Wake>> on_stop;
    if (limits.stop.stop_possible()) on_stop.emplace(limits.stop, Wake{this, &self});
    Outcome outcome = Outcome::kAcquired;
    std::vector<AsyncPermitWaiter*> granted;
    std::unique_lock lock(mu_);
    push(&self);
    for (;;) {
      // seq_cst, after the push (see release()). A permit released before
      // the push was published is taken here.
      if (available_.load(std::memory_order_seq_cst) > 0 && try_acquire()) break;
      self.woken_ = false;
      if (limits.closed != nullptr && limits.closed->load(std::memory_order_acquire)) {
        outcome = Outcome::kClosed;
        break;
      }
      if (limits.stop.stop_requested()) {
        outcome = Outcome::kStopped;
        break;
      }
      if (!limits.deadline) {
        cv.wait(lock);
      } else if (cv.wait_until(lock, *limits.deadline) == std::cv_status::timeout) {
        if (try_acquire()) break;
        outcome = Outcome::kDeadline;
        break;
      }
    }
    unlink(&self);
    // A permit this waiter was woken for and did not take goes on.
    if (outcome != Outcome::kAcquired) hand_over_locked(granted);
    lock.unlock();
    for (AsyncPermitWaiter* w : granted) w->on_granted();
    // The stop callback may be running on another thread: it takes mu_ and
    // touches `self`; the registration's destructor waits for it.
    on_stop.reset();
    return outcome;
  }

  std::atomic<int> available_;
  std::atomic<int> queued_count_{0};
  std::mutex mu_;
  PermitWaiter* head_ = nullptr;  // guarded by mu_
  PermitWaiter* tail_ = nullptr;  // guarded by mu_
};

}  // namespace graphrun::sched
