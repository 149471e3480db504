// graphrun-server: the graphrun SessionService over gRPC.
//
//   graphrun-server --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464
//
// When it is ready it prints, and flushes, exactly
//   graphrun-server listening on <address with the real port>
// and, when metrics are on,
//   graphrun-server metrics on http://<host:port>/metrics
// to stdout, then logs the level the kernels run at to stderr,
//   graphrun-server: kernels: avx512 (this CPU supports up to avx512)
// (or "kernels: error: GRAPHRUN_CPU_ISA='...' ..." when that variable is
// invalid: the server still serves, and CreateSession fails with that error).
// `--version` prints "graphrun-server <version>" and the same kernels line.
// SIGTERM or SIGINT shuts it down gracefully (health NOT_SERVING, no new
// calls, calls in flight get --grace-period, then their steps are cancelled
// and every session is closed) and it exits 0. A bad flag is one line on
// stderr and exit code 2; a server that cannot start exits 1.
#include <fcntl.h>
#include <fmt/format.h>
#include <graphrun/server.h>
#include <graphrun/session.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

// Relative: this target does not have the repository root on its include
// path; the header is self-contained (public API and fmt only).
#include "../graphrun/build_info.h"
// The same for the file-kind helper the graph and .npy readers use.
#include "../../api/src/posix_file.h"

#ifdef GRAPHRUN_SERVER_MPI
#include <graphrun/mpi.h>
#endif

namespace {

using graphrun::invalid_argument;
using graphrun::Result;

// "<number>[ms|s|m]": a bare number is seconds; decimals allowed ("0.5").
// Rounded to the nearest millisecond, but a duration above 0 is at least
// 1 ms: 0 means "never" for the idle timeouts, and 0.0001 (0.1 ms) was
// silently that.
Result<std::chrono::milliseconds> parse_duration(std::string_view flag, std::string_view text) {
  double scale = 1000;  // ms per unit
  std::string_view number = text;
  if (number.ends_with("ms")) {
    scale = 1;
    number.remove_suffix(2);
  } else if (number.ends_with('s')) {
    number.remove_suffix(1);
  } else if (number.ends_with('m')) {
    scale = 60'000;
    number.remove_suffix(1);
  }
  double value = -1;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || error != std::errc() || end != number.data() + number.size() ||
      !(value >= 0) || value * scale > 1e15) {
    return invalid_argument("{} '{}': expected a duration such as 30, 30s, 500ms or 2m", flag,
                            text);
  }
  const auto ms = static_cast<int64_t>(value * scale + 0.5);
  return std::chrono::milliseconds(value > 0 && ms == 0 ? 1 : ms);
}

// Raises the soft limit of open files to the hard one. gRPC 1.51 stops
// accepting connections on a port for good after one accept fails for
// want of a file descriptor (grpc/grpc#20418: the listener is not armed
// again), so the server takes every descriptor it may: 1024 idle clients
// would otherwise end it for new ones under the common soft limit.
void raise_open_files_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  static_cast<void>(::setrlimit(RLIMIT_NOFILE, &limit));  // best effort
}

Result<std::string> read_file(std::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument("{}: cannot read '{}'", flag, path);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return invalid_argument("{}: cannot read '{}'", flag, path);
  return contents.str();
}

// A token file is small: more than this is not a token.
constexpr std::size_t kMaxTokenFileBytes = 64 << 10;

// The token file's contents without trailing line ends; empty is an error.
// Only a regular file of at most kMaxTokenFileBytes: a device (/dev/zero)
// would be read without end and a FIFO would block the start forever (it is
// opened without blocking, then refused).
Result<std::string> read_token(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return invalid_argument("--token-file: cannot read '{}': {}", path, std::strerror(errno));
  }
  const graphrun::internal::FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return invalid_argument("--token-file: cannot read '{}': {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("--token-file: '{}' is {}, not a regular file", path,
                            graphrun::internal::file_kind(st.st_mode));
  }
  if (st.st_size > static_cast<off_t>(kMaxTokenFileBytes)) {
    return invalid_argument("--token-file: '{}' has {} bytes; a token file may have at most {}",
                            path, st.st_size, kMaxTokenFileBytes);
  }
  // One byte more than the limit, in case the file grew since fstat.
  std::string token(kMaxTokenFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::read(fd, token.data() + got, token.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return invalid_argument("--token-file: cannot read '{}': {}", path, std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxTokenFileBytes) {
    return invalid_argument("--token-file: '{}' has more than {} bytes; too large for a token",
                            path, kMaxTokenFileBytes);
  }
  token.resize(got);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) return invalid_argument("--token-file: '{}' holds no token", path);
  return token;
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

int usage_error(std::string_view message) {
  fmt::print(stderr, "graphrun-server: {}\n", one_line(std::string(message)));
  return 2;
}

}  // namespace

