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

class SessionImpl;

// Reports a done that threw (`what`: the exception's what(), or null).
[[gnu::cold]] void report_throwing_done(const char* what) noexcept;

// The session whose done this thread is running (null outside dones).
inline constinit thread_local const SessionImpl* t_done_of = nullptr;

// True on a thread inside one of `session`'s dones: its call still counts
// as in flight, so the session's destructor must not wait for it here.
inline bool in_done_of(const SessionImpl* session) { return t_done_of == session; }

// Calls `done` of a call of `session` (when not empty) with `result` and
// `metadata`; never throws.
inline void call_done(const SessionImpl* session, const RunDone& done,
                      Result<std::vector<Tensor>> result, RunMetadata* metadata) noexcept {
  if (!done) return;
  const SessionImpl* const outer = t_done_of;  // a done may run another session's call
  t_done_of = session;
  try {
    done(std::move(result), metadata);
  } catch (const std::exception& e) {
    report_throwing_done(e.what());
  } catch (...) {
    report_throwing_done(nullptr);
  }
  t_done_of = outer;
}

}  // namespace graphrun::sched
