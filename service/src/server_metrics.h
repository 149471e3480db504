// Private to graphrun_service: the server's Prometheus metrics and the
// minimal HTTP/1.0 endpoint that serves them. No gRPC types.
#pragma once

#include <graphrun/session_registry.h>
#include <graphrun/status.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace graphrun::service_internal {

// Counters and histograms of the gRPC calls a server answered, rendered in
// the Prometheus text exposition format (version 0.0.4). `rpc` is the
// method path without its leading slash, "graphrun.v1.SessionService/Run";
// `code` a gRPC status code number.
// Thread safety: thread-safe (one mutex; a call takes it twice).
class ServerMetrics {
 public:
  // Upper bounds (seconds) of the step latency histogram's buckets; +Inf is
  // implied.
  static constexpr std::array<double, 15> kLatencyBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

  // A call arrived: in flight until call_ended().
  void call_started(std::string_view rpc);
  // The call's status is about to be sent: counts it by code and, for Run
  // and PartialRun, its latency since it arrived. (Before the client can
  // see the status, so a client that got its answer sees it counted.)
  void call_answered(std::string_view rpc, int code, std::chrono::nanoseconds latency);
  // The call is over: its status was sent (or it ended without one, for
  // instance refused during shutdown). No longer in flight.
  void call_ended(std::string_view rpc);

  // Waits until no call whose rpc starts with `prefix` is in flight, or
  // until `deadline`; true when none is.
  bool wait_until_idle(std::string_view prefix,
                       std::chrono::steady_clock::time_point deadline) const;

  // The exposition: the counters above, plus the registry's open sessions
  // and partial runs as gauges.
  std::string render(const SessionRegistry& registry) const;

 private:
  struct Histogram {
    std::array<uint64_t, kLatencyBuckets.size()> buckets{};  // not cumulative
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  int64_t in_flight_locked(std::string_view prefix) const;

  mutable std::mutex mu_;
  mutable std::condition_variable ended_;  // a call ended
  // Guarded by mu_.
  std::map<std::pair<std::string, int>, uint64_t, std::less<>> requests_;
  std::map<std::string, int64_t, std::less<>> in_flight_;
  std::map<std::string, Histogram, std::less<>> step_latency_;
};

// The gRPC status code's name as gRPC spells it ("OK", "NOT_FOUND", ...);
// "CODE_<n>" for a number that is none. Thread-safe.
std::string_view status_code_name(int code);

// A loopback "host:port" split and checked: host "127.x.x.x", "localhost"
// or "[::1]" (IPv6 in brackets), port 0..65535. Thread-safe.
struct HostPort {
  std::string host;  // without brackets
  int port = 0;
};
Result<HostPort> parse_loopback_host_port(std::string_view address);

// One thread answering GET /metrics (HTTP/1.0, one request per
// connection) with render()'s text; 404 for other paths, 405 for other
// methods. The thread serves up to kMaxConnections connections at once,
// without blocking on any (non-blocking sockets, one poll loop), and gives
// each `request_timeout` from its accept to read the request head and send
// the answer; past it the connection is dropped. So a slow or idle client
// delays no other, and holds a place at most request_timeout; past
// kMaxConnections open, new connections wait in the listen backlog until
// one ends. When the process runs out of file descriptors, accepting
// pauses for 100 ms at a time (the backlog waits; the thread does not spin).
// Thread safety: construction and stop() from one thread; render() is
// called on the endpoint's thread and must be thread-safe. Owns its socket
// and thread; the destructor stops it.
class MetricsHttpServer {
 public:
  // A connection's whole time, from accept to the answer's last byte.
  static constexpr std::chrono::milliseconds kRequestTimeout{2000};
  // Connections served at once.
  static constexpr std::size_t kMaxConnections = 64;
  // The longest request head read (only its first line matters).
  static constexpr std::size_t kMaxRequestBytes = 8192;

  // Listens on `address` (parse_loopback_host_port's rules). Unavailable
  // when the address cannot be bound. `request_timeout`: kRequestTimeout
  // unless a test wants it shorter.
  static Result<std::unique_ptr<MetricsHttpServer>> start(
      std::string_view address, std::function<std::string()> render,
      std::chrono::milliseconds request_timeout = kRequestTimeout);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // "host:port" with the real port ("[::1]:port" for IPv6).
  const std::string& address() const { return address_; }
  // Stops accepting and joins the thread. Idempotent.
  void stop();

 private:
  MetricsHttpServer(int listen_fd, int wake_read, int wake_write, std::string address,
                    std::function<std::string()> render, std::chrono::milliseconds request_timeout);
  void serve();
  // The whole HTTP answer to `request` (its head, possibly cut short).
  std::string respond(std::string_view request) const;

  int listen_fd_;
  int wake_read_;  // a pipe: a byte (or its closing) ends serve()
  int wake_write_;
  std::string address_;
  std::function<std::string()> render_;
  const std::chrono::milliseconds request_timeout_;
  std::thread thread_;
};

}  // namespace graphrun::service_internal
