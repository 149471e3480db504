// The metrics HTTP endpoint on its own: a slow or idle client must not
// delay another's scrape past the endpoint's per-connection deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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

// Many idle connections ahead of a scrape: they do not add up.
TEST(MetricsHttpServerTest, IdleConnectionsDoNotAddUp) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = connect_to(address);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(kTimeout / 4);
  const auto start = Clock::now();
  EXPECT_THAT(scrape(address), HasSubstr("up 1\n"));
  EXPECT_LT(Clock::now() - start, kTimeout);
  for (const int fd : idle) ::close(fd);
}

// Past kMaxConnections open, a new connection waits in the backlog until
// the oldest reach their deadline: about one timeout, not one per
// connection.
TEST(MetricsHttpServerTest, PastTheConnectionCapAScrapeWaitsOneTimeout) {
  auto server = MetricsHttpServer::start(
      "127.0.0.1:0", [] { return std::string("up 1\n"); }, kTimeout);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  std::vector<int> idle;
  for (std::size_t i = 0; i < MetricsHttpServer::kMaxConnections + 8; ++i) {
    const int fd = connect_to(address);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const auto start = Clock::now();
  EXPECT_THAT(scrape(address), HasSubstr("up 1\n"));
  EXPECT_LT(Clock::now() - start, 4 * kTimeout);
  for (const int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace graphrun::service_internal
