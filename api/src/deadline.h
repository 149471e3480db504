// Deadlines from timeouts a caller (or a remote client) chose: a timeout
// past what the clock can count means no deadline. `now + timeout` would
// overflow the clock's nanosecond count there (undefined behaviour, and in
// practice a deadline in the past: a 2^63 ms timeout failed at once).
//
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <optional>

namespace graphrun::internal {

// `now` + `timeout` on `Clock`, or Clock::time_point::max() when that is
// past the clock's range. A negative timeout gives `now` (already due).
template <typename Clock>
typename Clock::time_point deadline_after(typename Clock::time_point now,
                                          std::chrono::milliseconds timeout) {
  using TimePoint = typename Clock::time_point;
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  // Whole milliseconds left before the clock's end: dividing cannot overflow.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(TimePoint::max() - now);
  if (timeout >= room) return TimePoint::max();
  return now + std::chrono::duration_cast<typename TimePoint::duration>(timeout);
}

// The same from the steady clock's present.
inline std::chrono::steady_clock::time_point steady_deadline_after(
    std::chrono::milliseconds timeout) {
  return deadline_after<std::chrono::steady_clock>(std::chrono::steady_clock::now(), timeout);
}

// The deadline a step or call has from a caller's `timeout`: nullopt when
// the timeout is past the clock's range (no deadline, so no per-node clock
// reads and no timer).
inline std::optional<std::chrono::steady_clock::time_point> steady_deadline_for(
    std::chrono::milliseconds timeout) {
  const auto deadline = steady_deadline_after(timeout);
  if (deadline == std::chrono::steady_clock::time_point::max()) return std::nullopt;
  return deadline;
}

}  // namespace graphrun::internal
