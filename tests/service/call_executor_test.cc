// CallExecutor: the service's step threads (service/src/call_executor.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "service/src/call_executor.h"

namespace graphrun::service_internal {
namespace {

// Work that blocks until released, counting how many are inside at once.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int inside = 0;
  int peak = 0;
  int done = 0;

  void pass() {
    std::unique_lock lock(mu);
    peak = std::max(peak, ++inside);
    cv.notify_all();
    cv.wait(lock, [this] { return open; });
    --inside;
    ++done;
    cv.notify_all();
  }
  template <typename Pred>
  bool wait_for(Pred pred) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), pred);
  }
  void release() {
    const std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(CallExecutorTest, EachCallGetsAThreadUpToTheLimitThenQueues) {
  Gate gate;
  CallExecutor executor(/*max_threads=*/3);
  for (int i = 0; i < 5; ++i) executor.submit([&] { gate.pass(); });
  // Three blocking calls run at once (none waits for another to finish)...
  ASSERT_TRUE(gate.wait_for([&] { return gate.inside == 3; }));
  EXPECT_EQ(executor.num_threads(), 3u);
  // ...and the other two wait for a free thread.
  gate.release();
  ASSERT_TRUE(gate.wait_for([&] { return gate.done == 5; }));
  EXPECT_EQ(gate.peak, 3);
}

TEST(CallExecutorTest, IdleThreadsAreReusedThenExit) {
  CallExecutor executor(/*max_threads=*/8, std::chrono::milliseconds(50));
  std::atomic<int> runs{0};
  for (int i = 0; i < 20; ++i) {
    executor.submit([&] { runs.fetch_add(1); });
    // One call at a time: the idle thread takes each, no new one starts.
    const auto start = std::chrono::steady_clock::now();
    while (runs.load() <= i &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      std::this_thread::yield();
    }
  }
  EXPECT_EQ(runs.load(), 20);
  EXPECT_LE(executor.num_threads(), 2u);
  const auto start = std::chrono::steady_clock::now();
  while (executor.num_threads() > 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(executor.num_threads(), 0u);
  executor.submit([&] { runs.fetch_add(1); });  // a new thread after they left
  const auto again = std::chrono::steady_clock::now();
  while (runs.load() < 21 && std::chrono::steady_clock::now() - again < std::chrono::seconds(10)) {
    std::this_thread::yield();
  }
  EXPECT_EQ(runs.load(), 21);
}

TEST(CallExecutorTest, DestructorRunsQueuedWorkAndWaitsForIt) {
  std::atomic<int> runs{0};
  {
    CallExecutor executor(/*max_threads=*/1);
    for (int i = 0; i < 10; ++i) {
      executor.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        runs.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(runs.load(), 10);
}

}  // namespace
}  // namespace graphrun::service_internal
