#include "scheduler/striped.h"

namespace graphrun::sched {

std::size_t this_thread_stripe() {
  static std::atomic<std::size_t> next{0};
  // relaxed: only spreads threads over stripes
  thread_local const std::size_t stripe = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return stripe;
}

}  // namespace graphrun::sched
