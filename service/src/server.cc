#include <arpa/inet.h>
#include <graphrun/server.h>
#include <graphrun/session_service.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <mutex>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "api/src/deadline.h"
#include "service/src/server_metrics.h"

namespace graphrun {
namespace {

using service_internal::MetricsHttpServer;
using service_internal::ServerMetrics;

// Equal strings, in a time that depends on `expected`'s length only (not on
// where `given` first differs).
bool constant_time_equal(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const char g = i < given.size() ? given[i] : '\0';
    diff |= static_cast<unsigned char>(g ^ expected[i]);
  }
  return diff == 0;
}

bool ascii_iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// The SessionService every server registers: the real service behind two
// checks. While the server drains (shutdown() has begun) a new call is
// UNAVAILABLE; with a bearer token, a call without the right one is
// UNAUTHENTICATED (missing and wrong told apart, the token never echoed).
// Otherwise the call goes to the real service. A check at the top of each
// method works on every listener (insecure, TLS, unix), unlike an
// AuthMetadataProcessor, which needs secure credentials.
// Thread safety: thread-safe. Borrows `inner`.
class GuardedService final : public RawSessionService {
 public:
  GuardedService(SessionServiceImpl& inner, std::string token)
      : inner_(inner), token_(std::move(token)) {}

  // New calls are refused from now on.
  void start_draining() {
    draining_.store(true, std::memory_order_release);  // pairs with check()'s acquire
  }

#define GRAPHRUN_GUARDED(Method)                                                                \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* context,                        \
                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) \
      override {                                                                                \
    grpc::Status status = check(*context);                                                      \
    if (!status.ok()) {                                                                         \
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();                            \
      reactor->Finish(status);                                                                  \
      return reactor;                                                                           \
    }                                                                                           \
    return inner_.Method(context, request, response);                                           \
  }
  GRAPHRUN_GUARDED(CreateSession)
  GRAPHRUN_GUARDED(ExtendSession)
  GRAPHRUN_GUARDED(Run)
  GRAPHRUN_GUARDED(PartialRunSetup)
  GRAPHRUN_GUARDED(PartialRun)
  GRAPHRUN_GUARDED(CancelPartialRun)
  GRAPHRUN_GUARDED(CloseSession)
  GRAPHRUN_GUARDED(ListSessions)
#undef GRAPHRUN_GUARDED

 private:
  grpc::Status check(const grpc::CallbackServerContext& context) const {
    if (draining_.load(std::memory_order_acquire)) {  // pairs with start_draining()
      return {grpc::StatusCode::UNAVAILABLE, "the server is shutting down"};
    }
    if (token_.empty()) return grpc::Status::OK;
    const auto& metadata = context.client_metadata();
    const auto found = metadata.find("authorization");
    if (found == metadata.end()) {
      return {grpc::StatusCode::UNAUTHENTICATED,
              "missing bearer token: this server wants the metadata 'authorization: Bearer "
              "<token>'"};
    }
    const std::string_view value(found->second.data(), found->second.size());
    constexpr std::string_view kScheme = "bearer ";
    if (value.size() < kScheme.size() || !ascii_iequal(value.substr(0, kScheme.size()), kScheme)) {
      return {grpc::StatusCode::UNAUTHENTICATED,
              "malformed authorization metadata: expected 'Bearer <token>'"};
    }
    if (!constant_time_equal(value.substr(kScheme.size()), token_)) {
      return {grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token"};
    }
    return grpc::Status::OK;
  }

  SessionServiceImpl& inner_;  // not owned
  const std::string token_;    // empty: no authentication
  std::atomic<bool> draining_{false};
};

// Counts every call into ServerMetrics: in flight from its arrival until
// gRPC destroys the interceptor (the call is over, its status sent), and
// by status code when the status is about to be sent.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(ServerMetrics& metrics, std::string rpc)
      : metrics_(metrics), rpc_(std::move(rpc)), start_(std::chrono::steady_clock::now()) {
    metrics_.call_started(rpc_);
  }
  ~MetricsInterceptor() override { metrics_.call_ended(rpc_); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_.call_answered(rpc_, static_cast<int>(methods->GetSendStatus().error_code()),
                             std::chrono::steady_clock::now() - start_);
    }
    methods->Proceed();
  }

 private:
  ServerMetrics& metrics_;
  const std::string rpc_;
  const std::chrono::steady_clock::time_point start_;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(ServerMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    std::string_view method = info->method() == nullptr ? "" : info->method();
    if (method.empty()) return nullptr;
    if (method.front() == '/') method.remove_prefix(1);
    return new MetricsInterceptor(metrics_, std::string(method));
  }

 private:
  ServerMetrics& metrics_;
};

