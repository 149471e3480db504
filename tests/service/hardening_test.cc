// Hostile and careless clients against the real graphrun-server binary:
// thread counts past the cap, requests that do not parse (garbage,
// truncated, invalid UTF-8, nested 20,000 messages deep), a flood of
// protobuf log lines, negative timeouts and config fields, a partial-run
// call cancelled by its client, and the unix socket's file mode. Each case
// then checks that the server still answers a correct request.
#include <graphrun/graph_def.h>
#include <graphrun/ops.h>
#include <graphrun/session_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <chrono>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/service/server_process.h"
#include "tests/service/slow_graph.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::byte_buffer;
using ::graphrun::testing::kServerBinary;
using ::graphrun::testing::kSlowDim;
using ::graphrun::testing::ServerProcess;
using ::graphrun::testing::slice_bytes;
using ::graphrun::testing::slow_partial_graph_def;
using ::graphrun::testing::TempDir;
using ::graphrun::testing::TensorEq;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::array<const char*, 8> kMethods = {
    "CreateSession", "ExtendSession",    "Run",          "PartialRunSetup",
    "PartialRun",    "CancelPartialRun", "CloseSession", "ListSessions"};

// One SessionService call with raw request bytes.
grpc::Status raw_call(grpc::Channel& channel, const std::string& method, const std::string& bytes,
                      std::string* response = nullptr, bool with_deadline = true) {
  const std::string path = "/graphrun.v1.SessionService/" + method;
  const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  // Without one, the request's own timeout is the only bound (the server
  // takes the sooner of the two).
  if (with_deadline)
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::ByteBuffer out;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, rpc, &context, byte_buffer(bytes), &out);
  if (response != nullptr) *response = status.ok() ? slice_bytes(out) : "";
  return status;
}

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

// A length-delimited field.
std::string field(int number, const std::string& payload) {
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(payload.size()) + payload;
}

// A CreateSessionRequest whose one node's attribute nests `messages`
// messages deep: AttrValue.func (10) -> NameAttrList.attr (2) -> map entry
// value (2) -> AttrValue ... built from the inside out, so the client
// never recurses.
std::string deeply_nested_create_request(int messages) {
  std::string value;  // the innermost AttrValue, empty
  for (int depth = 0; depth < messages; depth += 3) {
    const std::string entry = field(1, "a") + field(2, value);
    value = field(10, field(2, entry));
  }
  const std::string node =
      field(1, "n") + field(2, "NoOp") + field(5, field(1, "x") + field(2, value));
  return field(1, field(1, node));  // CreateSessionRequest.graph_def.node
}

std::string tiny_create_request() {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  v1::CreateSessionRequest request;
  *request.mutable_graph_def() = graph_to_graph_def(g).value();
  return request.SerializeAsString();
}

// The server still works: a session on the tiny graph answers 1.
void expect_still_serving(grpc::Channel& channel) {
  std::string bytes;
  const grpc::Status created = raw_call(channel, "CreateSession", tiny_create_request(), &bytes);
  ASSERT_TRUE(created.ok()) << created.error_message();
  v1::CreateSessionResponse response;
  ASSERT_TRUE(response.ParseFromString(bytes));
  v1::RunRequest run;
  run.set_session_handle(response.session_handle());
  run.add_fetch("one");
  const grpc::Status ran = raw_call(channel, "Run", run.SerializeAsString(), &bytes);
  ASSERT_TRUE(ran.ok()) << ran.error_message();
  v1::RunResponse out;
  ASSERT_TRUE(out.ParseFromString(bytes));
  ASSERT_EQ(out.tensor_size(), 1);
  EXPECT_THAT(tensor_from_proto(out.tensor(0).tensor()).value(), TensorEq(Tensor(1.0f)));
  v1::CloseSessionRequest close;
  close.set_session_handle(response.session_handle());
  EXPECT_TRUE(raw_call(channel, "CloseSession", close.SerializeAsString()).ok());
}

class ServerHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kServerBinary == nullptr) GTEST_SKIP() << "graphrun-server is not built (tools off)";
  }
};

