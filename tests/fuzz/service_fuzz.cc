// libFuzzer target: the session service's request handling in process.
// Each input is a sequence of serialized SessionService calls
// (service_fuzz_input.h: selector byte, length, request bytes) that a
// RequestHandler (service/src/request_handler.h, the whole transport-free
// handling the gRPC layer feeds bytes into) answers over a SessionRegistry
// with small limits. Empty handle fields are filled from earlier responses,
// so mutations reach real sessions and partial runs.
//
// Invariants, per call: an OK answer has a response of the method's type;
// an error has a known code other than Unknown and Internal (those mean an
// exception or a broken invariant below) and a message; a request that does
// not parse is InvalidArgument saying so, one that parses is never that;
// the answers agree with what the sequence did so far (handles, graph
// versions, limits; ListSessions lists exactly the sessions created and not
// closed). After the sequence: every open session closes, none is left, and
// a known-good sequence (create, run, partial run, close) gives the exact
// values. The registry is destroyed after each input, so LeakSanitizer sees
// anything a session leaves behind.
#include <fmt/format.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <graphrun/session_registry.h>
#include <graphrun/v1/session_service.pb.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "service/src/request_handler.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/service_fuzz_input.h"

// ---- a memory ceiling for tensors ----
//
// A fuzzed graph may ask for any amount of memory, and the engine lets it
// (Fill's dims, a broadcast of a long column and a long row, a Const's
// declared shape): a real server would try and fail with bad_alloc, or
// swap. Here tensor buffers are the only aligned allocations of any size
// (internal::TensorBuffer uses 64-byte aligned operator new when tbbmalloc
// is off, as in the fuzz preset), so this binary replaces the aligned forms
// of operator new and delete: an allocation over kMaxAlignedAllocation
// throws std::bad_alloc as a full machine would, and the engine must turn
// that into ResourceExhausted. The memory comes from posix_memalign and goes
// back to free, so ASan still checks every access and LeakSanitizer every
// leak (only its new/delete mismatch check is lost for these forms).
namespace {

constexpr std::size_t kMaxAlignedAllocation = std::size_t{1} << 20;

void* aligned_allocate(std::size_t n, std::align_val_t align) noexcept {
  if (n > kMaxAlignedAllocation) return nullptr;
  const std::size_t alignment = std::max(static_cast<std::size_t>(align), sizeof(void*));
  void* p = nullptr;
  if (posix_memalign(&p, alignment, n == 0 ? 1 : n) != 0) return nullptr;
  return p;
}

void* aligned_allocate_or_throw(std::size_t n, std::align_val_t align) {
  void* p = aligned_allocate(n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n, std::align_val_t a) { return aligned_allocate_or_throw(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return aligned_allocate_or_throw(n, a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return aligned_allocate(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return aligned_allocate(n, a);
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace graphrun::fuzz {
namespace {

using service_internal::CallContext;
using service_internal::Method;
using service_internal::method_name;
using service_internal::RequestHandler;

// Small limits: few sessions and partial runs (so the limits are reached),
// small graphs and feeds (so kernels stay cheap), two threads a session.
ServiceLimits fuzz_limits() {
  ServiceLimits limits;
  limits.max_sessions = 4;
  limits.max_partial_runs_per_session = 4;
  limits.max_tensor_bytes_per_request = int64_t{64} << 10;
  limits.max_graph_nodes = 64;
  limits.max_inter_op_threads = 2;
  return limits;
}

// Every fuzzed call's deadline: nothing waits longer (a step past it is
// cancelled at the next node boundary or kernel poll).
constexpr std::chrono::milliseconds kCallDeadline(200);

std::unique_ptr<google::protobuf::Message> new_request(Method method) {
  switch (method) {
    case Method::kCreateSession: return std::make_unique<v1::CreateSessionRequest>();
    case Method::kExtendSession: return std::make_unique<v1::ExtendSessionRequest>();
    case Method::kRun: return std::make_unique<v1::RunRequest>();
    case Method::kPartialRunSetup: return std::make_unique<v1::PartialRunSetupRequest>();
    case Method::kPartialRun: return std::make_unique<v1::PartialRunRequest>();
    case Method::kCancelPartialRun: return std::make_unique<v1::CancelPartialRunRequest>();
    case Method::kCloseSession: return std::make_unique<v1::CloseSessionRequest>();
    case Method::kListSessions: return std::make_unique<v1::ListSessionsRequest>();
  }
  return nullptr;
}

std::string_view response_type(Method method) {
  switch (method) {
    case Method::kCreateSession: return "graphrun.v1.CreateSessionResponse";
    case Method::kExtendSession: return "graphrun.v1.ExtendSessionResponse";
    case Method::kRun:
    case Method::kPartialRun: return "graphrun.v1.RunResponse";
    case Method::kPartialRunSetup: return "graphrun.v1.PartialRunSetupResponse";
    case Method::kCancelPartialRun: return "graphrun.v1.CancelPartialRunResponse";
    case Method::kCloseSession: return "graphrun.v1.CloseSessionResponse";
    case Method::kListSessions: return "graphrun.v1.ListSessionsResponse";
  }
  return "?";
}

bool is_handle(std::string_view s, std::string_view prefix) {
  if (!s.starts_with(prefix) || s.size() != prefix.size() + 32) return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(prefix.size()), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A session the sequence created, as the fuzzer expects it to be.
struct TrackedSession {
  std::string handle;
  int64_t graph_version = 0;
  bool open = true;
  std::vector<std::string> partial_runs;  // in setup order; ended ones stay
};

using Answer = Result<std::unique_ptr<google::protobuf::Message>>;

// One input's registry, handler and the sequence's state.
// Thread safety: single-threaded.
class Driver {
 public:
  Driver() : registry_(fuzz_limits()), handler_(registry_) {}

  void call(const FuzzCall& call);
  // Closes what is open, checks nothing is left and that a known-good
  // sequence still works.
  void finish();

 private:
  TrackedSession* pick_session(uint8_t selector);
  TrackedSession* find(std::string_view handle);
  std::size_t open_sessions() const;
  std::string fill_handles(Method method, uint8_t selector, const std::string& bytes);
  Answer handle(Method method, const std::string& bytes, const CallContext& context);
  void check_answer(Method method, const std::string& bytes, const Answer& answer,
                    std::size_t open_before);

  SessionRegistry registry_;
  RequestHandler handler_;
  std::vector<TrackedSession> sessions_;  // in creation order
};

std::size_t Driver::open_sessions() const {
  return static_cast<std::size_t>(
      std::count_if(sessions_.begin(), sessions_.end(), [](const auto& s) { return s.open; }));
}

TrackedSession* Driver::pick_session(uint8_t selector) {
  if (sessions_.empty()) return nullptr;
  const std::size_t back =
      std::min<std::size_t>((selector >> kSessionShift) & 3, sessions_.size() - 1);
  return &sessions_[sessions_.size() - 1 - back];
}

TrackedSession* Driver::find(std::string_view handle) {
  for (TrackedSession& s : sessions_) {
    if (s.handle == handle) return &s;
  }
  return nullptr;
}

// The request with its empty handles (and an ExtendSession's zero version)
// filled in; `bytes` unchanged when they do not parse as the request.
std::string Driver::fill_handles(Method method, uint8_t selector, const std::string& bytes) {
  std::unique_ptr<google::protobuf::Message> request = new_request(method);
  TrackedSession* session = pick_session(selector);
  if (session == nullptr || !request->ParseFromString(bytes)) return bytes;
  const google::protobuf::Descriptor* d = request->GetDescriptor();
  const google::protobuf::Reflection* r = request->GetReflection();
  if (const auto* f = d->FindFieldByName("session_handle");
      f != nullptr && r->GetString(*request, f).empty()) {
    r->SetString(request.get(), f, session->handle);
  }
  if (const auto* f = d->FindFieldByName("partial_run_handle");
      f != nullptr && r->GetString(*request, f).empty() && !session->partial_runs.empty()) {
    const std::size_t back =
        (selector & kOlderPartialRun) != 0 && session->partial_runs.size() > 1 ? 1 : 0;
    r->SetString(request.get(), f, session->partial_runs[session->partial_runs.size() - 1 - back]);
  }
  if (const auto* f = d->FindFieldByName("current_graph_version");
      f != nullptr && r->GetInt64(*request, f) == 0) {
    r->SetInt64(request.get(), f, session->graph_version);
  }
  std::string out;
  GRAPHRUN_FUZZ_CHECK(request->SerializeToString(&out), "a parsed request does not serialize");
  return out;
}

Answer Driver::handle(Method method, const std::string& bytes, const CallContext& context) {
  Answer answer = handler_.handle(method, bytes, context);
  if (answer.is_ok()) {
    GRAPHRUN_FUZZ_CHECK(*answer != nullptr, "OK with no response");
    GRAPHRUN_FUZZ_CHECK((*answer)->GetTypeName() == response_type(method),
                        "the response has the wrong type");
  } else {
    const Status& s = answer.status();
    const int code = static_cast<int>(s.code());
    GRAPHRUN_FUZZ_CHECK(code > 0 && code <= static_cast<int>(StatusCode::kUnauthenticated), s);
    GRAPHRUN_FUZZ_CHECK(s.code() != StatusCode::kUnknown && s.code() != StatusCode::kInternal, s);
    GRAPHRUN_FUZZ_CHECK(!s.message().empty(), s);
  }
  return answer;
}

void Driver::call(const FuzzCall& call) {
  const auto method = static_cast<Method>(call.selector & kMethodMask);
  const std::string bytes = (call.selector & kRaw) != 0
                                ? call.request
                                : fill_handles(method, call.selector, call.request);
  CallContext context;
  context.deadline = std::chrono::system_clock::now() + kCallDeadline;
  std::stop_source stop;
  if ((call.selector & kStopped) != 0) stop.request_stop();
  context.stop = stop.get_token();
  const std::size_t open_before = open_sessions();
  const Answer answer = handle(method, bytes, context);
  // GRAPHRUN_FUZZ_VERBOSE=1: each call's answer (to see that seeds reach
  // real sessions: `GRAPHRUN_FUZZ_VERBOSE=1 service_fuzz -runs=0 <seeds>`).
  static const bool verbose = std::getenv("GRAPHRUN_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "fuzz: %.*s%s: %s\n", static_cast<int>(method_name(method).size()),
                 method_name(method).data(), (call.selector & kRaw) != 0 ? " (raw)" : "",
                 answer.is_ok() ? "OK" : answer.status().to_string().c_str());
  }
  check_answer(method, bytes, answer, open_before);
}

// The answer against the sequence so far; updates the tracked sessions.
void Driver::check_answer(Method method, const std::string& bytes, const Answer& answer,
                          std::size_t open_before) {
  std::unique_ptr<google::protobuf::Message> parsed = new_request(method);
  const bool parses = parsed->ParseFromString(bytes);
  const std::string parse_error = fmt::format("the {} request (", method_name(method));
  const bool is_parse_error =
      !answer.is_ok() && answer.status().message().starts_with(parse_error) &&
      answer.status().message().find("could not be parsed") != std::string::npos;
  if (!parses) {
    GRAPHRUN_FUZZ_CHECK(is_parse_error, answer.status());
    GRAPHRUN_FUZZ_CHECK(answer.status().code() == StatusCode::kInvalidArgument, answer.status());
    return;
  }
  GRAPHRUN_FUZZ_CHECK(!is_parse_error, answer.status());

  if (method == Method::kCreateSession && open_before >= registry_.limits().max_sessions) {
    GRAPHRUN_FUZZ_CHECK(!answer.is_ok(), "a session past max_sessions");
  }
  // A call on a tracked open session that says it is gone.
  const google::protobuf::FieldDescriptor* handle_field =
      parsed->GetDescriptor()->FindFieldByName("session_handle");
  TrackedSession* session = handle_field != nullptr
                                ? find(parsed->GetReflection()->GetString(*parsed, handle_field))
                                : nullptr;
  if (!answer.is_ok()) {
    const Status& s = answer.status();
    if (session != nullptr && session->open) {
      GRAPHRUN_FUZZ_CHECK(
          !s.message().starts_with(fmt::format("session '{}' not found", session->handle)),
          "an open session is not found", s);
    }
    if (method == Method::kCloseSession && session != nullptr &&
        s.code() != StatusCode::kNotFound) {
      session->open = false;  // forgotten even when Session::close failed
    }
    return;
  }
  const google::protobuf::Message& response = **answer;
  if (handle_field != nullptr) {
    // Handles are 128 random bits: only the sequence's own sessions answer.
    GRAPHRUN_FUZZ_CHECK(session != nullptr && session->open, "OK for a session not open");
  }
  switch (method) {
    case Method::kCreateSession: {
      const auto& created = static_cast<const v1::CreateSessionResponse&>(response);
      GRAPHRUN_FUZZ_CHECK(is_handle(created.session_handle(), "s-"), created.session_handle());
      GRAPHRUN_FUZZ_CHECK(created.graph_version() == 0);
      GRAPHRUN_FUZZ_CHECK(find(created.session_handle()) == nullptr, "a handle given twice");
      sessions_.push_back(TrackedSession{.handle = created.session_handle()});
      break;
    }
    case Method::kExtendSession: {
      const auto& request = static_cast<const v1::ExtendSessionRequest&>(*parsed);
      const auto& extended = static_cast<const v1::ExtendSessionResponse&>(response);
      GRAPHRUN_FUZZ_CHECK(request.current_graph_version() == session->graph_version,
                          "extended from a stale version");
      GRAPHRUN_FUZZ_CHECK(extended.new_graph_version() == session->graph_version + 1);
      session->graph_version = extended.new_graph_version();
      break;
    }
    case Method::kRun:
    case Method::kPartialRun: {
      const auto& ran = static_cast<const v1::RunResponse&>(response);
      const auto& fetch = method == Method::kRun
                              ? static_cast<const v1::RunRequest&>(*parsed).fetch()
                              : static_cast<const v1::PartialRunRequest&>(*parsed).fetch();
      GRAPHRUN_FUZZ_CHECK(ran.tensor_size() == fetch.size(), "not one tensor per fetch");
      for (int i = 0; i < ran.tensor_size(); ++i) {
        GRAPHRUN_FUZZ_CHECK(ran.tensor(i).name() == fetch.Get(i), "fetches out of order");
        Result<Tensor> value = tensor_from_proto(ran.tensor(i).tensor());
        GRAPHRUN_FUZZ_CHECK(value.is_ok(), value.status());
      }
      if (method == Method::kPartialRun) {
        const auto& id = static_cast<const v1::PartialRunRequest&>(*parsed).partial_run_handle();
        GRAPHRUN_FUZZ_CHECK(std::find(session->partial_runs.begin(), session->partial_runs.end(),
                                      id) != session->partial_runs.end(),
                            "OK for a partial run never set up");
      }
      break;
    }
    case Method::kPartialRunSetup: {
      const auto& id =
          static_cast<const v1::PartialRunSetupResponse&>(response).partial_run_handle();
      GRAPHRUN_FUZZ_CHECK(is_handle(id, "pr-"), id);
      session->partial_runs.push_back(id);
      break;
    }
    case Method::kCancelPartialRun: break;
    case Method::kCloseSession: session->open = false; break;
    case Method::kListSessions: {
      const auto& listed = static_cast<const v1::ListSessionsResponse&>(response);
      GRAPHRUN_FUZZ_CHECK(static_cast<std::size_t>(listed.sessions_size()) == open_sessions(),
                          "ListSessions does not list the open sessions");
      for (const v1::SessionInfo& info : listed.sessions()) {
        const TrackedSession* s = find(info.session_handle());
        GRAPHRUN_FUZZ_CHECK(s != nullptr && s->open, info.session_handle());
        GRAPHRUN_FUZZ_CHECK(info.graph_version() == s->graph_version);
        GRAPHRUN_FUZZ_CHECK(info.num_nodes() <= registry_.limits().max_graph_nodes);
        GRAPHRUN_FUZZ_CHECK(info.open_partial_runs() >= 0 &&
                            static_cast<std::size_t>(info.open_partial_runs()) <=
                                registry_.limits().max_partial_runs_per_session);
      }
      break;
    }
  }
}

// ---- the known-good sequence ----

struct KnownGood {
  std::string create;  // x: float[2] placeholder; y = x + [10, 20]
};

const KnownGood& known_good() {
  static const KnownGood requests = [] {
    Graph g;
    const Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
    ops::Add(g, x, ops::Const(g, Tensor{10.0f, 20.0f}, "c"), "y");
    Result<v1::GraphDef> def = graph_to_graph_def(g);
    GRAPHRUN_FUZZ_CHECK(def.is_ok(), def.status());
    v1::CreateSessionRequest create;
    *create.mutable_graph_def() = *def;
    create.mutable_config()->set_inter_op_threads(1);
    return KnownGood{create.SerializeAsString()};
  }();
  return requests;
}

void set_feed(google::protobuf::RepeatedPtrField<v1::NamedTensorProto>& feeds, const Tensor& x) {
  v1::NamedTensorProto* feed = feeds.Add();
  feed->set_name("x");
  *feed->mutable_tensor() = tensor_to_proto(x);
}

// y from a Run or PartialRun response: [a, b] exactly.
void expect_y(const google::protobuf::Message& response, float a, float b) {
  const auto& ran = static_cast<const v1::RunResponse&>(response);
  GRAPHRUN_FUZZ_CHECK(ran.tensor_size() == 1 && ran.tensor(0).name() == "y");
  Result<Tensor> y = tensor_from_proto(ran.tensor(0).tensor());
  GRAPHRUN_FUZZ_CHECK(y.is_ok(), y.status());
  GRAPHRUN_FUZZ_CHECK(y->dtype() == DType::kFloat32 && y->shape() == Shape{2}, "y is not float[2]");
  GRAPHRUN_FUZZ_CHECK(y->flat<float>()[0] == a && y->flat<float>()[1] == b, "y has wrong values");
}

void Driver::finish() {
  // A correct request's calls get a generous deadline: a hang is a finding.
  CallContext context;
  context.deadline = std::chrono::system_clock::now() + std::chrono::seconds(5);
  const auto must = [&](Method method, const std::string& bytes) {
    Answer answer = handle(method, bytes, context);
    GRAPHRUN_FUZZ_CHECK(answer.is_ok(), answer.status());
    return std::move(answer).value();
  };
  for (TrackedSession& s : sessions_) {
    if (!s.open) continue;
    v1::CloseSessionRequest close;
    close.set_session_handle(s.handle);
    must(Method::kCloseSession, close.SerializeAsString());
    s.open = false;
  }
  GRAPHRUN_FUZZ_CHECK(registry_.size() == 0, "sessions left after closing every one");

  const auto created = must(Method::kCreateSession, known_good().create);
  const std::string handle =
      static_cast<const v1::CreateSessionResponse&>(*created).session_handle();
  v1::RunRequest run;
  run.set_session_handle(handle);
  set_feed(*run.mutable_feed(), Tensor{1.0f, 2.0f});
  run.add_fetch("y");
  expect_y(*must(Method::kRun, run.SerializeAsString()), 11.0f, 22.0f);

  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(handle);
  setup.add_feed("x");
  setup.add_fetch("y");
  const auto set_up = must(Method::kPartialRunSetup, setup.SerializeAsString());
  v1::PartialRunRequest partial;
  partial.set_session_handle(handle);
  partial.set_partial_run_handle(
      static_cast<const v1::PartialRunSetupResponse&>(*set_up).partial_run_handle());
  set_feed(*partial.mutable_feed(), Tensor{3.0f, 4.0f});
  partial.add_fetch("y");
  expect_y(*must(Method::kPartialRun, partial.SerializeAsString()), 13.0f, 24.0f);

  v1::CloseSessionRequest close;
  close.set_session_handle(handle);
  must(Method::kCloseSession, close.SerializeAsString());
  const auto listed = must(Method::kListSessions, "");
  GRAPHRUN_FUZZ_CHECK(static_cast<const v1::ListSessionsResponse&>(*listed).sessions_size() == 0,
                      "the known-good session is still listed");
}

}  // namespace
}  // namespace graphrun::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // The service's own rate-limited protobuf log handler (at most a few
  // lines a minute, and it keeps each parse error's reason for the status
  // message): the fuzzer's stderr is not flooded, and that path is fuzzed.
  graphrun::service_internal::install_protobuf_log_handler();
  static_cast<void>(graphrun::fuzz::known_good());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<graphrun::fuzz::FuzzCall> calls =
      graphrun::fuzz::decode_calls(std::string_view(reinterpret_cast<const char*>(data), size));
  graphrun::fuzz::Driver driver;
  for (const graphrun::fuzz::FuzzCall& call : calls) driver.call(call);
  driver.finish();
  return 0;
}
