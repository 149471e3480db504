#include <graphrun/status.h>

#include <cstdio>
#include <cstdlib>

namespace graphrun {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnknown: return "Unknown";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message)
    : state_(code == StatusCode::kOk ? nullptr
                                     : std::make_unique<State>(State{code, std::move(message)})) {}

const std::string& Status::message() const {
  static const std::string empty;
  return state_ == nullptr ? empty : state_->message;
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(state_->code), state_->message);
}

void Status::update(const Status& other) {
  if (is_ok() && !other.is_ok()) *this = other;
}

Status Status::with_prefix(std::string_view prefix) const {
  if (is_ok()) return *this;
  return Status(state_->code, fmt::format("{}: {}", prefix, state_->message));
}

namespace internal {
void check_failed(const char* file, int line, const char* what, std::string_view msg) {
  std::fprintf(stderr, "graphrun: check failed at %s:%d: %s%s%.*s\n", file, line, what,
               msg.empty() ? "" : ": ", static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

}  // namespace graphrun
