/// @file graphrun/status.h
/// Status and Result<T>: how every fallible graphrun call reports failure. No
/// exception crosses the public API; a call returns a Status with a canonical
/// code (the gRPC/Abseil set) and a message that names the culprit.
///
/// Example:
/// @code
///   Result<Tensor> r = ...;
///   if (!r.is_ok()) fmt::print("{}\n", r.status().to_string());
/// @endcode
///
/// Thread safety: Status and Result are values; thread-compatible.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace graphrun {

/// Canonical codes, numbered as in gRPC and Abseil so that they map 1:1 onto
/// the wire.
enum class StatusCode : int {
  kOk = 0,                  ///< not an error
  kCancelled = 1,           ///< the call was cancelled (close(), a stop token)
  kUnknown = 2,             ///< an error of no other kind
  kInvalidArgument = 3,     ///< the request is wrong whatever the state
  kDeadlineExceeded = 4,    ///< the deadline passed first
  kNotFound = 5,            ///< a name or handle that does not exist
  kAlreadyExists = 6,       ///< a name that is taken
  kPermissionDenied = 7,    ///< not allowed
  kResourceExhausted = 8,   ///< a limit or memory ran out
  kFailedPrecondition = 9,  ///< the state does not allow it (e.g. an uninitialized variable)
  kAborted = 10,            ///< aborted, usually by a concurrent conflict
  kOutOfRange = 11,         ///< past the end (an exhausted iterator)
  kUnimplemented = 12,      ///< not supported
  kInternal = 13,           ///< a broken invariant or an unexpected exception
  kUnavailable = 14,        ///< the service cannot be reached now
  kDataLoss = 15,           ///< unrecoverable data loss
  kUnauthenticated = 16,    ///< missing or wrong credentials
};

/// "InvalidArgument", "NotFound", ...
std::string_view status_code_name(StatusCode code);

