#include "scheduler/thread_pool.h"

#include <oneapi/tbb/info.h>

#include <algorithm>
#include <new>

namespace graphrun {

thread_local ThreadPool::Impl* ThreadPool::Impl::current = nullptr;

ThreadPool::Impl::Impl(int n) : threads(n), arena(n), permits_(n) { arena.initialize(); }

int ThreadPool::default_threads() { return tbb::info::default_concurrency(); }

int ThreadPool::max_threads() {
  return std::max(kMinMaxThreads, kMaxThreadsPerCore * tbb::info::default_concurrency());
}

Result<std::shared_ptr<ThreadPool>> ThreadPool::create(int threads) {
  if (threads < 0) return invalid_argument("ThreadPool threads must be >= 0, got {}", threads);
  if (threads > max_threads()) {
    return invalid_argument(
        "ThreadPool threads = {} exceeds the limit of {} (ThreadPool::max_threads(): {} per core, "
        "{} cores)",
        threads, max_threads(), kMaxThreadsPerCore, tbb::info::default_concurrency());
  }
  const int n = threads > 0 ? threads : tbb::info::default_concurrency();
  try {
    return std::shared_ptr<ThreadPool>(new ThreadPool(std::make_unique<Impl>(n)));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("ThreadPool of {} threads: out of memory", n);
  } catch (const std::exception& e) {
    return internal_error("ThreadPool of {} threads: {}", n, e.what());
  }
}

ThreadPool::ThreadPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ThreadPool::~ThreadPool() = default;
int ThreadPool::num_threads() const { return impl_->threads; }

}  // namespace graphrun
