#include "scheduler/timer.h"

namespace graphrun::sched {

Timer::~Timer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Timer::Id Timer::schedule(Clock::time_point when, std::function<void()> fn) {
  std::lock_guard lock(mu_);
  const Id id = next_id_++;
  callbacks_.emplace(id, std::move(fn));
  queue_.emplace(when, id);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  cv_.notify_all();
  return id;
}

void Timer::cancel(Id id) {
  std::unique_lock lock(mu_);
  callbacks_.erase(id);  // its queue entry is skipped when it comes up
  // A callback cancelling itself (or another) on the timer thread: nothing
  // else can be running.
  if (std::this_thread::get_id() == thread_.get_id()) return;
  cv_.wait(lock, [&] { return running_ != id; });
}

void Timer::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (queue_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = queue_.begin();
    if (Clock::now() < first->first) {
      cv_.wait_until(lock, first->first);
      continue;
    }
    const Id id = first->second;
    queue_.erase(first);
    auto it = callbacks_.find(id);
    if (it == callbacks_.end()) continue;  // cancelled
    std::function<void()> fn = std::move(it->second);
    callbacks_.erase(it);
    running_ = id;
    lock.unlock();
    fn();
    lock.lock();
    running_ = 0;
    cv_.notify_all();
  }
}

}  // namespace graphrun::sched