/// The outcome of a fallible call: OK, or a canonical code and a message
/// that names the culprit. `fmt::format("{}", status)` prints to_string().
///
/// Thread safety: thread-compatible (a value).
class [[nodiscard]] Status {
 public:
  Status() = default;  ///< OK
  /// A status of `code` with `message` (an error unless `code` is kOk; an
  /// OK status keeps no message).
  Status(StatusCode code, std::string message);
  ///@{
  /// A value: copies copy the message; moves are a pointer's.
  Status(const Status& other)
      : state_(other.state_ == nullptr ? nullptr : std::make_unique<State>(*other.state_)) {}
  Status& operator=(const Status& other) {
    if (this != &other) {
      state_ = other.state_ == nullptr ? nullptr : std::make_unique<State>(*other.state_);
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;
  ///@}

  /// The OK status.
  static Status ok() { return Status(); }

  /// True for OK.
  bool is_ok() const { return state_ == nullptr; }
  /// The canonical code.
  StatusCode code() const { return state_ == nullptr ? StatusCode::kOk : state_->code; }
  /// The message; empty for OK.
  const std::string& message() const;

  /// "OK" or "InvalidArgument: <message>".
  std::string to_string() const;

  /// Keeps the first error: if this is OK, becomes `other`.
  void update(const Status& other);

  /// Same code, message "<prefix>: <message>". OK stays OK.
  Status with_prefix(std::string_view prefix) const;

  /// Same code and same message.
  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  // OK is no state at all: an OK status costs a null pointer to make, move
  // and test (every kernel call returns one).
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

namespace internal {
[[noreturn]] void check_failed(const char* file, int line, const char* what, std::string_view msg);
}  // namespace internal

/// Aborts with file and line when an internal invariant is broken. Never used
/// for conditions that bad user input can reach.
#define GRAPHRUN_CHECK(cond)                                                        \
  do {                                                                              \
    if (!(cond)) ::graphrun::internal::check_failed(__FILE__, __LINE__, #cond, {}); \
  } while (0)
/// As GRAPHRUN_CHECK, with `msg` (a string) in the report.
#define GRAPHRUN_CHECK_MSG(cond, msg)                                                  \
  do {                                                                                 \
    if (!(cond)) ::graphrun::internal::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
/// GRAPHRUN_CHECK in debug builds; with NDEBUG, `cond` is not evaluated.
#ifdef NDEBUG
#define GRAPHRUN_DCHECK(cond) \
  do {                        \
  } while (false && (cond))
#else
#define GRAPHRUN_DCHECK(cond) GRAPHRUN_CHECK(cond)
#endif

#define GRAPHRUN_STATUS_FACTORY(fn, code)                                              \
  template <typename... Args>                                                          \
  Status fn(fmt::format_string<Args...> format, Args&&... args) {                      \
    return Status(StatusCode::code, fmt::format(format, std::forward<Args>(args)...)); \
  }
///@{
/// Factories with fmt-checked format strings:
/// @code
///   return invalid_argument("feed '{}' fed twice", name);
/// @endcode
/// Each makes a Status of the code it is named after (unknown_error: kUnknown,
/// internal_error: kInternal) whose message is the formatted text.
GRAPHRUN_STATUS_FACTORY(cancelled, kCancelled)
GRAPHRUN_STATUS_FACTORY(unknown_error, kUnknown)
GRAPHRUN_STATUS_FACTORY(invalid_argument, kInvalidArgument)
GRAPHRUN_STATUS_FACTORY(deadline_exceeded, kDeadlineExceeded)
GRAPHRUN_STATUS_FACTORY(not_found, kNotFound)
GRAPHRUN_STATUS_FACTORY(already_exists, kAlreadyExists)
GRAPHRUN_STATUS_FACTORY(permission_denied, kPermissionDenied)
GRAPHRUN_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
GRAPHRUN_STATUS_FACTORY(failed_precondition, kFailedPrecondition)
GRAPHRUN_STATUS_FACTORY(aborted, kAborted)
GRAPHRUN_STATUS_FACTORY(out_of_range, kOutOfRange)
GRAPHRUN_STATUS_FACTORY(unimplemented, kUnimplemented)
GRAPHRUN_STATUS_FACTORY(internal_error, kInternal)
GRAPHRUN_STATUS_FACTORY(unavailable, kUnavailable)
///@}
#undef GRAPHRUN_STATUS_FACTORY

/// A value of T or a non-OK Status.
///
/// Thread safety: thread-compatible (a value).
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> makes no sense");

 public:
  ///@{
  /// Holds `value` (implicit, so a function returning Result<T> may return a T).
  Result(const T& value)
      : rep_(std::in_place_index<1>, value) {}  // NOLINT(google-explicit-constructor)
  Result(T&& value) : rep_(std::in_place_index<1>, std::move(value)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, Result>>>
  Result(U&& value) : rep_(std::in_place_index<1>, std::forward<U>(value)) {}  // NOLINT
  ///@}
  /// Holds the error `status`; aborts when it is OK.
  Result(Status status) : rep_(std::in_place_index<0>, std::move(status)) {  // NOLINT
    GRAPHRUN_CHECK_MSG(!std::get<0>(rep_).is_ok(), "Result constructed from an OK Status");
  }

  /// True when a value is held.
  bool is_ok() const { return rep_.index() == 1; }
  ///@{
  /// OK when a value is held.
  Status status() const& { return is_ok() ? Status::ok() : std::get<0>(rep_); }
  Status status() && { return is_ok() ? Status::ok() : std::move(std::get<0>(rep_)); }
  ///@}

  ///@{
  /// Aborts when there is no value: check is_ok() first.
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }
  T&& operator*() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  ///@}

  /// The value, or `fallback` when there is none.
  T value_or(T fallback) const& { return is_ok() ? std::get<1>(rep_) : std::move(fallback); }

 private:
  T& checked() {
    if (!is_ok()) {
      internal::check_failed(__FILE__, __LINE__, "Result::value() on an error",
                             std::get<0>(rep_).to_string());
    }
    return std::get<1>(rep_);
  }
  std::variant<Status, T> rep_;
};

#define GRAPHRUN_CONCAT_INNER(a, b) a##b
#define GRAPHRUN_CONCAT(a, b) GRAPHRUN_CONCAT_INNER(a, b)

/// Returns from the enclosing function when `expr` (a Status) is not OK.
#define GRAPHRUN_RETURN_IF_ERROR(expr)                      \
  do {                                                      \
    ::graphrun::Status graphrun_status_ = (expr);           \
    if (!graphrun_status_.is_ok()) return graphrun_status_; \
  } while (0)

/// `lhs = value of expr` (a Result), or returns its Status.
/// @code
///   GRAPHRUN_ASSIGN_OR_RETURN(Tensor* y, ctx.allocate_output(0, shape));
/// @endcode
#define GRAPHRUN_ASSIGN_OR_RETURN(lhs, expr) \
  GRAPHRUN_ASSIGN_OR_RETURN_IMPL(GRAPHRUN_CONCAT(graphrun_result_, __LINE__), lhs, expr)
#define GRAPHRUN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.is_ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

}  // namespace graphrun

/// @cond
template <>
struct fmt::formatter<graphrun::Status> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const graphrun::Status& s, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(s.to_string(), ctx);
  }
};
/// @endcond