// After the grace period and the sessions' closing, how long the cancelled
// calls get to answer before gRPC cancels them itself.
constexpr std::chrono::seconds kCancelWait(5);

bool is_unix_address(std::string_view address) {
  return address.starts_with("unix:") || address.starts_with("unix-abstract:");
}

// The host of a gRPC listening address ("host:port", "[v6]:port", with an
// optional "ipv4:"/"ipv6:" scheme).
std::string_view host_of(std::string_view address) {
  for (std::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (address.starts_with(scheme)) address.remove_prefix(scheme.size());
  }
  const std::size_t colon = address.rfind(':');
  return colon == std::string_view::npos ? address : address.substr(0, colon);
}

// A TCP listening address's port: digits in 0..65535 (gRPC itself would
// take "70000" modulo 65536). Unix and vsock addresses have none to check.
Status check_port(std::string_view address) {
  if (is_unix_address(address) || address.starts_with("vsock:")) return Status::ok();
  const std::size_t colon = address.rfind(':');
  // No port ("[::1]" included): gRPC's own error names it.
  if (colon == std::string_view::npos || address.ends_with(']')) return Status::ok();
  const std::string_view port_text = address.substr(colon + 1);
  int port = -1;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() ||
      port < 0 || port > 65535) {
    return invalid_argument("listen address '{}': port '{}' is not a number in 0..65535", address,
                            port_text);
  }
  return Status::ok();
}

Status check_options(const ServerOptions& options) {
  GRAPHRUN_RETURN_IF_ERROR(check_port(options.address));
  if (options.max_message_bytes <= 0) {
    return invalid_argument("max_message_bytes must be positive, got {}",
                            options.max_message_bytes);
  }
  if (options.max_calls_in_flight == 0) {
    return invalid_argument("max_calls_in_flight must be at least 1");
  }
  if ((options.unix_socket_mode & ~0777U) != 0) {
    return invalid_argument("unix_socket_mode {:o} is not a file mode (at most 0777)",
                            options.unix_socket_mode);
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return invalid_argument("TLS needs both a certificate and a private key; got only the {}",
                            options.tls_cert_pem.empty() ? "key" : "certificate");
  }
  if (!options.auth_token.empty()) {
    for (const char c : options.auth_token) {
      if (c < 0x21 || c > 0x7e) {
        return invalid_argument(
            "the bearer token may hold visible ASCII characters only (no spaces or control "
            "characters)");
      }
    }
    const bool tls = !options.tls_cert_pem.empty();
    if (!tls && !is_unix_address(options.address) && !is_loopback_host(host_of(options.address))) {
      return invalid_argument(
          "a bearer token without TLS is only allowed on a unix socket or a loopback address: "
          "on '{}' clients would send it in the clear over the network (add a TLS certificate "
          "and key, or listen on 127.0.0.1 or unix:PATH)",
          options.address);
    }
  }
  return Status::ok();
}

}  // namespace

bool is_loopback_host(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  const std::string text(host);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;  // ::ffff:127.x.x.x
  }
  return false;
}

struct Server::Impl {
  Impl(const ServiceLimits& limits, std::size_t max_calls_in_flight, int max_message_bytes)
      : registry(limits), service(registry, max_calls_in_flight, max_message_bytes) {}