TEST_F(ServerHardeningTest, ThreadCountsPastTheCapAreInvalidArgumentNamingFieldValueAndCap) {
  ServerProcess server({"--max-inter-op-threads", "2"});
  ASSERT_FALSE(server.address().empty()) << server.child().read_stderr();
  auto channel = server.channel();
  const int64_t rss_before = ::graphrun::testing::resident_bytes(server.child().pid());
  for (const int32_t threads : {3, 65537, 1'000'000, 10'000'000, 100'000'000, 2147483647}) {
    v1::CreateSessionRequest request;
    request.ParseFromString(tiny_create_request());
    request.mutable_config()->set_inter_op_threads(threads);
    const grpc::Status status = raw_call(*channel, "CreateSession", request.SerializeAsString());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << threads;
    EXPECT_THAT(status.error_message(),
                HasSubstr("SessionConfig.inter_op_threads = " + std::to_string(threads)));
    EXPECT_THAT(status.error_message(), HasSubstr("limit of 2 (max_inter_op_threads)"));
  }
  v1::CreateSessionRequest negative;
  negative.ParseFromString(tiny_create_request());
  negative.mutable_config()->set_inter_op_threads(-1);
  const grpc::Status refused = raw_call(*channel, "CreateSession", negative.SerializeAsString());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("SessionConfig.inter_op_threads must not be"));
  // At the cap: created, run, closed; the server lives on.
  v1::CreateSessionRequest at_cap;
  at_cap.ParseFromString(tiny_create_request());
  at_cap.mutable_config()->set_inter_op_threads(2);
  std::string bytes;
  ASSERT_TRUE(raw_call(*channel, "CreateSession", at_cap.SerializeAsString(), &bytes).ok());
  v1::CreateSessionResponse created;
  ASSERT_TRUE(created.ParseFromString(bytes));
  v1::CloseSessionRequest close;
  close.set_session_handle(created.session_handle());
  EXPECT_TRUE(raw_call(*channel, "CloseSession", close.SerializeAsString()).ok());
  expect_still_serving(*channel);
  // No pool of a million threads was ever made.
  EXPECT_LT(::graphrun::testing::resident_bytes(server.child().pid()), rss_before + (64 << 20));
}

// gRPC 1.51 stops accepting on a port for good once an accept fails for
// want of a file descriptor (grpc/grpc#20418), so the server raises its
// soft limit of open files to the hard limit at start: started with a soft
// limit of 256, it runs with the hard one.
TEST_F(ServerHardeningTest, TheServerTakesEveryOpenFileTheHardLimitAllows) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max <= 256) GTEST_SKIP() << "the hard limit is " << saved.rlim_max;
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::optional<ServerProcess> server;
  server.emplace(std::vector<std::string>{});  // inherits the soft limit of 256
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(server->address().empty());
  std::ifstream limits("/proc/" + std::to_string(server->child().pid()) + "/limits");
  std::string line;
  std::string open_files;
  while (std::getline(limits, line)) {
    if (line.starts_with("Max open files")) open_files = line;
  }
  std::istringstream fields(open_files.substr(std::string("Max open files").size()));
  std::string soft;
  std::string hard;
  fields >> soft >> hard;
  EXPECT_EQ(soft, hard) << open_files;
  EXPECT_EQ(soft, std::to_string(saved.rlim_max)) << open_files;
  expect_still_serving(*server->channel());
}

// A duration under half a millisecond rounded to 0, which for the idle
// timeouts means "never": --session-idle-timeout 0.0001 kept sessions for
// ever. Any duration above 0 is at least 1 ms.
TEST_F(ServerHardeningTest, IdleTimeoutsUnderAMillisecondAreOneMillisecondNotNever) {
  for (const char* timeout : {"0.0001", "1e-9s", "0.2ms"}) {
    ServerProcess server({"--session-idle-timeout", timeout});
    ASSERT_FALSE(server.address().empty()) << timeout;
    auto channel = server.channel();
    std::string bytes;
    ASSERT_TRUE(raw_call(*channel, "CreateSession", tiny_create_request(), &bytes).ok());
    v1::ListSessionsResponse listed;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_TRUE(raw_call(*channel, "ListSessions", "", &bytes).ok());
      ASSERT_TRUE(listed.ParseFromString(bytes));
    } while (listed.sessions_size() > 0 && std::chrono::steady_clock::now() < give_up);
    EXPECT_EQ(listed.sessions_size(), 0) << timeout << ": the idle session was never closed";
  }
}