// --mpi-worker: a worker rank of an MPI job (launched by mpirun next to the
// driver's program on rank 0), which sends this rank its part of the graph.
int run_mpi_worker(int argc, char** argv, int threads) {
#ifdef GRAPHRUN_SERVER_MPI
  auto world = graphrun::mpi::World::init(&argc, &argv);
  if (!world.is_ok()) {
    fmt::print(stderr, "graphrun-server: --mpi-worker: {}\n", one_line(world.status().to_string()));
    return 1;
  }
  if ((*world)->rank() == 0) {
    fmt::print(stderr,
               "graphrun-server: --mpi-worker runs on ranks 1..n-1; rank 0 is the driver's "
               "program (mpirun -np 1 <driver> : -np N graphrun-server --mpi-worker)\n");
    return 2;
  }
  graphrun::SessionOptions options;
  options.inter_op_threads = threads;
  const graphrun::Status s = graphrun::mpi::serve_without_graph(std::move(options));
  if (!s.is_ok()) {
    fmt::print(stderr, "graphrun-server: rank {}: {}\n", (*world)->rank(), one_line(s.to_string()));
    return 1;
  }
  return 0;
#else
  static_cast<void>(argc);
  static_cast<void>(argv);
  static_cast<void>(threads);
  fmt::print(stderr,
             "graphrun-server: --mpi-worker: this graphrun-server was built without the MPI "
             "component (GRAPHRUN_MPI=OFF, or no MPI found)\n");
  return 2;
#endif
}

