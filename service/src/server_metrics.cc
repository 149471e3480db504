#include "service/src/server_metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <graphrun/server.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <iterator>
#include <vector>

namespace graphrun::service_internal {
namespace {

constexpr std::array<std::string_view, 17> kCodeNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

bool is_step_rpc(std::string_view rpc) {
  return rpc == "graphrun.v1.SessionService/Run" || rpc == "graphrun.v1.SessionService/PartialRun";
}

// A label value in the exposition format: backslash, quote and newline escaped.
std::string label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string_view status_code_name(int code) {
  if (code >= 0 && code < static_cast<int>(kCodeNames.size())) {
    return kCodeNames[static_cast<std::size_t>(code)];
  }
  return "UNKNOWN_CODE";
}

void ServerMetrics::call_started(std::string_view rpc) {
  const std::lock_guard lock(mu_);
  auto it = in_flight_.find(rpc);
  if (it == in_flight_.end()) it = in_flight_.emplace(std::string(rpc), 0).first;
  ++it->second;
}

void ServerMetrics::call_ended(std::string_view rpc) {
  {
    const std::lock_guard lock(mu_);
    auto it = in_flight_.find(rpc);
    if (it != in_flight_.end()) --it->second;
  }
  ended_.notify_all();
}

int64_t ServerMetrics::in_flight_locked(std::string_view prefix) const {
  int64_t total = 0;
  for (const auto& [rpc, count] : in_flight_) {
    if (rpc.starts_with(prefix)) total += count;
  }
  return total;
}

bool ServerMetrics::wait_until_idle(std::string_view prefix,
                                    std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  return ended_.wait_until(lock, deadline, [&] { return in_flight_locked(prefix) == 0; });
}

void ServerMetrics::call_answered(std::string_view rpc, int code,
                                  std::chrono::nanoseconds latency) {
  const std::lock_guard lock(mu_);
  const auto key = std::make_pair(std::string(rpc), code);
  ++requests_[key];
  if (!is_step_rpc(rpc)) return;
  auto it = step_latency_.find(rpc);
  if (it == step_latency_.end()) it = step_latency_.emplace(std::string(rpc), Histogram{}).first;
  Histogram& h = it->second;
  const double seconds = std::chrono::duration<double>(latency).count();
  const auto bucket = std::lower_bound(kLatencyBuckets.begin(), kLatencyBuckets.end(), seconds);
  if (bucket != kLatencyBuckets.end()) ++h.buckets[std::size_t(bucket - kLatencyBuckets.begin())];
  ++h.count;
  h.sum_seconds += seconds;
}

std::string ServerMetrics::render(const SessionRegistry& registry) const {
  // The registry first, outside mu_ (list() takes the registry's lock).
  const std::vector<SessionInfo> sessions = registry.list();
  int64_t partial_runs = 0;
  for (const SessionInfo& info : sessions) partial_runs += info.open_partial_runs;

  std::string out;
  auto append = [&out](std::string_view text) { out += text; };
  const std::lock_guard lock(mu_);
  append("# HELP graphrun_rpc_requests_total gRPC calls answered, by RPC and status code.\n");
  append("# TYPE graphrun_rpc_requests_total counter\n");
  for (const auto& [key, count] : requests_) {
    fmt::format_to(std::back_inserter(out),
                   "graphrun_rpc_requests_total{{rpc=\"{}\",code=\"{}\"}} {}\n", label(key.first),
                   status_code_name(key.second), count);
  }
  append("# HELP graphrun_rpcs_in_flight gRPC calls received and not over yet.\n");
  append("# TYPE graphrun_rpcs_in_flight gauge\n");
  for (const auto& [rpc, count] : in_flight_) {
    fmt::format_to(std::back_inserter(out), "graphrun_rpcs_in_flight{{rpc=\"{}\"}} {}\n",
                   label(rpc), count);
  }
  append(
      "# HELP graphrun_step_duration_seconds Run and PartialRun calls, from arrival to status.\n");
  append("# TYPE graphrun_step_duration_seconds histogram\n");
  for (const auto& [rpc, h] : step_latency_) {
    const std::string name = label(rpc);
    uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      fmt::format_to(std::back_inserter(out),
                     "graphrun_step_duration_seconds_bucket{{rpc=\"{}\",le=\"{}\"}} {}\n", name,
                     kLatencyBuckets[i], cumulative);
    }
    fmt::format_to(std::back_inserter(out),
                   "graphrun_step_duration_seconds_bucket{{rpc=\"{}\",le=\"+Inf\"}} {}\n"
                   "graphrun_step_duration_seconds_sum{{rpc=\"{}\"}} {}\n"
                   "graphrun_step_duration_seconds_count{{rpc=\"{}\"}} {}\n",
                   name, h.count, name, h.sum_seconds, name, h.count);
  }
  append("# HELP graphrun_open_sessions Sessions open.\n");
  append("# TYPE graphrun_open_sessions gauge\n");
  fmt::format_to(std::back_inserter(out), "graphrun_open_sessions {}\n", sessions.size());
  append("# HELP graphrun_open_partial_runs Partial runs open, over all sessions.\n");
  append("# TYPE graphrun_open_partial_runs gauge\n");
  fmt::format_to(std::back_inserter(out), "graphrun_open_partial_runs {}\n", partial_runs);
  return out;
}

Result<HostPort> parse_loopback_host_port(std::string_view address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return invalid_argument("metrics address '{}' is not host:port", address);
  }
  std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  int port = -1;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (error != std::errc() || end != port_text.data() + port_text.size() || port < 0 ||
      port > 65535) {
    return invalid_argument("metrics address '{}': port '{}' is not a number in 0..65535", address,
                            port_text);
  }
  if (!is_loopback_host(host)) {
    return invalid_argument(
        "metrics address '{}' is not loopback (127.x.x.x, localhost or [::1]): the metrics "
        "endpoint has no authentication",
        address);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  return HostPort{std::string(host), port};
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(
    std::string_view address, std::function<std::string()> render,
    std::chrono::milliseconds request_timeout) {
  GRAPHRUN_ASSIGN_OR_RETURN(HostPort where, parse_loopback_host_port(address));
  const bool v6 = where.host.find(':') != std::string::npos;
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (v6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(where.port));
    if (inet_pton(AF_INET6, where.host.c_str(), &in6->sin6_addr) != 1) {
      return invalid_argument("metrics address '{}': bad IPv6 address", address);
    }
    length = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(where.port));
    if (inet_pton(AF_INET, where.host.c_str(), &in4->sin_addr) != 1) {
      return invalid_argument("metrics address '{}': bad IPv4 address", address);
    }
    length = sizeof(sockaddr_in);
  }
  int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return unavailable("metrics endpoint: socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // TIME_WAIT only, no sharing
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&storage), length) != 0 ||
      ::listen(fd, static_cast<int>(kMaxConnections)) != 0) {
    const int err = errno;
    ::close(fd);
    return unavailable("cannot listen on metrics address '{}': {}", address, std::strerror(err));
  }
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    const int err = errno;
    ::close(fd);
    return unavailable("metrics endpoint: getsockname: {}", std::strerror(err));
  }
  const int port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port)
                      : ntohs(reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(fd);
    return unavailable("metrics endpoint: pipe: {}", std::strerror(err));
  }
  std::string real =
      v6 ? fmt::format("[{}]:{}", where.host, port) : fmt::format("{}:{}", where.host, port);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
      fd, wake[0], wake[1], std::move(real), std::move(render), request_timeout));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_read, int wake_write,
                                     std::string address, std::function<std::string()> render,
                                     std::chrono::milliseconds request_timeout)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      address_(std::move(address)),
      render_(std::move(render)),
      request_timeout_(request_timeout) {
  thread_ = std::thread([this] { serve(); });
}

