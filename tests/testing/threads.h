// Thread helpers for concurrency tests: a watchdog that turns a hang into
// a failure, and N threads released together.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <latch>
#include <string_view>
#include <thread>
#include <vector>

namespace graphrun::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr std::chrono::seconds kWatchdog{120};
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr std::chrono::seconds kWatchdog{120};
#else
inline constexpr std::chrono::seconds kWatchdog{30};
#endif
#else
inline constexpr std::chrono::seconds kWatchdog{30};
#endif

// Runs `body` on a thread of its own and waits at most `limit` for it. A
// body that does not return in time (a deadlock) fails the test and aborts
// the process: its threads cannot be joined, and a hung binary would only
// be stopped by ctest's timeout.
inline void run_bounded(std::string_view what, std::function<void()> body,
                        std::chrono::seconds limit = kWatchdog) {
  std::future<void> done = std::async(std::launch::async, std::move(body));
  if (done.wait_for(limit) == std::future_status::timeout) {
    ADD_FAILURE() << what << " did not finish within " << limit.count()
                  << " s: deadlock or hang; aborting";
    std::fprintf(stderr, "run_bounded: '%.*s' hung; aborting\n", static_cast<int>(what.size()),
                 what.data());
    std::fflush(stderr);
    std::abort();
  }
  done.get();
}

// Runs body(t) for t in [0, n) on n threads that start together (a latch),
// all under one run_bounded watchdog.
inline void run_together(std::string_view what, int n, const std::function<void(int)>& body,
                         std::chrono::seconds limit = kWatchdog) {
  run_bounded(
      what,
      [&] {
        std::latch start(n);
        std::vector<std::thread> threads;
        threads.reserve(static_cast<std::size_t>(n));
        for (int t = 0; t < n; ++t) {
          threads.emplace_back([&, t] {
            start.arrive_and_wait();
            body(t);
          });
        }
        for (std::thread& th : threads) th.join();
      },
      limit);
}

}  // namespace graphrun::testing