TEST_F(ServerHardeningTest, OtherNegativeConfigFieldsAndTimeoutsAreNamed) {
  ServerProcess server({});
  ASSERT_FALSE(server.address().empty());
  auto channel = server.channel();
  const std::vector<std::pair<std::string, void (*)(v1::SessionConfig&)>> fields = {
      {"plan_cache_capacity", [](v1::SessionConfig& c) { c.set_plan_cache_capacity(-1); }},
      {"max_open_partial_runs", [](v1::SessionConfig& c) { c.set_max_open_partial_runs(-2); }},
      {"partial_run_idle_timeout_ms",
       [](v1::SessionConfig& c) { c.set_partial_run_idle_timeout_ms(-3); }},
  };
  for (const auto& [name, set] : fields) {
    v1::CreateSessionRequest request;
    request.ParseFromString(tiny_create_request());
    set(*request.mutable_config());
    const grpc::Status status = raw_call(*channel, "CreateSession", request.SerializeAsString());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_THAT(status.error_message(), HasSubstr("SessionConfig." + name + " must not be"));
  }
  std::string bytes;
  ASSERT_TRUE(raw_call(*channel, "CreateSession", tiny_create_request(), &bytes).ok());
  v1::CreateSessionResponse created;
  ASSERT_TRUE(created.ParseFromString(bytes));
  v1::RunRequest run;
  run.set_session_handle(created.session_handle());
  run.add_fetch("one");
  run.mutable_options()->set_timeout_ms(-5);
  const grpc::Status ran = raw_call(*channel, "Run", run.SerializeAsString());
  EXPECT_EQ(ran.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ran.error_message(), HasSubstr("RunOptions.timeout_ms must not be negative, got -5"));
  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(created.session_handle());
  setup.add_fetch("one");
  setup.mutable_options()->set_timeout_ms(-1);
  const grpc::Status set_up = raw_call(*channel, "PartialRunSetup", setup.SerializeAsString());
  EXPECT_EQ(set_up.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(set_up.error_message(), HasSubstr("RunOptions.timeout_ms"));
  setup.mutable_options()->set_timeout_ms(0);
  ASSERT_TRUE(raw_call(*channel, "PartialRunSetup", setup.SerializeAsString(), &bytes).ok());
  v1::PartialRunSetupResponse handle;
  ASSERT_TRUE(handle.ParseFromString(bytes));
  v1::PartialRunRequest call;
  call.set_session_handle(created.session_handle());
  call.set_partial_run_handle(handle.partial_run_handle());
  call.add_fetch("one");
  call.mutable_options()->set_timeout_ms(-7);
  const grpc::Status called = raw_call(*channel, "PartialRun", call.SerializeAsString());
  EXPECT_EQ(called.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(called.error_message(), HasSubstr("RunOptions.timeout_ms must not be negative"));
  expect_still_serving(*channel);
}

// The largest timeouts a client can send mean no deadline. Added to now(),
// they overflowed the clock's nanosecond count (undefined behaviour), and
// the run failed at once with DeadlineExceeded.
TEST_F(ServerHardeningTest, TheLargestTimeoutsAreNoDeadline) {
  ServerProcess server({});
  ASSERT_FALSE(server.address().empty());
  auto channel = server.channel();
  // A node that runs on every step (a fetched Const alone runs nothing,
  // so no deadline would be checked).
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  ops::Add(g, x, x, "twice");
  v1::CreateSessionRequest create;
  *create.mutable_graph_def() = graph_to_graph_def(g).value();
  create.mutable_config()->set_partial_run_idle_timeout_ms(std::numeric_limits<int64_t>::max());
  // The calls carry no gRPC deadline, which would replace the timeouts.
  constexpr bool kNoDeadline = false;
  std::string bytes;
  ASSERT_TRUE(raw_call(*channel, "CreateSession", create.SerializeAsString(), &bytes).ok());
  v1::CreateSessionResponse created;
  ASSERT_TRUE(created.ParseFromString(bytes));
  // Feeds x, fetches "twice", with `timeout`: a Run or a PartialRun call.
  const auto fill = [&](auto& request, int64_t timeout) {
    request.set_session_handle(created.session_handle());
    v1::NamedTensorProto* f = request.add_feed();
    f->set_name("x");
    *f->mutable_tensor() = tensor_to_proto(Tensor(1.5f));
    request.add_fetch("twice");
    request.mutable_options()->set_timeout_ms(timeout);
  };
  for (const int64_t timeout : {std::numeric_limits<int64_t>::max(), int64_t{1} << 50}) {
    v1::RunRequest run;
    fill(run, timeout);
    const grpc::Status ran =
        raw_call(*channel, "Run", run.SerializeAsString(), &bytes, kNoDeadline);
    EXPECT_TRUE(ran.ok()) << timeout << ": " << ran.error_message();
    v1::PartialRunSetupRequest setup;
    setup.set_session_handle(created.session_handle());
    setup.add_feed("x");
    setup.add_fetch("twice");
    setup.mutable_options()->set_timeout_ms(timeout);
    const grpc::Status set_up =
        raw_call(*channel, "PartialRunSetup", setup.SerializeAsString(), &bytes, kNoDeadline);
    ASSERT_TRUE(set_up.ok()) << timeout << ": " << set_up.error_message();
    v1::PartialRunSetupResponse handle;
    ASSERT_TRUE(handle.ParseFromString(bytes));
    v1::PartialRunRequest call;
    fill(call, timeout);
    call.set_partial_run_handle(handle.partial_run_handle());
    const grpc::Status called =
        raw_call(*channel, "PartialRun", call.SerializeAsString(), &bytes, kNoDeadline);
    EXPECT_TRUE(called.ok()) << timeout << ": " << called.error_message();
    v1::RunResponse out;
    ASSERT_TRUE(out.ParseFromString(bytes));
    ASSERT_EQ(out.tensor_size(), 1);
    EXPECT_THAT(tensor_from_proto(out.tensor(0).tensor()).value(), TensorEq(Tensor(3.0f)));
  }
  expect_still_serving(*channel);
}

TEST_F(ServerHardeningTest, UnparseableRequestsAreInvalidArgumentWithAMessageForEveryRpc) {
  ServerProcess server({});
  ASSERT_FALSE(server.address().empty());
  auto channel = server.channel();
  const std::string valid = tiny_create_request();
  // A string field (field 1 of every request but CreateSession and
  // ListSessions is the session handle) holding invalid UTF-8.
  const std::string bad_utf8 = field(1, "\xff\xfe\xfd");
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"garbage", "\xff\xff\xff\xff\xff"},
      {"truncated", valid.substr(0, valid.size() - 3)},
      {"a group never closed", std::string("\x0b", 1)},
  };
  for (const char* method : kMethods) {
    for (const auto& [what, bytes] : inputs) {
      const grpc::Status status = raw_call(*channel, method, bytes);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ", " << what;
      EXPECT_THAT(status.error_message(), HasSubstr(std::string("the ") + method + " request"))
          << what;
      EXPECT_THAT(status.error_message(), HasSubstr("could not be parsed")) << what;
    }
    if (std::string(method) == "CreateSession" || std::string(method) == "ListSessions") continue;
    const grpc::Status status = raw_call(*channel, method, bad_utf8);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("UTF-8")) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("session_handle")) << method;
  }
  const grpc::Status deep =
      raw_call(*channel, "CreateSession", deeply_nested_create_request(20'000));
  EXPECT_EQ(deep.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(deep.error_message(), HasSubstr("nested deeper than 100"));
  // A shallow nesting of the same shape is a valid request (the import
  // then refuses the attribute, but parsing went through).
  const grpc::Status shallow = raw_call(*channel, "CreateSession", deeply_nested_create_request(9));
  EXPECT_THAT(shallow.error_message(), Not(HasSubstr("could not be parsed")));
  expect_still_serving(*channel);
}

TEST_F(ServerHardeningTest, ProtobufLogLinesAreRateLimited) {
  ServerProcess server({});
  ASSERT_FALSE(server.address().empty());
  auto channel = server.channel();
  v1::RunRequest run;
  for (int i = 0; i < 200; ++i) {
    const grpc::Status status = raw_call(*channel, "Run", field(1, "\xc3\x28"));
    ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  expect_still_serving(*channel);
  ASSERT_EQ(::kill(server.child().pid(), SIGTERM), 0);
  ASSERT_TRUE(server.child().wait(std::chrono::seconds(30)).has_value());
  const std::string err = server.child().read_stderr();
  const auto lines = std::count(err.begin(), err.end(), '\n');
  EXPECT_GE(lines, 1) << "protobuf's first lines still reach the log";
  // The startup line naming the kernel level, protobuf's burst of 10, the
  // SIGTERM line.
  EXPECT_LE(lines, 12) << err;
  EXPECT_THAT(err, HasSubstr("graphrun: protobuf error: "));
}

// The cancelled call lets go of its handle before the client can see the
// cancellation: the next call on the handle is NOT_FOUND at once, never
// "in use by another call".
TEST_F(ServerHardeningTest, CancelledPartialRunCallLetsGoOfItsHandle) {
  ServerProcess server({});
  ASSERT_FALSE(server.address().empty());
  auto channel = server.channel();
  auto stub = v1::SessionService::NewStub(channel);
  v1::CreateSessionRequest create;
  *create.mutable_graph_def() = slow_partial_graph_def(4000);  // its slow call takes seconds
  v1::CreateSessionResponse created;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->CreateSession(&context, create, &created).ok());
  }
  constexpr int kClients = 8;
  std::vector<grpc::Status> answers(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      v1::PartialRunSetupRequest setup;
      setup.set_session_handle(created.session_handle());
      for (const char* f : {"a", "x"}) setup.add_feed(f);
      for (const char* f : {"a2", "slow"}) setup.add_fetch(f);
      v1::PartialRunSetupResponse handle;
      {
        grpc::ClientContext context;
        answers[c] = stub->PartialRunSetup(&context, setup, &handle);
        if (!answers[c].ok()) return;
      }
      auto call = [&](const char* feed, const Tensor& value, const char* fetch,
                      grpc::ClientContext& context) {
        v1::PartialRunRequest request;
        request.set_session_handle(created.session_handle());
        request.set_partial_run_handle(handle.partial_run_handle());
        v1::NamedTensorProto* f = request.add_feed();
        f->set_name(feed);
        *f->mutable_tensor() = tensor_to_proto(value);
        request.add_fetch(fetch);
        v1::RunResponse response;
        return stub->PartialRun(&context, request, &response);
      };
      {
        grpc::ClientContext context;
        answers[c] = call("a", Tensor(1.0f), "a2", context);
        if (!answers[c].ok()) return;
      }
      {
        grpc::ClientContext context;
        std::thread canceller([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          context.TryCancel();
        });
        const grpc::Status slow =
            call("x", Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f), "slow", context);
        canceller.join();
        if (slow.error_code() != grpc::StatusCode::CANCELLED) {
          answers[c] = grpc::Status(grpc::StatusCode::INTERNAL,
                                    "the slow call was not cancelled: " + slow.error_message());
          return;
        }
      }
      grpc::ClientContext context;
      answers[c] = call("x", Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f), "slow", context);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) {
    EXPECT_EQ(answers[c].error_code(), grpc::StatusCode::NOT_FOUND)
        << "client " << c << ": " << answers[c].error_message();
    EXPECT_THAT(answers[c].error_message(), Not(HasSubstr("in use")));
  }
  expect_still_serving(*channel);
  if (HasFailure()) {
    const auto status = server.child().wait(std::chrono::milliseconds(100));
    ADD_FAILURE() << "server exit status " << (status ? *status : -1) << ", stderr:\n"
                  << server.child().read_stderr();
  }
}

TEST_F(ServerHardeningTest, UnixSocketIsOwnerOnlyByDefault) {
  TempDir dir;
  for (const auto& [flags, mode] : std::vector<std::pair<std::vector<std::string>, unsigned>>{
           {{}, 0600U}, {{"--unix-socket-mode", "0660"}, 0660U}}) {
    const std::string path = dir.path() + "/s" + std::to_string(mode);
    std::vector<std::string> args = {"--listen", "unix:" + path};
    args.insert(args.end(), flags.begin(), flags.end());
    ServerProcess server(args);
    ASSERT_EQ(server.address(), "unix:" + path) << server.child().read_stderr();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, mode);
    expect_still_serving(*server.channel());
  }
}

}  // namespace
}  // namespace graphrun
