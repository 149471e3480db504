// ThreadPool::Impl: the oneTBB task arena behind graphrun::ThreadPool, and
// the one way the scheduler enters it.
#pragma once

#include <graphrun/session.h>

#include <oneapi/tbb/task_arena.h>

#include <mutex>
#include <utility>

namespace graphrun {

// Thread safety: thread-safe.
struct ThreadPool::Impl {
  explicit Impl(int threads);

  // Runs `fn` inside the arena; the caller helps (and waits only by
  // helping). oneTBB gives every arena at least 2 slots, so a 1-thread
  // arena would let two callers run kernels at once: there, callers from
  // outside the arena take `gate_` first (a caller already inside, e.g. a
  // kernel calling a session of the same pool, does not).
  template <typename F>
  void execute(F&& fn) {
    if (threads == 1 && current != this) {
      std::lock_guard gate(gate_);
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
      Impl* const saved = std::exchange(current, this);
      fn();
      current = saved;
    });
  }

  // The pool whose arena the calling thread is executing in (innermost).
  static thread_local Impl* current;
  std::mutex gate_;
};

}  // namespace graphrun
