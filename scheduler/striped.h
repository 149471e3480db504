// Striped reader lock and call counter: per-thread stripes on their own
// cache lines, so threads that only read (resolve a name, count a call) do
// not bounce one line between cores on every run.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <shared_mutex>

namespace graphrun::sched {

inline constexpr std::size_t kStripes = 16;

// This thread's stripe (threads are dealt stripes round robin). Inline: a
// step asks for it several times (its call count, its instance's pool).
namespace striped_internal {
// The stripe plus one; 0 until the thread's first call deals it one.
inline constinit thread_local std::size_t t_stripe_plus_one = 0;
std::size_t deal_stripe();
}  // namespace striped_internal
inline std::size_t this_thread_stripe() {
  const std::size_t s = striped_internal::t_stripe_plus_one;
  if (s == 0) [[unlikely]]
    return striped_internal::deal_stripe();
  return s - 1;
}

// A reader-writer lock whose readers take only their own stripe's lock
// shared; a writer takes every stripe, in order. For rare writers.
// Thread safety: thread-safe.
class StripedSharedMutex {
 public:
  // Returns the stripe to hand back to unlock_shared.
  std::size_t lock_shared() {
    const std::size_t s = this_thread_stripe();
    stripes_[s].mu.lock_shared();
    return s;
  }
  void unlock_shared(std::size_t stripe) { stripes_[stripe].mu.unlock_shared(); }
  void lock() {
    for (Stripe& s : stripes_) s.mu.lock();
  }
  void unlock() {
    for (Stripe& s : stripes_) s.mu.unlock();
  }

 private:
  struct alignas(64) Stripe {
    std::shared_mutex mu;
  };
  std::array<Stripe, kStripes> stripes_;
};

// RAII shared hold of a StripedSharedMutex.
class StripedSharedLock {
 public:
  explicit StripedSharedLock(StripedSharedMutex& mu) : mu_(mu), stripe_(mu.lock_shared()) {}
  ~StripedSharedLock() { mu_.unlock_shared(stripe_); }
  StripedSharedLock(const StripedSharedLock&) = delete;
  StripedSharedLock& operator=(const StripedSharedLock&) = delete;

 private:
  StripedSharedMutex& mu_;
  std::size_t stripe_;
};

// A count of calls in flight, striped per thread.
// Thread safety: thread-safe.
class StripedCounter {
 public:
  // Returns the stripe to hand back to remove.
  std::size_t add() {
    const std::size_t s = this_thread_stripe();
    stripes_[s].n.fetch_add(1, std::memory_order_relaxed);  // relaxed: a count
    return s;
  }
  void remove(std::size_t stripe) { stripes_[stripe].n.fetch_sub(1, std::memory_order_release); }
  // acquire: pairs with remove's release. Exact when no add runs meanwhile.
  int64_t sum() const {
    int64_t total = 0;
    for (const Stripe& s : stripes_) total += s.n.load(std::memory_order_acquire);
    return total;
  }

 private:
  struct alignas(64) Stripe {
    std::atomic<int64_t> n{0};
  };
  std::array<Stripe, kStripes> stripes_;
};

}  // namespace graphrun::sched
