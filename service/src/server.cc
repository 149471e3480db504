#include <graphrun/server.h>
#include <graphrun/session_service.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <condition_variable>
#include <mutex>
#include <string_view>
#include <thread>

namespace graphrun {

struct Server::Impl {
  explicit Impl(const ServiceLimits& limits) : registry(limits), service(registry) {}

  SessionRegistry registry;
  SessionServiceImpl service;  // borrows registry
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;
  std::once_flag shutdown_once;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { shutdown(); }

Result<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  if (options.max_message_bytes <= 0) {
    return invalid_argument("max_message_bytes must be positive, got {}",
                            options.max_message_bytes);
  }
  auto impl = std::make_unique<Impl>(options.limits);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &impl->port);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  const bool is_unix = std::string_view(options.address).starts_with("unix:");
  if (impl->server == nullptr || (!is_unix && impl->port == 0)) {
    return unavailable("cannot listen on '{}'", options.address);
  }
  if (is_unix) {
    impl->address = options.address;
  } else {
    const std::size_t colon = options.address.rfind(':');
    impl->address = options.address.substr(0, colon) + ":" + std::to_string(impl->port);
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }
const std::string& Server::address() const { return impl_->address; }
SessionRegistry& Server::registry() { return impl_->registry; }

void Server::shutdown(std::chrono::milliseconds grace) {
  std::call_once(impl_->shutdown_once, [&] {
    if (grpc::HealthCheckServiceInterface* health = impl_->server->GetHealthCheckService()) {
      health->Shutdown();  // NOT_SERVING from now on
    }
    // Shutdown waits for the handlers in flight, and a handler runs its step
    // on the callback thread: past the grace period, closing every session
    // cancels those steps so that Shutdown can return.
    const auto deadline = std::chrono::system_clock::now() + grace;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread closer([&] {
      std::unique_lock lock(mu);
      if (!cv.wait_until(lock, deadline, [&] { return done; })) impl_->registry.close_all();
    });
    impl_->server->Shutdown(deadline);
    {
      const std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_one();
    closer.join();
    impl_->registry.close_all();
    impl_->server->Wait();
  });
}

}  // namespace graphrun
