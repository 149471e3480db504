// Server (graphrun/server.h) and the graphrun-server binary: health,
// reflection, message limits, TLS, bearer tokens, metrics over HTTP,
// shutdown with a grace period, and the real binary driven as a child
// process (its path comes from CMake as GRAPHRUN_SERVER_BINARY).
#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/unknown_field_set.h>
#include <graphrun/graph_def.h>
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>
#include <graphrun/server.h>
#include <graphrun/session_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/service/server_process.h"
#include "tests/service/slow_graph.h"
#include "tests/testing/op_harness.h"

extern char** environ;

namespace graphrun {
namespace {

using ::graphrun::testing::await;
using ::graphrun::testing::byte_buffer;
using ::graphrun::testing::Child;
using ::graphrun::testing::kServerBinary;
using ::graphrun::testing::slice_bytes;
using ::graphrun::testing::slow_graph_def;
using ::graphrun::testing::TempDir;

using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// --- helpers --------------------------------------------------------------

// grpc.health.v1.Health/Check with the empty service name, as raw bytes
// (Debian ships no generated health stubs for C++). HealthCheckResponse's
// status is field 1: SERVING is the bytes 08 01, NOT_SERVING 08 02.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

grpc::Status health_check(grpc::Channel& channel, std::string* response_bytes) {
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer response;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, method, &context, byte_buffer(""), &response);
  *response_bytes = status.ok() ? slice_bytes(response) : "";
  return status;
}

// A graph with one constant; `Run` fetching "one" answers 1.0.
v1::GraphDef tiny_graph_def() {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  return graph_to_graph_def(g).value();
}

grpc::Status create_session(v1::SessionService::Stub& stub, const v1::GraphDef& graph,
                            std::string* handle, const std::string& token = "") {
  v1::CreateSessionRequest request;
  *request.mutable_graph_def() = graph;
  v1::CreateSessionResponse response;
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  const grpc::Status status = stub.CreateSession(&context, request, &response);
  *handle = response.session_handle();
  return status;
}

grpc::Status run_fetch(v1::SessionService::Stub& stub, const std::string& handle,
                       const std::string& fetch, v1::RunResponse* response) {
  v1::RunRequest request;
  request.set_session_handle(handle);
  request.add_fetch(fetch);
  grpc::ClientContext context;
  return stub.Run(&context, request, response);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Sends `request` to 127.0.0.1:`port`, closes the sending side, and
// returns the whole response, or "" when the connection fails.
std::string http_request(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      ::shutdown(fd, SHUT_WR);
      char buffer[4096];
      ssize_t n = 0;
      while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) {
        response.append(buffer, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(fd);
  return response;
}

// GET `path` over HTTP/1.0.
std::string http_get(int port, const std::string& path) {
  return http_request(port, "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n");
}

int port_of(const std::string& host_port) {
  return std::stoi(host_port.substr(host_port.rfind(':') + 1));
}

// The value of the sample line `name` (with its labels, exactly as
// rendered), or nullopt when the exposition has no such line.
std::optional<std::string> sample(const std::string& exposition, const std::string& name) {
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(name + " ")) return line.substr(name.size() + 1);
  }
  return std::nullopt;
}

std::string requests(const std::string& rpc, const std::string& code) {
  return "graphrun_rpc_requests_total{rpc=\"graphrun.v1.SessionService/" + rpc + "\",code=\"" +
         code + "\"}";
}

// --- Server basics (moved from session_service_test.cc) -------------------

TEST(ServerTest, HealthReusePortAndShutdown) {
  auto server = Server::start().value();
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  EXPECT_TRUE(server->registry().list().empty());
  EXPECT_EQ(server->metrics_address(), "");
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  std::string health;
  const grpc::Status status = health_check(*channel, &health);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(health, kServing);
  // Two servers never share a port (GRPC_ARG_ALLOW_REUSEPORT is off).
  ServerOptions same;
  same.address = server->address();
  EXPECT_THAT(Server::start(same).status(), StatusIs(StatusCode::kUnavailable, server->address()));
  server->shutdown(std::chrono::milliseconds(100));
  server->shutdown();  // idempotent
  EXPECT_FALSE(health_check(*channel, &health).ok());
}

TEST(ServerTest, RequestOverTheMessageLimitIsResourceExhausted) {
  ServerOptions options;
  options.max_message_bytes = 1024;
  auto server = Server::start(options).value();
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  v1::RunRequest request;
  request.set_session_handle("s-any");
  v1::NamedTensorProto* feed = request.add_feed();
  feed->set_name("x");
  *feed->mutable_tensor() = tensor_to_proto(Tensor::filled(Shape{512}, 1.0f));  // 2 KiB
  v1::RunResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Run(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

// grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, a bidi
// stream, with hand-encoded bytes: ServerReflectionRequest{list_services:
// ""} is field 7 (tag 0x3a) of length 0; the answer's list_services_response
// is field 6, its services field 1, each service's name field 1.
TEST(ServerTest, ReflectionListsTheService) {
  auto server = Server::start().value();
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  ASSERT_TRUE(stream->Write(byte_buffer(std::string("\x3a\x00", 2))));
  ASSERT_TRUE(stream->WritesDone());
  grpc::ByteBuffer response;
  ASSERT_TRUE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();

  google::protobuf::UnknownFieldSet fields;
  ASSERT_TRUE(fields.ParseFromString(slice_bytes(response)));
  std::vector<std::string> services;
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(fields.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      ASSERT_EQ(service.field_count(), 1);
      services.push_back(service.field(0).length_delimited());
    }
  }
  EXPECT_THAT(services, ::testing::Contains("graphrun.v1.SessionService"));
  EXPECT_THAT(services, ::testing::Contains("grpc.reflection.v1alpha.ServerReflection"));
}

// grpc.health.v1.Health/Watch (server streaming): the next status, or ""
// when the stream ended.
std::string next_health(grpc::ClientReader<grpc::ByteBuffer>& watch) {
  grpc::ByteBuffer message;
  return watch.Read(&message) ? slice_bytes(message) : "";
}

// Shutdown with a step in flight. During the grace period health answers
// NOT_SERVING, both to a Watch opened before and to a new Check, and a new
// SessionService call is UNAVAILABLE; the step in flight keeps running. After
// the grace period the step is cancelled (its call answers CANCELLED) and
// shutdown returns.
TEST(ServerTest, ShutdownGracePeriodHealthAndCancel) {
  auto server = Server::start().value();
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::SessionService::NewStub(channel);
  std::string handle;
  // Long enough to outlast the grace period in an optimised build.
  ASSERT_TRUE(create_session(*stub, slow_graph_def(8000), &handle).ok());

  const grpc::internal::RpcMethod watch_method("/grpc.health.v1.Health/Watch",
                                               grpc::internal::RpcMethod::SERVER_STREAMING);
  grpc::ClientContext watch_context;
  watch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> watch(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel.get(), watch_method, &watch_context, byte_buffer("")));
  ASSERT_EQ(next_health(*watch), kServing);

  grpc::Status run_status;
  std::thread runner([&] {
    v1::RunResponse response;
    run_status = run_fetch(*stub, handle, "slow", &response);
  });
  // The step is in flight once the server counts the Run call.
  const std::string in_flight = "graphrun_rpcs_in_flight{rpc=\"graphrun.v1.SessionService/Run\"}";
  ASSERT_TRUE(await([&] { return sample(server->metrics_text(), in_flight) == "1"; }));

  constexpr auto kGrace = std::chrono::seconds(2);
  std::atomic<bool> shut_down{false};
  const auto shutdown_start = Clock::now();
  std::thread stopper([&] {
    server->shutdown(kGrace);
    shut_down = true;
  });
  EXPECT_EQ(next_health(*watch), kNotServing);
  std::string health;
  const grpc::Status check = health_check(*channel, &health);
  EXPECT_TRUE(check.ok()) << check.error_message();
  EXPECT_EQ(health, kNotServing);
  v1::RunResponse refused_response;
  const grpc::Status refused = run_fetch(*stub, handle, "slow", &refused_response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message(), "the server is shutting down");
  EXPECT_FALSE(shut_down) << "the grace period was over before the checks";
  // The step still runs (once the refused call is over, one Run is left).
  EXPECT_TRUE(await([&] { return sample(server->metrics_text(), in_flight) == "1"; },
                    std::chrono::seconds(2)));

  stopper.join();
  runner.join();
  const auto took = Clock::now() - shutdown_start;
  EXPECT_GE(took, kGrace - std::chrono::milliseconds(50));  // the step got its grace period
  EXPECT_LT(took, kGrace + std::chrono::seconds(10));       // and was cancelled after it
  EXPECT_EQ(run_status.error_code(), grpc::StatusCode::CANCELLED) << run_status.error_message();
  EXPECT_EQ(server->registry().size(), 0u);
  EXPECT_EQ(next_health(*watch), "");  // gRPC ended the watch
}

// Shutdown does not wait out the grace period when no call is in flight,
// even with a client connected (an idle client may not read gRPC's GOAWAY
// for seconds).
TEST(ServerTest, ShutdownWithoutCallsIsImmediate) {
  auto server = Server::start().value();
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  std::string handle;
  ASSERT_TRUE(create_session(*stub, tiny_graph_def(), &handle).ok());
  const auto start = Clock::now();
  server->shutdown(std::chrono::seconds(60));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(server->registry().size(), 0u);
}

// --- options ---------------------------------------------------------------

TEST(ServerOptionsTest, LoopbackHosts) {
  for (const char* host :
       {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(is_loopback_host(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "", "10.0.0.1", "::", "[::]", "example.com", "128.0.0.1",
                           "localhost.example.com"}) {
    EXPECT_FALSE(is_loopback_host(host)) << host;
  }
}

TEST(ServerOptionsTest, TokenWithoutTlsOnlyOnLoopbackOrUnix) {
  ServerOptions options;
  options.auth_token = "secret";
  for (const char* address : {"0.0.0.0:0", "[::]:0", ":0", "ipv4:0.0.0.0:0"}) {
    options.address = address;
    EXPECT_THAT(Server::start(options).status(),
                StatusIs(StatusCode::kInvalidArgument, "a bearer token without TLS"))
        << address;
  }
  options.address = "127.0.0.1:0";
  EXPECT_TRUE(Server::start(options).is_ok());
  TempDir dir;
  options.address = "unix:" + dir.path() + "/graphrun.sock";
  EXPECT_TRUE(Server::start(options).is_ok());
}

TEST(ServerOptionsTest, InconsistentOptionsAreInvalidArgument) {
  ServerOptions half_tls;
  half_tls.tls_cert_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_THAT(Server::start(half_tls).status(),
              StatusIs(StatusCode::kInvalidArgument, "got only the certificate"));
  ServerOptions bad_token;
  bad_token.auth_token = "two words";
  EXPECT_THAT(Server::start(bad_token).status(),
              StatusIs(StatusCode::kInvalidArgument, "visible ASCII"));
  ServerOptions wide_metrics;
  wide_metrics.metrics_address = "0.0.0.0:0";
  EXPECT_THAT(Server::start(wide_metrics).status(),
              StatusIs(StatusCode::kInvalidArgument, "is not loopback"));
  ServerOptions bad_port;
  bad_port.metrics_address = "127.0.0.1:http";
  EXPECT_THAT(Server::start(bad_port).status(),
              StatusIs(StatusCode::kInvalidArgument, "port 'http'"));
  // gRPC alone would listen on 70000 modulo 65536 (4464).
  for (const char* address : {"127.0.0.1:70000", "[::1]:65536", "ipv4:127.0.0.1:99999"}) {
    ServerOptions wrapping_port;
    wrapping_port.address = address;
    EXPECT_THAT(Server::start(wrapping_port).status(),
                StatusIs(StatusCode::kInvalidArgument, "is not a number in 0..65535"))
        << address;
  }
}

// --- bearer token ------------------------------------------------------------

class ServerAuthTest : public ::testing::Test {
 protected:
  static constexpr const char* kToken = "s3cret-t0ken";

  void SetUp() override {
    ServerOptions options;
    options.auth_token = kToken;
    server_ = Server::start(options).value();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::SessionService::NewStub(channel_);
  }

  grpc::Status list_sessions(const std::optional<std::string>& authorization) {
    grpc::ClientContext context;
    if (authorization) context.AddMetadata("authorization", *authorization);
    v1::ListSessionsResponse response;
    return stub_->ListSessions(&context, {}, &response);
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SessionService::Stub> stub_;
};

TEST_F(ServerAuthTest, MissingTokenIsUnauthenticated) {
  const grpc::Status status = list_sessions(std::nullopt);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), StartsWith("missing bearer token"));
  // CreateSession is refused before it creates anything.
  std::string handle;
  EXPECT_EQ(create_session(*stub_, tiny_graph_def(), &handle).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server_->registry().size(), 0u);
}

TEST_F(ServerAuthTest, WrongTokenIsUnauthenticatedAndNotEchoed) {
  for (const std::string wrong : {"s3cret-t0kem", "s3cret-t0ken2", "s3cret", "guess-1234"}) {
    const grpc::Status status = list_sessions("Bearer " + wrong);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong;
    EXPECT_EQ(status.error_message(), "wrong bearer token");
  }
  const grpc::Status basic = list_sessions(std::string("Basic ") + kToken);
  EXPECT_EQ(basic.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(basic.error_message(), StartsWith("malformed authorization"));
  EXPECT_THAT(basic.error_message(), Not(HasSubstr(kToken)));
}

TEST_F(ServerAuthTest, RightTokenIsOkAndHealthNeedsNone) {
  EXPECT_TRUE(list_sessions(std::string("Bearer ") + kToken).ok());
  EXPECT_TRUE(list_sessions(std::string("bearer ") + kToken).ok());  // the scheme ignores case
  std::string handle;
  ASSERT_TRUE(create_session(*stub_, tiny_graph_def(), &handle, kToken).ok());
  v1::RunRequest request;
  request.set_session_handle(handle);
  request.add_fetch("one");
  grpc::ClientContext context;
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  v1::RunResponse response;
  ASSERT_TRUE(stub_->Run(&context, request, &response).ok());
  EXPECT_THAT(tensor_from_proto(response.tensor(0).tensor()).value(), TensorEq(Tensor(1.0f)));
  std::string health;
  EXPECT_TRUE(health_check(*channel_, &health).ok());
  EXPECT_EQ(health, kServing);
}

TEST(ServerAuthUnixTest, TokenOverUnixSocket) {
  TempDir dir;
  ServerOptions options;
  options.address = "unix:" + dir.path() + "/graphrun.sock";
  options.auth_token = "unix-token";
  auto server = Server::start(options).value();
  EXPECT_EQ(server->address(), options.address);
  EXPECT_EQ(server->port(), 0);
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  std::string handle;
  EXPECT_EQ(create_session(*stub, tiny_graph_def(), &handle).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(create_session(*stub, tiny_graph_def(), &handle, "unix-token").ok());
}

// --- TLS ---------------------------------------------------------------------

// A self-signed certificate for 127.0.0.1 and localhost, made by openssl
// (GRAPHRUN_OPENSSL, found by CMake) in `dir`. False when openssl is
// missing or fails.
bool make_certificate(const std::string& dir, std::string* cert, std::string* key) {
#ifdef GRAPHRUN_OPENSSL
  const std::string command = std::string("'") + GRAPHRUN_OPENSSL +
                              "' req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                              "-nodes -days 2 -subj /CN=localhost -addext "
                              "subjectAltName=IP:127.0.0.1,DNS:localhost -keyout '" +
                              dir + "/key.pem' -out '" + dir + "/cert.pem' 2>/dev/null";
  if (std::system(command.c_str()) != 0) return false;
  *cert = read_file(dir + "/cert.pem");
  *key = read_file(dir + "/key.pem");
  return !cert->empty() && !key->empty();
#else
  (void)dir, (void)cert, (void)key;
  return false;
#endif
}

TEST(ServerTlsTest, RoundTripWithTokenAsCallCredentials) {
  TempDir dir;
  std::string cert;
  std::string key;
  if (!make_certificate(dir.path(), &cert, &key)) GTEST_SKIP() << "openssl is not available";
  ServerOptions options;
  options.address = "127.0.0.1:0";
  options.tls_cert_pem = cert;
  options.tls_key_pem = key;
  options.auth_token = "tls-token";
  auto server = Server::start(options).value();

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = cert;
  // gRPC's standard access-token call credentials send "authorization:
  // Bearer <token>", which the server accepts.
  auto tls_stub = v1::SessionService::NewStub(grpc::CreateChannel(
      server->address(),
      grpc::CompositeChannelCredentials(grpc::SslCredentials(ssl),
                                        grpc::AccessTokenCredentials("tls-token"))));
  std::string handle;
  const grpc::Status created = create_session(*tls_stub, tiny_graph_def(), &handle);
  ASSERT_TRUE(created.ok()) << created.error_message();
  v1::RunResponse response;
  ASSERT_TRUE(run_fetch(*tls_stub, handle, "one", &response).ok());
  EXPECT_THAT(tensor_from_proto(response.tensor(0).tensor()).value(), TensorEq(Tensor(1.0f)));

  // TLS without the token: UNAUTHENTICATED; plaintext: no connection.
  auto no_token = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::SslCredentials(ssl)));
  EXPECT_EQ(run_fetch(*no_token, handle, "one", &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto plaintext = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(run_fetch(*plaintext, handle, "one", &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // With TLS a token may be used on any address.
  options.address = "0.0.0.0:0";
  EXPECT_TRUE(Server::start(options).is_ok());
}

TEST(ServerTlsTest, GarbageCertificateIsRefusedAtStart) {
  ServerOptions options;
  options.tls_cert_pem = "not a certificate";
  options.tls_key_pem = "not a key";
  EXPECT_THAT(Server::start(options).status(),
              StatusIs(StatusCode::kUnavailable, "not a valid PEM pair"));
}

// --- metrics -------------------------------------------------------------------

TEST(ServerMetricsTest, ScrapeCountsRequestsByRpcAndCode) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto server = Server::start(options).value();
  ASSERT_THAT(server->metrics_address(), StartsWith("127.0.0.1:"));
  const int metrics_port = port_of(server->metrics_address());
  ASSERT_GT(metrics_port, 0);
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));

  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  ops::Mul(g, x, ops::Const(g, Tensor(2.0f)), "y");
  ops::Const(g, Tensor(1.0f), "one");
  std::string handle;
  ASSERT_TRUE(create_session(*stub, graph_to_graph_def(g).value(), &handle).ok());
  v1::RunResponse response;
  ASSERT_TRUE(run_fetch(*stub, handle, "one", &response).ok());
  ASSERT_TRUE(run_fetch(*stub, handle, "one", &response).ok());
  ASSERT_EQ(run_fetch(*stub, handle, "nosuch", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(run_fetch(*stub, "s-unknown", "one", &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(handle);
  setup.add_feed("x");
  setup.add_fetch("y");
  v1::PartialRunSetupResponse setup_response;
  grpc::ClientContext setup_context;
  ASSERT_TRUE(stub->PartialRunSetup(&setup_context, setup, &setup_response).ok());

  // A call is in flight until gRPC is done with it, a moment after the
  // client has its answer.
  const std::string in_flight = "graphrun_rpcs_in_flight{rpc=\"graphrun.v1.SessionService/Run\"}";
  EXPECT_TRUE(await([&] { return sample(server->metrics_text(), in_flight) == "0"; }));
  const std::string http = http_get(metrics_port, "/metrics");
  ASSERT_THAT(http, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(http, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  const std::string body = http.substr(http.find("\r\n\r\n") + 4);
  EXPECT_EQ(sample(body, requests("CreateSession", "OK")), "1");
  EXPECT_EQ(sample(body, requests("Run", "OK")), "2");
  EXPECT_EQ(sample(body, requests("Run", "NOT_FOUND")), "2");
  EXPECT_EQ(sample(body, requests("PartialRunSetup", "OK")), "1");
  EXPECT_EQ(sample(body, requests("Run", "INVALID_ARGUMENT")), std::nullopt);
  EXPECT_EQ(sample(body,
                   "graphrun_step_duration_seconds_count{rpc=\"graphrun.v1.SessionService/"
                   "Run\"}"),
            "4");
  EXPECT_EQ(sample(body,
                   "graphrun_step_duration_seconds_bucket{rpc=\"graphrun.v1.SessionService/"
                   "Run\",le=\"+Inf\"}"),
            "4");
  EXPECT_EQ(sample(body, "graphrun_open_sessions"), "1");
  EXPECT_EQ(sample(body, "graphrun_open_partial_runs"), "1");
  EXPECT_THAT(body, HasSubstr("# TYPE graphrun_rpc_requests_total counter\n"));
  EXPECT_THAT(body, HasSubstr("# TYPE graphrun_step_duration_seconds histogram\n"));

  // Closing the session shows in the gauges; other paths are 404.
  v1::CloseSessionRequest close;
  close.set_session_handle(handle);
  v1::CloseSessionResponse closed;
  grpc::ClientContext close_context;
  ASSERT_TRUE(stub->CloseSession(&close_context, close, &closed).ok());
  const std::string after = http_get(metrics_port, "/metrics");
  EXPECT_EQ(sample(after, "graphrun_open_sessions"), "0");
  EXPECT_EQ(sample(after, "graphrun_open_partial_runs"), "0");
  EXPECT_EQ(sample(after, requests("CloseSession", "OK")), "1");
  EXPECT_THAT(http_get(metrics_port, "/"), StartsWith("HTTP/1.0 404 Not Found\r\n"));
  // Another method is 405; what is no HTTP/1 request line at all (junk, a
  // TLS hello, an HTTP/2 preface, nothing) is 400 or 505, not 405.
  EXPECT_THAT(http_request(metrics_port, "POST /metrics HTTP/1.0\r\n\r\n"),
              StartsWith("HTTP/1.0 405 Method Not Allowed\r\n"));
  for (const std::string& junk : {std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),
                                  std::string("hello\r\n\r\n"), std::string("GET\r\n\r\n"),
                                  std::string("get /metrics HTTP/1.0\r\n\r\n"), std::string()}) {
    EXPECT_THAT(http_request(metrics_port, junk), StartsWith("HTTP/1.0 400 Bad Request\r\n"))
        << junk;
  }
  EXPECT_THAT(http_request(metrics_port, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
              StartsWith("HTTP/1.0 505 HTTP Version Not Supported\r\n"));

  server->shutdown();
  EXPECT_EQ(http_get(metrics_port, "/metrics"), "");  // the endpoint stops with the server
}

TEST(ServerMetricsTest, UnauthenticatedCallsAreCounted) {
  ServerOptions options;
  options.auth_token = "t";
  auto server = Server::start(options).value();
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::ListSessionsResponse response;
  ASSERT_EQ(stub->ListSessions(&context, {}, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(sample(server->metrics_text(), requests("ListSessions", "UNAUTHENTICATED")), "1");
}

// --- the graphrun-server binary ------------------------------------------------

TEST(GraphrunServerBinaryTest, ServesThenExitsZeroOnSigterm) {
  if (kServerBinary == nullptr) GTEST_SKIP() << "graphrun-server is not built (tools off)";
  Child child({kServerBinary, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--grace-period", "30s", "--max-sessions", "3"});
  ASSERT_TRUE(child.started());
  const std::optional<std::string> listening = child.read_line(std::chrono::seconds(30));
  ASSERT_TRUE(listening.has_value()) << child.read_stderr();
  const std::string prefix = "graphrun-server listening on ";
  ASSERT_THAT(*listening, StartsWith(prefix + "127.0.0.1:"));
  const std::string address = listening->substr(prefix.size());
  EXPECT_GT(port_of(address), 0);
  const std::optional<std::string> metrics = child.read_line(std::chrono::seconds(30));
  ASSERT_TRUE(metrics.has_value());
  ASSERT_THAT(*metrics, StartsWith("graphrun-server metrics on http://127.0.0.1:"));
  const std::string url = metrics->substr(metrics->find("http://") + 7);
  const int metrics_port = port_of(url.substr(0, url.find('/')));

  auto stub =
      v1::SessionService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::string handle;
  const grpc::Status created = create_session(*stub, tiny_graph_def(), &handle);
  ASSERT_TRUE(created.ok()) << created.error_message();
  v1::RunResponse response;
  ASSERT_TRUE(run_fetch(*stub, handle, "one", &response).ok());
  EXPECT_THAT(tensor_from_proto(response.tensor(0).tensor()).value(), TensorEq(Tensor(1.0f)));
  EXPECT_EQ(sample(http_get(metrics_port, "/metrics"), requests("Run", "OK")), "1");
  // The limit flag reached the server: a fourth session is refused.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(create_session(*stub, tiny_graph_def(), &handle).ok());
  const grpc::Status fourth = create_session(*stub, tiny_graph_def(), &handle);
  EXPECT_EQ(fourth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(fourth.error_message(), HasSubstr("max_sessions = 3"));

  const auto sigterm = Clock::now();
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  const std::optional<int> status = child.wait(std::chrono::seconds(10));
  // No call is in flight: no waiting out the 30 s grace period.
  EXPECT_LT(Clock::now() - sigterm, std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value()) << "no exit within 10 s of SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  EXPECT_EQ(child.rest_of_stdout(), "");  // exactly the two ready lines
  EXPECT_FALSE(run_fetch(*stub, handle, "one", &response).ok());
}

TEST(GraphrunServerBinaryTest, BadFlagsAreOneLineOnStderr) {
  if (kServerBinary == nullptr) GTEST_SKIP() << "graphrun-server is not built (tools off)";
  TempDir dir;
  const std::string token = dir.path() + "/token";
  std::ofstream(token) << "tok\n";
  const std::string empty_token = dir.path() + "/empty";
  std::ofstream(empty_token) << "\n";
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string big_token = dir.path() + "/big";
  std::ofstream(big_token) << std::string((64 << 10) + 1, 't');
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"--max-sessions", "0"}, "--max-sessions: expected a positive integer, got '0'"},
      {{"--max-calls-in-flight", "0"},
       "--max-calls-in-flight: expected a positive integer, got '0'"},
      {{"--grace-period", "soon"}, "--grace-period 'soon'"},
      {{"--tls-cert", token}, "--tls-cert and --tls-key go together"},
      {{"--token-file", dir.path() + "/missing"}, "--token-file: cannot read"},
      {{"--token-file", empty_token}, "holds no token"},
      {{"--listen", "0.0.0.0:0", "--token-file", token}, "a bearer token without TLS"},
      {{"--metrics-listen", "0.0.0.0:9464"}, "is not loopback"},
      // A port past 65535 is refused (gRPC alone took it modulo 65536).
      {{"--listen", "127.0.0.1:70000"}, "port '70000' is not a number in 0..65535"},
      {{"--listen", "127.0.0.1:-1"}, "port '-1' is not a number in 0..65535"},
      // A token file that is not a regular file, or too large, is refused
      // before it is read (/dev/zero was read without end, a FIFO blocked).
      {{"--token-file", "/dev/zero"}, "'/dev/zero' is a character device, not a regular file"},
      {{"--token-file", fifo}, "is a pipe, not a regular file"},
      {{"--token-file", dir.path()}, "is a directory, not a regular file"},
      {{"--token-file", big_token}, "a token file may have at most 65536"},
      // Only an MPI worker's session takes it (it was once ignored).
      {{"--worker-threads", "1"}, "--worker-threads requires --mpi-worker"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {kServerBinary};
    args.insert(args.end(), flags.begin(), flags.end());
    Child child(args);
    ASSERT_TRUE(child.started());
    const std::optional<int> status = child.wait(std::chrono::seconds(30));
    ASSERT_TRUE(status.has_value()) << flags[0];
    ASSERT_TRUE(WIFEXITED(*status)) << flags[0];
    EXPECT_EQ(WEXITSTATUS(*status), 2) << flags[0];
    const std::string err = child.read_stderr();
    EXPECT_THAT(err, StartsWith("graphrun-server: ")) << flags[0];
    EXPECT_THAT(err, HasSubstr(message));
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_THAT(err, ::testing::EndsWith("\n"));
    EXPECT_EQ(child.rest_of_stdout(), "") << flags[0];
  }
}

// `--version`: the version and the level the kernels run at (this process's
// environment, GRAPHRUN_CPU_ISA included, is the child's).
TEST(GraphrunServerBinaryTest, VersionNamesTheKernelLevel) {
  if (kServerBinary == nullptr) GTEST_SKIP() << "graphrun-server is not built (tools off)";
  if (!cpu_isa_status().is_ok()) GTEST_SKIP() << cpu_isa_status().to_string();
  Child child({kServerBinary, "--version"});
  ASSERT_TRUE(child.started());
  const std::optional<int> status = child.wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  const std::string out = child.rest_of_stdout();
  EXPECT_THAT(out, StartsWith(std::string("graphrun-server ") + GRAPHRUN_PROJECT_VERSION +
                              "\nkernels: " + std::string(cpu_isa_name(cpu_isa())) + " ("));
  EXPECT_THAT(out, HasSubstr(std::string("this CPU supports up to ") +
                             std::string(cpu_isa_name(cpu_isa_supported())) + ")\n"));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_EQ(child.read_stderr(), "");
}

// The startup log line (stderr, after the ready lines on stdout) names the
// level; stdout stays exactly the ready lines.
TEST(GraphrunServerBinaryTest, StartupLogNamesTheKernelLevel) {
  if (kServerBinary == nullptr) GTEST_SKIP() << "graphrun-server is not built (tools off)";
  if (!cpu_isa_status().is_ok()) GTEST_SKIP() << cpu_isa_status().to_string();
  testing::ServerProcess server({});
  ASSERT_FALSE(server.address().empty()) << server.child().read_stderr();
  ASSERT_EQ(::kill(server.child().pid(), SIGTERM), 0);
  ASSERT_TRUE(server.child().wait(std::chrono::seconds(30)).has_value());
  EXPECT_EQ(server.child().rest_of_stdout(), "");
  EXPECT_THAT(server.child().read_stderr(),
              StartsWith(std::string("graphrun-server: kernels: ") +
                         std::string(cpu_isa_name(cpu_isa())) + " ("));
}

}  // namespace
}  // namespace graphrun
