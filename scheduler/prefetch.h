// prefetch(p): starts loading the cache line holding `p` (read, all cache
// levels); never faults, so `p` may be null or stale.
// GCC 12 at -O3 emitted none of three __builtin_prefetch calls in
// RunState::execute (two to one object, one to another), so on x86-64
// the instruction is written out; elsewhere the builtin.
// Thread safety: no state.
#pragma once

namespace graphrun::sched {

inline void prefetch(const void* p) noexcept {
#if defined(__x86_64__)
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
  __builtin_prefetch(p);
#endif
}

}  // namespace graphrun::sched
