/// @file graphrun/server.h
/// A gRPC server for the SessionService: the service, its registry, the
/// standard grpc.health.v1 health service, server reflection and, on request,
/// TLS, a bearer token and a Prometheus /metrics endpoint.
///
/// @code
///   GRAPHRUN_ASSIGN_OR_RETURN(auto server, Server::start({}));  // 127.0.0.1, a free port
///   std::cout << server->address();                             // "127.0.0.1:41234"
///   ...
///   server->shutdown(std::chrono::seconds(5));
/// @endcode
///
/// No gRPC type appears here; graphrun/session_service.h has the service for
/// servers built by hand. tools/graphrun-server is the command-line server.
#pragma once

#include <graphrun/session_registry.h>
#include <graphrun/status.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace graphrun {

/// How Server::start() listens and what it allows (graphrun-server's flags).
struct ServerOptions {
  /// "host:port" (port 0: the system picks one), "[::1]:port" or
  /// "unix:path". Loopback by default; listen wider only on purpose, and
  /// then with TLS. A port outside 0..65535 is InvalidArgument.
  std::string address = "127.0.0.1:0";
  /// Largest request and response message, bytes. A larger request fails
  /// with RESOURCE_EXHAUSTED before it reaches the service.
  int max_message_bytes = 64 << 20;
  /// File mode of the socket of a "unix:PATH" address: by default only the
  /// server's user (and root) may connect. 0660 lets the socket's group in
  /// too. ("unix-abstract:" sockets have no file and no permissions: any
  /// process in the network namespace may connect.)
  unsigned unix_socket_mode = 0600;
  /// What the registry allows (sessions, partial runs, bytes, threads, idle
  /// timeouts).
  ServiceLimits limits;
  /// Run and PartialRun calls in flight at once (queued for the sessions'
  /// pools or running); past it a call is RESOURCE_EXHAUSTED naming the
  /// limit (SessionServiceImpl's max_calls_in_flight). No thread is held
  /// per call, so this bounds queued work, not threads. At least 1.
  std::size_t max_calls_in_flight = 4096;

  ///@{
  /// TLS: the server's certificate chain and private key, PEM *contents*
  /// (not paths; graphrun-server reads its --tls-cert/--tls-key files). Both
  /// or neither; neither means plaintext (insecure credentials).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  ///@}

  /// Bearer token: when not empty, every SessionService call must carry the
  /// metadata "authorization: Bearer <token>" or fails with UNAUTHENTICATED
  /// (missing and wrong tokens are told apart; the token is never echoed).
  /// Compared in constant time. Health checks and reflection stay
  /// unauthenticated. Visible ASCII only. Without TLS the address must be a
  /// unix socket or loopback: start() refuses to send tokens in the clear.
  std::string auth_token;

  /// Prometheus text format over HTTP at `http://<metrics_address>/metrics`,
  /// e.g. "127.0.0.1:9464" (port 0: a free port). Loopback only
  /// ("127.x.x.x", "localhost", "[::1]"). Empty: no endpoint.
  std::string metrics_address;
};

/// A running server. SO_REUSEPORT is off (GRPC_ARG_ALLOW_REUSEPORT = 0), so
/// two servers never share a port silently.
///
/// Thread safety: thread-safe. The server owns its registry, its metrics and
/// the metrics endpoint's thread; destroying the server shuts it down (no
/// grace period) and closes every session.
class Server {
 public:
  /// Starts listening on options.address (and options.metrics_address).
  /// InvalidArgument for inconsistent options (half a TLS pair, a token in
  /// the clear on a non-loopback address, a non-loopback metrics address, a
  /// port outside 0..65535);
  /// Unavailable when an address cannot be bound.
  static Result<std::unique_ptr<Server>> start(ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The port listened on (the chosen one for port 0); 0 for a unix socket.
  int port() const;
  /// The address with the real port, e.g. "127.0.0.1:41234", for clients.
  const std::string& address() const;
  /// The metrics endpoint's "host:port" with the real port; empty when off.
  const std::string& metrics_address() const;
  /// The server's sessions.
  SessionRegistry& registry();

  /// The metrics in Prometheus text exposition format (what GET /metrics
  /// answers), also when the HTTP endpoint is off.
  std::string metrics_text() const;

  /// Graceful shutdown. At once: health answers NOT_SERVING (Check and
  /// Watch) and new SessionService calls fail with UNAVAILABLE ("the server
  /// is shutting down"); the listener stays open so probes can see it. Calls
  /// in flight may finish until `grace` has passed; then every session is
  /// closed, so their steps stop and the calls answer CANCELLED (within 5 s).
  /// Then gRPC stops (remaining streams are cancelled, connections dropped),
  /// every session is closed and the metrics endpoint stops. Returns as soon
  /// as no call is left, without waiting out the grace period. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// True when `host` is a loopback address: "localhost", 127.0.0.0/8 or ::1
/// (brackets optional). Thread-safe.
bool is_loopback_host(std::string_view host);

}  // namespace graphrun
