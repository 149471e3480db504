// ThreadPool::Impl: the oneTBB task arena behind graphrun::ThreadPool, and
// the one way the scheduler enters it.
#pragma once

#include <graphrun/session.h>

#include <oneapi/tbb/task_arena.h>

#include <semaphore>
#include <utility>

namespace graphrun {

// Thread safety: thread-safe.
struct ThreadPool::Impl {
  explicit Impl(int threads);

  // Runs `fn` inside the arena; the caller helps (and waits only by
  // helping). Callers from outside the arena first take one of `threads`
  // permits (a caller already inside, e.g. a kernel calling a session of
  // the same pool, does not):
  // - oneTBB gives every arena at least 2 slots, so a 1-thread arena would
  //   otherwise let two callers run kernels at once;
  // - past `threads` callers, a full arena makes oneTBB hand the caller's
  //   functor to a thread inside and put the caller to sleep until it ran:
  //   measured 3x less throughput with 4 callers than with 2 on 2 threads.
  //   Waiting for a permit instead lets a caller run its own work as soon
  //   as one is free.
  template <typename F>
  void execute(F&& fn) {
    if (current != this) {
      permits_.acquire();
      struct Release {
        std::counting_semaphore<>& s;
        ~Release() { s.release(); }
      } release{permits_};
      enter(fn);
    } else {
      enter(fn);
    }
  }

  const int threads;
  tbb::task_arena arena;

 private:
  template <typename F>
  void enter(F& fn) {
    arena.execute([&] {
      const Inside inside(this);
      fn();
    });
  }

  std::counting_semaphore<> permits_;

 public:
  // The pool whose arena the calling thread is executing in (innermost):
  // set by enter() for callers, and around every kernel (and parallel_for
  // chunk) by the scheduler, so workers count as inside too.
  static thread_local Impl* current;

  // Marks the calling thread as inside `pool` for its scope.
  class Inside {
   public:
    explicit Inside(Impl* pool) : outer_(std::exchange(current, pool)) {}
    ~Inside() { current = outer_; }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

   private:
    Impl* outer_;
  };
};

}  // namespace graphrun
