// ThreadPool::Impl: the oneTBB task arena behind graphrun::ThreadPool, and
// the one way the scheduler enters it.
#pragma once

#include <graphrun/session.h>

#include <oneapi/tbb/task_arena.h>

#include "scheduler/permits.h"

#include <memory>
#include <mutex>
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
    static_cast<void>(execute(sched::WaitLimits{}, std::forward<F>(fn)));
  }
  // The same, but the wait for a permit gives up at `limits` (a deadline,
  // a stop request, a closed session): fn does not run and the outcome
  // says why. kAcquired: fn ran.
  template <typename F>
  sched::Permits::Outcome execute(const sched::WaitLimits& limits, F&& fn) {
    // Already running in one of this pool's arenas: stay there (an
    // asynchronous step's kernels and intra-op loops run in its arena).
    if (marks.in_arena == this) {
      fn();
      return sched::Permits::Outcome::kAcquired;
    }
    const Admission admitted(this, limits);
    if (admitted.outcome() != sched::Permits::Outcome::kAcquired) return admitted.outcome();
    arena.execute([&] { run_marked(fn); });
    return sched::Permits::Outcome::kAcquired;
  }

  // Runs `fn` on the calling thread without entering the arena, under the
  // same permit (steps that run their kernels inline: Plan::run_inline).
  // `fn` must not spawn work; what it needs from the arena (parallel_for,
  // building a flow graph) goes through execute().
  template <typename F>
  sched::Permits::Outcome run_inline(const sched::WaitLimits& limits, F&& fn) {
    const Admission admitted(this, limits);
    if (admitted.outcome() != sched::Permits::Outcome::kAcquired) return admitted.outcome();
    const Inside inside(this);
    fn();
    return sched::Permits::Outcome::kAcquired;
  }

  // Wakes callers waiting for a permit to re-check their limits (a
  // session's closed flag was set).
  void wake_waiters() { permits_.wake_all(); }

  // Asynchronous steps (the permit travels with the step, not a thread):
  // the pool's permits and queue of waiting calls, and submit(), which runs
  // `fn` on a worker of the pool's asynchronous arena, marked inside the
  // pool. That arena (made at the first submit) reserves no slot for
  // callers, and the process then allows a oneTBB worker per thread of its
  // largest pool, so asynchronous steps get every thread of the pool. It is
  // a second arena because blocking callers need `arena`'s reserved slot:
  // in an arena without one, workers took the slot a caller needed, and
  // the caller slept while they ran its step (measured: the seed model 7%
  // slower at 1 thread, its 2-thread speed-up lost). The permits bound both
  // arenas' steps together.
  sched::Permits& permits() { return permits_; }

  // Where partial runs' flow graphs live. Between its calls a partial run
  // has no caller inside, yet what a call's feeds made ready (and what its
  // asynchronous kernels finish meanwhile) must run: the blocking arena
  // has threads - 1 worker slots besides its caller's, none in a 1-thread
  // pool, whose partial runs live in the asynchronous arena instead (no
  // reserved slot, one worker). A caller of such a run waits in its own
  // arena for the worker to reach its fetches.
  bool partial_runs_in_async_arena() const { return threads == 1; }
  // Runs `fn` inside the arena partial runs live in (building and
  // destroying their flow graphs), marked inside the pool. No permit is
  // taken: the caller holds one, or cleans up.
  template <typename F>
  void execute_for_partial_run(F&& fn) {
    if (!partial_runs_in_async_arena()) {
      execute(std::forward<F>(fn));
      return;
    }
    async_arena().execute([&] { run_marked(fn); });
  }
  template <typename F>
  void submit(F fn) {
    async_arena().enqueue([this, fn = std::move(fn)] { run_marked(fn); });
  }
  tbb::task_arena& async_arena();
  // Runs `fn` marked inside this pool and in one of its arenas (call on a
  // thread that entered one of them).
  template <typename F>
  void run_marked(F& fn) {
    const KernelMarks marks_here(this, true);
    fn();
  }

  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const int threads;
  tbb::task_arena arena;

 private:
  // Holds a permit for its scope unless the thread is already inside.
  class Admission {
   public:
    Admission(Impl* pool, const sched::WaitLimits& limits)
        : pool_(marks.current != pool ? pool : nullptr) {
      if (pool_ != nullptr) {
        outcome_ = pool_->permits_.acquire(limits);
        if (outcome_ != sched::Permits::Outcome::kAcquired) pool_ = nullptr;
      }
    }
    ~Admission() {
      if (pool_ != nullptr) pool_->permits_.release();
    }
    Admission(const Admission&) = delete;
    Admission& operator=(const Admission&) = delete;
    sched::Permits::Outcome outcome() const { return outcome_; }

   private:
    Impl* pool_;
    sched::Permits::Outcome outcome_ = sched::Permits::Outcome::kAcquired;
  };

  sched::Permits permits_;
  // The pool has more threads than oneTBB allows workers by default (one
  // per core, less the caller): its size is in the process's parallelism.
  bool raised_parallelism_ = false;
  std::once_flag async_once_;
  std::unique_ptr<tbb::task_arena> async_arena_;  // set once, under async_once_

 public:
  // The calling thread's marks, innermost, in one thread_local (a kernel
  // sets and restores both: one TLS address, not two).
  // - current: the pool whose arena the thread is executing in: set by
  //   execute() and run_inline() for callers, and around every kernel (and
  //   parallel_for chunk) by the scheduler, so workers count as inside too.
  // - in_arena: the pool whose arena (blocking or asynchronous) the thread
  //   is running in; unlike `current`, never set for a step run on its
  //   caller outside the arena (run_inline).
  struct Marks {
    Impl* current = nullptr;
    Impl* in_arena = nullptr;
  };
  static constinit thread_local Marks marks;
  class InArena {
   public:
    explicit InArena(Impl* pool) : outer_(std::exchange(marks.in_arena, pool)) {}
    ~InArena() { marks.in_arena = outer_; }
    InArena(const InArena&) = delete;
    InArena& operator=(const InArena&) = delete;

   private:
    Impl* outer_;
  };

  // Marks the calling thread as inside `pool` for its scope.
  class Inside {
   public:
    explicit Inside(Impl* pool) : outer_(std::exchange(marks.current, pool)) {}
    ~Inside() { marks.current = outer_; }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

   private:
    Impl* outer_;
  };

  // Both marks for its scope, as around a kernel: inside `pool`, and in
  // `pool`'s arena when `in_pool_arena`, else in the arena it was in.
  class KernelMarks {
   public:
    KernelMarks(Impl* pool, bool in_pool_arena) {
      Marks& m = marks;  // one TLS address (a struct copy went through the stack)
      outer_current_ = m.current;
      outer_in_arena_ = m.in_arena;
      m.current = pool;
      if (in_pool_arena) m.in_arena = pool;
    }
    ~KernelMarks() {
      Marks& m = marks;
      m.current = outer_current_;
      m.in_arena = outer_in_arena_;
    }
    KernelMarks(const KernelMarks&) = delete;
    KernelMarks& operator=(const KernelMarks&) = delete;

   private:
    Impl* outer_current_;
    Impl* outer_in_arena_;
  };
};

}  // namespace graphrun
