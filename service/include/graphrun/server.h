// File: graphrun/server.h
// A gRPC server for the SessionService: the service, its registry, the
// standard grpc.health.v1 health service and server reflection.
//
//   GRAPHRUN_ASSIGN_OR_RETURN(auto server, Server::start({}));  // 127.0.0.1, a free port
//   std::cout << server->address();                             // "127.0.0.1:41234"
//   ...
//   server->shutdown(std::chrono::seconds(5));
//
// No gRPC type appears here; graphrun/session_service.h has the service for
// servers built by hand.
#pragma once

#include <graphrun/session_registry.h>
#include <graphrun/status.h>

#include <chrono>
#include <memory>
#include <string>

namespace graphrun {

struct ServerOptions {
  // "host:port" (port 0: the system picks one), "[::1]:port" or
  // "unix:path". Loopback by default; listen wider only on purpose (there is
  // no authentication yet).
  std::string address = "127.0.0.1:0";
  // Largest request and response message, bytes. A larger request fails
  // with RESOURCE_EXHAUSTED before it reaches the service.
  int max_message_bytes = 64 << 20;
  ServiceLimits limits;
};

// A running server. SO_REUSEPORT is off (GRPC_ARG_ALLOW_REUSEPORT = 0), so
// two servers never share a port silently.
// Thread safety: thread-safe. The server owns its registry; destroying the
// server shuts it down (no grace period) and closes every session.
class Server {
 public:
  // Starts listening on options.address. Unavailable when the address
  // cannot be bound.
  static Result<std::unique_ptr<Server>> start(ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port listened on (the chosen one for port 0); 0 for a unix socket.
  int port() const;
  // The address with the real port, e.g. "127.0.0.1:41234", for clients.
  const std::string& address() const;
  SessionRegistry& registry();

  // Stops accepting calls, lets calls in flight finish until `grace` has
  // passed, then cancels them, and closes every session. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace graphrun