MetricsHttpServer::~MetricsHttpServer() { stop(); }

void MetricsHttpServer::stop() {
  if (!thread_.joinable()) return;
  close_fd(wake_write_);  // serve() sees the pipe's end
  thread_.join();
  close_fd(wake_read_);
  close_fd(listen_fd_);
}

namespace {

// One connection of the endpoint: reading its request head until
// `response` is set, then sending it; dropped at `deadline` either way.
struct Connection {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;
  std::string request;
  std::string response;
  std::size_t sent = 0;
  bool answering = false;  // response set: sending
};

bool head_complete(const std::string& request) {
  return request.find("\r\n\r\n") != std::string::npos || request.find("\n\n") != std::string::npos;
}

}  // namespace

// How long the endpoint stops accepting after the process ran out of file
// descriptors (or memory): the pending connection keeps the listening
// socket readable, so polling it at once again would spin.
constexpr std::chrono::milliseconds kAcceptBackoff(100);

void MetricsHttpServer::serve() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  std::chrono::steady_clock::time_point accept_paused_until{};
  const auto close_all = [&] {
    for (Connection& c : connections) close_fd(c.fd);
  };
  for (;;) {
    // Drop the connections past their deadline; poll until the nearest.
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(connections, [&](Connection& c) {
      if (c.fd >= 0 && now < c.deadline) return false;
      close_fd(c.fd);
      return true;
    });
    int timeout_ms = -1;
    const auto wait_until = [&](std::chrono::steady_clock::time_point t) {
      const auto left =
          std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(t - now).count());
      timeout_ms =
          timeout_ms < 0 ? static_cast<int>(left) : std::min(timeout_ms, static_cast<int>(left));
    };
    for (const Connection& c : connections) wait_until(c.deadline);
    const bool accept_paused = now < accept_paused_until;
    if (accept_paused) wait_until(accept_paused_until);
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    // Past kMaxConnections, new connections wait in the backlog.
    const bool accepting = connections.size() < kMaxConnections && !accept_paused;
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const Connection& c : connections) {
      fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      close_all();
      return;
    }
    if (fds[0].revents != 0) {
      close_all();
      return;
    }
    for (std::size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short revents = fds[i + 2].revents;
      if (revents == 0) continue;
      if (!c.answering) {
        char buffer[1024];
        const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n > 0) c.request.append(buffer, static_cast<std::size_t>(n));
        // The head's end, its size limit, or the client's end (answer what
        // came): answer; an error drops the connection.
        if (n < 0) {
          close_fd(c.fd);
          continue;
        }
        if (n == 0 || c.request.size() >= kMaxRequestBytes || head_complete(c.request)) {
          c.response = respond(c.request);
          c.answering = true;
        }
        continue;  // send when the socket says it can
      }
      const ssize_t n = ::send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) {
        close_fd(c.fd);
        continue;
      }
      c.sent += static_cast<std::size_t>(n);
      if (c.sent == c.response.size()) close_fd(c.fd);  // done
    }
    // Every connection waiting, up to the cap (the listening socket is
    // non-blocking).
    while ((fds[1].revents & POLLIN) != 0 && connections.size() < kMaxConnections) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until = std::chrono::steady_clock::now() + kAcceptBackoff;
        }
        break;
      }
      Connection c;
      c.fd = fd;
      c.deadline = std::chrono::steady_clock::now() + request_timeout_;
      connections.push_back(std::move(c));
    }
  }
}

