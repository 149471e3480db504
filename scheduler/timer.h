// Timer: runs callbacks at given times on one thread of its own (started on
// first use). Deadlines of partial-run calls and idle-timeout sweeps use it:
// a helping wait inside the arena has no timeout, so an outside actor must
// release it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace graphrun::sched {

// Thread safety: thread-safe. Callbacks run on the timer thread, one at a
// time, and must not block for long.
class Timer {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  Timer() = default;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  // Stops the thread; pending callbacks are dropped.
  ~Timer();

  Id schedule(Clock::time_point when, std::function<void()> fn);
  // After this returns, the callback is not running and will never run
  // (called from a callback, on the timer thread: will never run again).
  void cancel(Id id);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, Id> queue_;     // guarded by mu_
  std::map<Id, std::function<void()>> callbacks_;  // guarded by mu_
  Id next_id_ = 1;                                 // guarded by mu_
  Id running_ = 0;                                 // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
  std::thread thread_;
};

}  // namespace graphrun::sched
