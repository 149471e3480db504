// The metrics HTTP endpoint on its own: a slow or idle client must not
// delay another's scrape past the endpoint's per-connection deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "service/src/server_metrics.h"
#include "tests/testing/op_harness.h"

namespace graphrun::service_internal {
namespace {

using ::graphrun::testing::IsOk;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

int connect_to(const std::string& host_port) {
  const int port = std::stoi(host_port.substr(host_port.rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics on a new connection; the whole answer (empty on failure).
std::string scrape(const std::string& address) {
  const int fd = connect_to(address);
  if (fd < 0) return {};
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) {
    ::close(fd);
    return {};
  }
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

constexpr std::chrono::milliseconds kTimeout(500);

// A client that sends one byte now and then, never ending its head: the
// deadline is on the whole request (it was per read, so each byte renewed
// it and a scrape behind waited as long as the client liked), and other
// connections are served meanwhile.
TEST(MetricsHttpServerTest, SlowDripDoesNotDelayAScrape) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  const int slow = connect_to(address);
  ASSERT_GE(slow, 0);
  std::atomic<bool> dropped{false};
  std::thread drip([&] {
    // Well past the deadline, a byte every kTimeout / 5.
    const auto until = Clock::now() + 6 * kTimeout;
    while (Clock::now() < until) {
      if (::send(slow, "G", 1, MSG_NOSIGNAL) < 0) {
        dropped = true;
        return;
      }
      std::this_thread::sleep_for(kTimeout / 5);
    }
  });
  std::this_thread::sleep_for(kTimeout / 4);  // the drip's connection is accepted first
  const auto start = Clock::now();
  const std::string answer = scrape(address);
  const auto took = Clock::now() - start;
  EXPECT_THAT(answer, HasSubstr("HTTP/1.0 200 OK"));
  EXPECT_THAT(answer, HasSubstr("up 1\n"));
  // Served alongside: well within the one connection's deadline.
  EXPECT_LT(took, kTimeout);
  drip.join();
  // The drip was dropped at its deadline though it kept sending.
  EXPECT_TRUE(dropped.load());
  ::close(slow);
}

// `n` connections to `address` that send nothing, closed on destruction.
class IdleConnections {
 public:
  IdleConnections(const std::string& address, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const int fd = connect_to(address);
      if (fd < 0) return;
      fds_.push_back(fd);
    }
  }
  IdleConnections(const IdleConnections&) = delete;
  IdleConnections& operator=(const IdleConnections&) = delete;
  ~IdleConnections() {
    for (const int fd : fds_) ::close(fd);
  }
  std::size_t size() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
};

// Many idle connections ahead of a scrape: they do not add up.
TEST(MetricsHttpServerTest, IdleConnectionsDoNotAddUp) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  const IdleConnections idle(address, 20);
  ASSERT_EQ(idle.size(), 20U);
  std::this_thread::sleep_for(kTimeout / 4);
  const auto start = Clock::now();
  EXPECT_THAT(scrape(address), HasSubstr("up 1\n"));
  EXPECT_LT(Clock::now() - start, kTimeout);
}

// Past kMaxConnections open, a new connection waits in the backlog until
// the oldest reach their deadline: about one timeout, not one per
// connection.
TEST(MetricsHttpServerTest, PastTheConnectionCapAScrapeWaitsOneTimeout) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  const std::size_t n = MetricsHttpServer::kMaxConnections + 8;
  const IdleConnections idle(address, n);
  ASSERT_EQ(idle.size(), n);
  const auto start = Clock::now();
  EXPECT_THAT(scrape(address), HasSubstr("up 1\n"));
  EXPECT_LT(Clock::now() - start, 4 * kTimeout);
}

double cpu_seconds_of_process() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Out of file descriptors, accept fails while the connection stays in the
// backlog, so the listening socket stays readable: the endpoint pauses its
// accepting instead of spinning on it, and accepts again once descriptors
// are free.
TEST(MetricsHttpServerTest, OutOfFileDescriptorsTheEndpointWaitsWithoutSpinning) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  rlimit low = old_limit;
  low.rlim_cur = std::min<rlim_t>(old_limit.rlim_cur, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // Every descriptor but one taken; the client's socket takes that one.
  std::vector<int> filler;
  for (int fd = ::dup(0); fd >= 0; fd = ::dup(0)) filler.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  ASSERT_FALSE(filler.empty());
  ::close(filler.back());
  filler.pop_back();
  const int waiting = connect_to(address);  // the kernel completes it; accept cannot
  ASSERT_GE(waiting, 0);

  const double cpu_before = cpu_seconds_of_process();
  std::this_thread::sleep_for(2 * kTimeout);
  const double cpu_used = cpu_seconds_of_process() - cpu_before;
  // A spinning endpoint would use about the whole second.
  EXPECT_LT(cpu_used, 0.25) << "the endpoint spun on a listening socket it could not accept from";

  for (const int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old_limit), 0);
  EXPECT_THAT(scrape(address), HasSubstr("up 1\n"));
  ::close(waiting);
}

}  // namespace
}  // namespace graphrun::service_internal
