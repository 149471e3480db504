#include "service/src/call_executor.h"

#include <system_error>
#include <thread>
#include <utility>

namespace graphrun::service_internal {

CallExecutor::CallExecutor(std::size_t max_threads, std::chrono::milliseconds keep_idle)
    : max_threads_(max_threads == 0 ? 1 : max_threads), keep_idle_(keep_idle) {}

CallExecutor::~CallExecutor() {
  std::unique_lock lock(mu_);
  stopping_ = true;
  work_cv_.notify_all();
  exit_cv_.wait(lock, [this] { return threads_ == 0; });
}

void CallExecutor::submit(std::function<void()> work) {
  std::unique_lock lock(mu_);
  queue_.push_back(std::move(work));
  // Idle threads each take one queued item; start a thread when the queue
  // holds more than the idle threads will take.
  if (queue_.size() <= idle_) {
    work_cv_.notify_one();
    return;
  }
  if (threads_ >= max_threads_) return;  // queued until a thread is free
  ++threads_;
  lock.unlock();
  try {
    // Detached: the destructor waits for threads_ to reach zero instead, so
    // threads that exit when idle need no one to join them.
    std::thread([this] { work_until_idle(); }).detach();
  } catch (const std::system_error&) {
    // Out of threads: the threads that exist will take the work; with none,
    // the caller runs it.
    lock.lock();
    --threads_;
    if (threads_ > 0) return;
    std::function<void()> now = std::move(queue_.back());
    queue_.pop_back();
    lock.unlock();
    now();
  }
}

void CallExecutor::work_until_idle() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (stopping_) break;
      ++idle_;
      const bool woke =
          work_cv_.wait_for(lock, keep_idle_, [this] { return !queue_.empty() || stopping_; });
      --idle_;
      if (!woke) break;  // idle for keep_idle
      continue;
    }
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work();
    work = nullptr;  // destroyed outside the lock
    lock.lock();
  }
  --threads_;
  // Notified under the lock: once it is released, this thread touches
  // nothing of the executor, which the destructor may then destroy.
  exit_cv_.notify_all();
}

std::size_t CallExecutor::num_threads() const {
  const std::lock_guard lock(mu_);
  return threads_;
}

}  // namespace graphrun::service_internal
