// Calling a user's RunDone. Its contract says it must not throw; when it
// does anyway, the exception is caught and reported on standard error, so
// that what follows the call (the permit handed back, the session's count
// of calls in flight) still happens: otherwise the pool's thread would die
// (oneTBB aborts) or the session's destructor would wait for ever.
#pragma once

#include <graphrun/session.h>

#include <utility>
#include <vector>

namespace graphrun::sched {

// Reports a done that threw (`what`: the exception's what(), or null).
[[gnu::cold]] void report_throwing_done(const char* what) noexcept;

// Calls `done` (when not empty) with `result` and `metadata`; never throws.
inline void call_done(const RunDone& done, Result<std::vector<Tensor>> result,
                      RunMetadata* metadata) noexcept {
  if (!done) return;
  try {
    done(std::move(result), metadata);
  } catch (const std::exception& e) {
    report_throwing_done(e.what());
  } catch (...) {
    report_throwing_done(nullptr);
  }
}

}  // namespace graphrun::sched
