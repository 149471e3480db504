#include "scheduler/thread_pool.h"

#include <oneapi/tbb/info.h>

namespace graphrun {

thread_local ThreadPool::Impl* ThreadPool::Impl::current = nullptr;

ThreadPool::Impl::Impl(int n) : threads(n), arena(n), permits_(n) { arena.initialize(); }

Result<std::shared_ptr<ThreadPool>> ThreadPool::create(int threads) {
  if (threads < 0) return invalid_argument("ThreadPool threads must be >= 0, got {}", threads);
  const int n = threads > 0 ? threads : tbb::info::default_concurrency();
  return std::shared_ptr<ThreadPool>(new ThreadPool(std::make_unique<Impl>(n)));
}

ThreadPool::ThreadPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ThreadPool::~ThreadPool() = default;
int ThreadPool::num_threads() const { return impl_->threads; }

}  // namespace graphrun
