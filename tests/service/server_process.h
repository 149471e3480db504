// Helpers for the service tests that drive a server from outside: raw
// gRPC byte buffers, polling, a temporary directory, and a child process
// (the real graphrun-server binary, whose path comes from CMake as
// GRAPHRUN_SERVER_BINARY) with its stdout and stderr on pipes.
// Thread safety: test helpers; each object is used by one thread.
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace graphrun::testing {

using Clock = std::chrono::steady_clock;

inline std::string slice_bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

inline grpc::ByteBuffer byte_buffer(const std::string& bytes) {
  const grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Polls `condition` every 10 ms until it holds or `timeout` passes.
template <typename Condition>
bool await(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A temporary directory, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "graphrun-server-test-XXXXXX";
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process with its stdout and stderr on pipes.
class Child {
 public:
  explicit Child(const std::vector<std::string>& args) {
    int out[2];
    int err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (out_ >= 0) ::close(out_);
    if (err_ >= 0) ::close(err_);
  }

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // The next line of stdout (without '\n'), waiting up to `timeout`;
  // nullopt at end of file or timeout.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const std::size_t newline = out_buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = out_buffer_.substr(0, newline);
        out_buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd fd{out_, POLLIN, 0};
      if (::poll(&fd, 1, static_cast<int>(left.count())) <= 0) continue;
      char buffer[512];
      const ssize_t n = ::read(out_, buffer, sizeof(buffer));
      if (n <= 0) return std::nullopt;
      out_buffer_.append(buffer, static_cast<std::size_t>(n));
    }
  }

  // Waits up to `timeout` for the exit: the wait status, or nullopt.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    int status = 0;
    if (!await([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout)) {
      return std::nullopt;
    }
    exited_ = true;
    return status;
  }

  // All of stderr (call after the exit).
  std::string read_stderr() {
    std::string text;
    char buffer[512];
    ssize_t n = 0;
    while ((n = ::read(err_, buffer, sizeof(buffer))) > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
    }
    return text;
  }
  std::string rest_of_stdout() {
    std::string text = out_buffer_;
    char buffer[512];
    ssize_t n = 0;
    while ((n = ::read(out_, buffer, sizeof(buffer))) > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
    }
    return text;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int err_ = -1;
  bool exited_ = false;
  std::string out_buffer_;
};

#ifdef GRAPHRUN_SERVER_BINARY
inline constexpr const char* kServerBinary = GRAPHRUN_SERVER_BINARY;
#else
inline constexpr const char* kServerBinary = nullptr;
#endif

// The child's pid's resident set size in bytes (VmRSS), or -1.
inline int64_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A graphrun-server child listening on 127.0.0.1:0 with `flags`; address()
// is empty when it did not start (the reason is in start_error()).
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& flags) : child_(args(flags)) {
    if (!child_.started()) return;
    const std::optional<std::string> line = child_.read_line(std::chrono::seconds(30));
    const std::string prefix = "graphrun-server listening on ";
    if (line && line->starts_with(prefix)) address_ = line->substr(prefix.size());
  }
  const std::string& address() const { return address_; }
  Child& child() { return child_; }
  std::shared_ptr<grpc::Channel> channel() const {
    return grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  }

 private:
  static std::vector<std::string> args(const std::vector<std::string>& flags) {
    std::vector<std::string> out = {kServerBinary == nullptr ? "" : kServerBinary};
    bool listen = false;
    for (const std::string& f : flags) listen = listen || f == "--listen";
    if (!listen) {
      out.push_back("--listen");
      out.push_back("127.0.0.1:0");
    }
    out.insert(out.end(), flags.begin(), flags.end());
    return out;
  }
  Child child_;
  std::string address_;
};

}  // namespace graphrun::testing