std::string MetricsHttpServer::respond(std::string_view request) const {
  // "METHOD TARGET HTTP/x.y": anything else (junk, a TLS hello, nothing at
  // all) is 400 Bad Request, another HTTP version 505, a method other than
  // GET or HEAD 405.
  const std::string_view line = request.substr(0, request.find_first_of("\r\n"));
  const std::size_t first_space = line.find(' ');
  const std::size_t second_space =
      first_space == std::string_view::npos ? first_space : line.find(' ', first_space + 1);
  const std::string_view method = line.substr(0, first_space);
  std::string_view target;
  std::string_view version;
  if (second_space != std::string_view::npos) {
    target = line.substr(first_space + 1, second_space - first_space - 1);
    target = target.substr(0, target.find('?'));
    version = line.substr(second_space + 1);
  }
  const bool is_token = !method.empty() && std::all_of(method.begin(), method.end(),
                                                       [](char c) { return c >= 'A' && c <= 'Z'; });
  std::string status = "200 OK";
  std::string body;
  if (!is_token || target.empty() || !version.starts_with("HTTP/")) {
    status = "400 Bad Request";
    body = "not an HTTP request line; only GET /metrics\n";
  } else if (!version.starts_with("HTTP/1.")) {
    status = "505 HTTP Version Not Supported";
    body = "HTTP/1.0 or 1.1 only; GET /metrics\n";
  } else if (method != "GET" && method != "HEAD") {
    status = "405 Method Not Allowed";
    body = "only GET /metrics\n";
  } else if (target != "/metrics") {
    status = "404 Not Found";
    body = "only GET /metrics\n";
  } else {
    body = render_();
  }
  std::string response = fmt::format(
      "HTTP/1.0 {}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
      "Content-Length: {}\r\nConnection: close\r\n\r\n",
      status, body.size());
  if (method != "HEAD") response += body;
  return response;
}

}  // namespace graphrun::service_internal
