#include "scheduler/thread_pool.h"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <new>
#include <set>

namespace graphrun {

constinit thread_local ThreadPool::Impl::Marks ThreadPool::Impl::marks;

namespace {
// oneTBB starts one worker fewer than the machine's cores (the caller is
// expected to make up the last one). A pool running asynchronous steps has
// no caller inside, and a pool may have more threads than cores (up to
// max_threads()): the process allows one worker per thread of its largest
// such pool. (A user's own global_control with a lower limit wins: oneTBB
// takes the smallest.)
class Parallelism {
 public:
  void add(int threads) {
    const std::lock_guard lock(mu_);
    sizes_.insert(threads);
    update();
  }
  void remove(int threads) {
    const std::lock_guard lock(mu_);
    sizes_.erase(sizes_.find(threads));
    update();
  }

 private:
  void update() {
    const int largest = sizes_.empty() ? 0 : *sizes_.rbegin();
    const int want = std::max(largest, tbb::info::default_concurrency()) + 1;
    if (want == current_) return;
    control_.reset();
    if (!sizes_.empty()) {
      control_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                       static_cast<std::size_t>(want));
    }
    current_ = sizes_.empty() ? 0 : want;
  }
  std::mutex mu_;
  std::multiset<int> sizes_;                      // guarded by mu_
  std::unique_ptr<tbb::global_control> control_;  // guarded by mu_
  int current_ = 0;                               // guarded by mu_
};

Parallelism& parallelism() {
  static Parallelism* const p = new Parallelism;  // never destroyed: pools may outlive statics
  return *p;
}
}  // namespace

ThreadPool::Impl::Impl(int n) : threads(n), arena(n), permits_(n) {
  // Without this, a pool of more threads than cores would get only
  // cores - 1 workers: its kernels would run two at a time on 2 cores.
  if (n > tbb::info::default_concurrency()) {
    parallelism().add(n);
    raised_parallelism_ = true;
  }
  arena.initialize();
}

ThreadPool::Impl::~Impl() {
  if (raised_parallelism_) parallelism().remove(threads);
  if (async_arena_ != nullptr) {
    async_arena_->terminate();
    async_arena_.reset();
    parallelism().remove(threads);
  }
}

tbb::task_arena& ThreadPool::Impl::async_arena() {
  std::call_once(async_once_, [this] {
    parallelism().add(threads);
    async_arena_ = std::make_unique<tbb::task_arena>(threads, /*reserved_for_masters=*/0);
    async_arena_->initialize();
  });
  return *async_arena_;
}

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
