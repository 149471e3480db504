#include "scheduler/striped.h"

namespace graphrun::sched::striped_internal {

std::size_t deal_stripe() {
  static std::atomic<std::size_t> next{0};
  // relaxed: only spreads threads over stripes
  const std::size_t stripe = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  t_stripe_plus_one = stripe + 1;
  return stripe;
}

}  // namespace graphrun::sched::striped_internal