int main(int argc, char** argv) {
  graphrun::ServerOptions options;
  const graphrun::ServiceLimits defaults;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;
  // A server collects what clients abandon unless told not to.
  std::string session_idle_timeout = "60m";
  std::string partial_run_idle_timeout = "10m";
  std::string grace_period = "5s";
  int64_t max_sessions = static_cast<int64_t>(defaults.max_sessions);
  int64_t max_partial_runs = static_cast<int64_t>(defaults.max_partial_runs_per_session);

  // Integers >= 1, with a message that says so (CLI's PositiveNumber prints
  // a double's range).
  const CLI::Validator positive(
      [](std::string& text) -> std::string {
        int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size() || value < 1) {
          return fmt::format("expected a positive integer, got '{}'", text);
        }
        return {};
      },
      "POSITIVE");
  CLI::App app{
      "graphrun-server: the graphrun SessionService (gRPC) with health, reflection and "
      "optional TLS, bearer token and Prometheus metrics."};
  app.set_version_flag(
      "--version", [] { return graphrun::tools::version_text("graphrun-server"); },
      "Print the version and the kernels' instruction-set level (GRAPHRUN_CPU_ISA=baseline|avx2|"
      "avx512 lowers it) and exit");
  app.add_option("--listen", options.address,
                 "host:port (port 0: a free one, printed when ready) or unix:PATH")
      ->capture_default_str();
  app.add_option("--tls-cert", tls_cert, "TLS certificate chain, a PEM file (with --tls-key)");
  app.add_option("--tls-key", tls_key, "TLS private key, a PEM file (with --tls-cert)");
  app.add_option("--token-file", token_file,
                 "file holding the bearer token clients must send ('authorization: Bearer "
                 "<token>'); trailing newlines are stripped. Needs TLS, unless --listen is "
                 "loopback or unix:");
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest request or response message")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-sessions", max_sessions, "sessions open at once")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-partial-runs", max_partial_runs, "partial runs open at once per session")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-tensor-bytes", options.limits.max_tensor_bytes_per_request,
                 "bytes of fed tensors in one request")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-graph-nodes", options.limits.max_graph_nodes,
                 "nodes in one session's graph")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-output-tensor-bytes", options.limits.max_output_tensor_bytes,
                 "largest tensor a kernel may make at run time (a Fill of fed dims, a "
                 "broadcast); past it the step fails with RESOURCE_EXHAUSTED naming the node")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-session-bytes", options.limits.max_session_bytes,
                 "estimated memory one session may hold (its GraphDefs' tensors plus about "
                 "1.5 KB per node)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--max-total-session-bytes", options.limits.max_total_session_bytes,
                 "the same, summed over all open sessions")
      ->capture_default_str()
      ->check(positive);
  options.limits.max_inter_op_threads = graphrun::ThreadPool::default_threads();
  app.add_option("--max-inter-op-threads", options.limits.max_inter_op_threads,
                 fmt::format("threads one session may ask for (SessionConfig.inter_op_threads); "
                             "default: the core count; at most {}",
                             graphrun::ThreadPool::max_threads()))
      ->capture_default_str()
      ->check(positive)
      ->check(CLI::Range(1, graphrun::ThreadPool::max_threads()));
  app.add_option("--max-calls-in-flight", options.max_calls_in_flight,
                 "Run and PartialRun calls in flight at once, queued or running (no thread is "
                 "held per call); past it a call is RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(positive);
  std::string socket_mode = "0600";
  app.add_option("--unix-socket-mode", socket_mode,
                 "file mode (octal) of a unix:PATH socket; 0600: only this user (and root) may "
                 "connect, 0660: also the socket's group")
      ->capture_default_str();
  app.add_option("--session-idle-timeout", session_idle_timeout,
                 "close a session after this long without a call (30, 30s, 500ms, 2m; bare "
                 "numbers are seconds); 0: never")
      ->capture_default_str();
  app.add_option("--partial-run-idle-timeout", partial_run_idle_timeout,
                 "cancel a partial run after this long without a call: the default for "
                 "sessions whose config sets none, and a cap on those that do (same units); "
                 "0: sessions keep their own")
      ->capture_default_str();
  app.add_option("--grace-period", grace_period,
                 "on SIGTERM/SIGINT, how long calls in flight may finish before their steps "
                 "are cancelled (same units)")
      ->capture_default_str();
  app.add_option("--metrics-listen", options.metrics_address,
                 "serve Prometheus metrics at http://HOST:PORT/metrics; loopback only; off by "
                 "default");
  bool mpi_worker = false;
  int worker_threads = 0;
  CLI::Option* mpi_worker_flag = app.add_flag(
      "--mpi-worker", mpi_worker,
      "run as a worker rank of an MPI job instead of a gRPC server: the driver on rank 0 "
      "sends this rank its part of the graph; exits when the driver's session closes");
  app.add_option("--worker-threads", worker_threads,
                 "with --mpi-worker: threads of the worker's session (0: one per core)")
      ->check(CLI::Range(0, graphrun::ThreadPool::max_threads()))
      ->needs(mpi_worker_flag)  // a gRPC server's sessions set their own threads
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (mpi_worker) return run_mpi_worker(argc, argv, worker_threads);

  {
    unsigned mode = 0;
    const auto [end, error] =
        std::from_chars(socket_mode.data(), socket_mode.data() + socket_mode.size(), mode, 8);
    if (socket_mode.empty() || error != std::errc() ||
        end != socket_mode.data() + socket_mode.size() || mode > 0777) {
      return usage_error(
          fmt::format("--unix-socket-mode '{}': expected an octal file mode such as 0600 or 0660",
                      socket_mode));
    }
    options.unix_socket_mode = mode;
  }
  options.limits.max_sessions = static_cast<std::size_t>(max_sessions);
  options.limits.max_partial_runs_per_session = static_cast<std::size_t>(max_partial_runs);
  auto session_idle = parse_duration("--session-idle-timeout", session_idle_timeout);
  if (!session_idle.is_ok()) return usage_error(session_idle.status().message());
  options.limits.session_idle_timeout = *session_idle;
  auto partial_idle = parse_duration("--partial-run-idle-timeout", partial_run_idle_timeout);
  if (!partial_idle.is_ok()) return usage_error(partial_idle.status().message());
  options.limits.partial_run_idle_timeout = *partial_idle;
  auto grace = parse_duration("--grace-period", grace_period);
  if (!grace.is_ok()) return usage_error(grace.status().message());
  if (tls_cert.empty() != tls_key.empty()) {
    return usage_error("--tls-cert and --tls-key go together");
  }
  if (!tls_cert.empty()) {
    auto cert = read_file("--tls-cert", tls_cert);
    if (!cert.is_ok()) return usage_error(cert.status().message());
    auto key = read_file("--tls-key", tls_key);
    if (!key.is_ok()) return usage_error(key.status().message());
    options.tls_cert_pem = std::move(cert).value();
    options.tls_key_pem = std::move(key).value();
  }
  if (!token_file.empty()) {
    auto token = read_token(token_file);
    if (!token.is_ok()) return usage_error(token.status().message());
    options.auth_token = std::move(token).value();
  }

  // Every thread started from here on (gRPC's, the metrics endpoint's)
  // inherits the blocked signals; only sigwait() below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  raise_open_files_limit();
  auto server = graphrun::Server::start(std::move(options));
  if (!server.is_ok()) {
    const bool usage = server.status().code() == graphrun::StatusCode::kInvalidArgument;
    fmt::print(stderr, "graphrun-server: {}\n", one_line(server.status().to_string()));
    return usage ? 2 : 1;
  }
  fmt::print("graphrun-server listening on {}\n", (*server)->address());
  if (!(*server)->metrics_address().empty()) {
    fmt::print("graphrun-server metrics on http://{}/metrics\n", (*server)->metrics_address());
  }
  std::fflush(stdout);
  fmt::print(stderr, "graphrun-server: kernels: {}\n", graphrun::tools::kernels_description());
  std::fflush(stderr);

  int received = 0;
  while (sigwait(&stop_signals, &received) != 0) {
  }
  fmt::print(stderr, "graphrun-server: {}, shutting down (grace period {} ms)\n",
             received == SIGTERM ? "SIGTERM" : "SIGINT", grace->count());
  (*server)->shutdown(*grace);
  server->reset();
  return 0;
}