  // Declaration order is destruction order reversed: the HTTP endpoint and
  // the gRPC server (whose interceptors hold `metrics`) go first.
  SessionRegistry registry;
  SessionServiceImpl service;               // borrows registry
  std::unique_ptr<GuardedService> guarded;  // borrows service; the one registered
  ServerMetrics metrics;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<MetricsHttpServer> metrics_http;  // renders metrics and registry
  int port = 0;
  std::string address;
  std::string metrics_address;
  std::once_flag shutdown_once;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { shutdown(); }

Result<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  GRAPHRUN_RETURN_IF_ERROR(check_options(options));
  auto impl = std::make_unique<Impl>(options.limits, options.max_calls_in_flight,
                                     options.max_message_bytes);
  if (!options.metrics_address.empty()) {
    Impl* raw = impl.get();
    GRAPHRUN_ASSIGN_OR_RETURN(impl->metrics_http,
                              MetricsHttpServer::start(options.metrics_address, [raw] {
                                return raw->metrics.render(raw->registry);
                              }));
    impl->metrics_address = impl->metrics_http->address();
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  std::shared_ptr<grpc::ServerCredentials> credentials;
  const bool tls = !options.tls_cert_pem.empty();
  if (tls) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  builder.AddListeningPort(options.address, credentials, &impl->port);
  impl->guarded = std::make_unique<GuardedService>(impl->service, std::move(options.auth_token));
  builder.RegisterService(impl->guarded.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MetricsInterceptorFactory>(impl->metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  const bool is_unix = is_unix_address(options.address);
  const bool unix_file = options.address.starts_with("unix:");
  if (unix_file) {
    // The socket is born without access for others (gRPC binds with the
    // process's umask), then gets its mode; umask is process-wide, so the
    // window is kept to the bind.
    const mode_t old_mask = ::umask(0177);
    impl->server = builder.BuildAndStart();
    ::umask(old_mask);
  } else {
    impl->server = builder.BuildAndStart();
  }
  if (impl->server == nullptr || (!is_unix && impl->port == 0)) {
    if (impl->server != nullptr) impl->server->Shutdown();
    return unavailable("cannot listen on '{}'{}", options.address,
                       tls ? " (or the TLS certificate and key are not a valid PEM pair)" : "");
  }
  if (unix_file) {
    const std::string path = options.address.substr(std::string_view("unix:").size());
    if (::chmod(path.c_str(), static_cast<mode_t>(options.unix_socket_mode)) != 0) {
      const int err = errno;
      impl->server->Shutdown();
      return unavailable("cannot set mode {:o} on the socket '{}': {}", options.unix_socket_mode,
                         path, std::generic_category().message(err));
    }
  }
  if (is_unix) {
    impl->address = options.address;
    impl->port = 0;  // gRPC reports 1 for a unix socket
  } else {
    const std::size_t colon = options.address.rfind(':');
    impl->address = options.address.substr(0, colon) + ":" + std::to_string(impl->port);
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }
const std::string& Server::address() const { return impl_->address; }
const std::string& Server::metrics_address() const { return impl_->metrics_address; }
SessionRegistry& Server::registry() { return impl_->registry; }

std::string Server::metrics_text() const { return impl_->metrics.render(impl_->registry); }

void Server::shutdown(std::chrono::milliseconds grace) {
  std::call_once(impl_->shutdown_once, [&] {
    constexpr std::string_view kSessionService = "graphrun.v1.SessionService/";
    const auto deadline = graphrun::internal::steady_deadline_after(grace);
    // Drain: new SessionService calls are UNAVAILABLE and health answers
    // NOT_SERVING, while the listener and connections stay up, so that
    // probes and watchers see NOT_SERVING during the grace period.
    impl_->guarded->start_draining();
    if (grpc::HealthCheckServiceInterface* health = impl_->server->GetHealthCheckService()) {
      health->Shutdown();
    }
    // Calls in flight get the grace period; past it, closing every session
    // makes their steps return Cancelled, which the calls answer.
    if (!impl_->metrics.wait_until_idle(kSessionService, deadline)) {
      impl_->registry.close_all();
      impl_->metrics.wait_until_idle(kSessionService,
                                     std::chrono::steady_clock::now() + kCancelWait);
    }
    // No SessionService call is left (or one ignores cancellation): stop
    // gRPC at once. Shutdown cancels what remains (health watches,
    // reflection streams), drops idle connections (an idle client may not
    // read a GOAWAY for seconds), and waits for every handler to return.
    impl_->server->Shutdown(std::chrono::system_clock::now());
    impl_->registry.close_all();
    impl_->server->Wait();
    if (impl_->metrics_http) impl_->metrics_http->stop();
  });
}

}  // namespace graphrun
