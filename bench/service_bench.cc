// Case 8: remote sessions (issue 5). The 10-node small graph of case 1
// (bench/common/small_graph.h) run through a RemoteSession over loopback
// gRPC, against the baseline of Session::run on the same graph in the same
// process. The server (graphrun::Server on 127.0.0.1:0) runs in this process
// too, so client and server share the machine's cores.
//
// RemoteSmall (one client thread, fixed per-run cost):
//   Session        Session::run({{"x", ..}, {"y", ..}}, {"j"}) in-process: the baseline
//   RemoteSession  RemoteSession::run with the same arguments over loopback
//   Stub           the generated stub's Run with a request built once: gRPC and
//                  the service without RemoteSession's encoding and decoding
//   EmptyRpc       ListSessions on a server with one session: a unary round trip
//                  with almost no work on either side (the transport's floor)
// RemoteThroughput (1 and 8 client threads, items/s = runs/s of all threads):
//   Session        every thread Session::run on one shared session
//   RemoteSession  every thread RemoteSession::run on one shared remote session
//                  (one channel; the server starts each step asynchronously)
// RemoteInFlight_SlowStep/N (issue 15): N concurrent clients (the stub's
//   callback API, one channel) each running a step that sleeps 100 ms in a
//   kernel, against a session on a 2-thread pool: the pool's capacity is 20
//   steps/s. One iteration of N calls; counters steps_per_s (N over the
//   wall time of the batch), p50_ms / p99_ms (each call's latency, client
//   side) and threads (the process's peak /proc/self/task count while the
//   calls were in flight; client, server and pool share the process).
#include <benchmark/benchmark.h>

#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <graphrun/op_kernel.h>
#include <graphrun/remote_session.h>
#include <graphrun/server.h>
#include <graphrun/v1/session_service.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/common/small_graph.h"

namespace graphrun::bench {
namespace {

constexpr float kX = 1.5f;
constexpr float kY = 2.0f;

// One server, one local and one remote session on the small graph, shared by
// every benchmark and thread of the process.
struct Fixture {
  SmallGraph sg;
  std::unique_ptr<Server> server;
  std::unique_ptr<Session> local;
  std::unique_ptr<RemoteSession> remote;
  std::unique_ptr<v1::SessionService::Stub> stub;
  float expected = 0;

  Fixture() {
    Result<std::unique_ptr<Server>> started = Server::start();
    check_ok(started.status(), "starting the server");
    server = std::move(*started);
    Result<std::unique_ptr<Session>> s = Session::create(sg.g);
    check_ok(s.status(), "creating the local session");
    local = std::move(*s);
    Result<std::unique_ptr<RemoteSession>> r = RemoteSession::create(server->address(), sg.g);
    check_ok(r.status(), "creating the remote session");
    remote = std::move(*r);
    stub = v1::SessionService::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    Result<std::vector<Tensor>> out = local->run(feeds(), fetches());
    check_ok(out.status(), "reference run");
    expected = (*out)[0].scalar<float>();
  }
  static FeedList feeds() { return {{"x", Tensor(kX)}, {"y", Tensor(kY)}}; }
  static std::vector<TensorRef> fetches() { return {"j"}; }
  // Never destroyed: closing sessions and stopping gRPC during static
  // destruction is not worth the risk in a bench.
  static Fixture& get() {
    static Fixture* const fixture = new Fixture;
    return *fixture;
  }
};

void check_value(benchmark::State& state, const Result<std::vector<Tensor>>& out) {
  if (!out.is_ok()) {
    state.SkipWithError(out.status().to_string().c_str());
    return;
  }
  if ((*out)[0].scalar<float>() != Fixture::get().expected) state.SkipWithError("wrong result");
}

template <typename S>
void run_loop(benchmark::State& state, S& session) {
  const FeedList feeds = Fixture::feeds();
  const std::vector<TensorRef> fetches = Fixture::fetches();
  Result<std::vector<Tensor>> out = session.run(feeds, fetches);  // warm: plan compiled
  for (auto _ : state) {
    out = session.run(feeds, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_value(state, out);
  state.SetItemsProcessed(state.iterations());
}

void BM_RemoteSmall_Session(benchmark::State& state) { run_loop(state, *Fixture::get().local); }
BENCHMARK(BM_RemoteSmall_Session)->UseRealTime();

void BM_RemoteSmall_RemoteSession(benchmark::State& state) {
  run_loop(state, *Fixture::get().remote);
}
BENCHMARK(BM_RemoteSmall_RemoteSession)->UseRealTime();

void BM_RemoteSmall_Stub(benchmark::State& state) {
  Fixture& f = Fixture::get();
  v1::RunRequest request;
  request.set_session_handle(f.remote->handle());
  for (const auto& [name, value] : {std::pair{"x", kX}, std::pair{"y", kY}}) {
    v1::NamedTensorProto* feed = request.add_feed();
    feed->set_name(name);
    *feed->mutable_tensor() = tensor_to_proto(Tensor(value));
  }
  // From a std::string: GCC 12 -O3 misreports add_fetch(const char*) as an
  // overlapping memcpy (-Wrestrict).
  request.add_fetch(std::string("j"));
  v1::RunResponse response;
  grpc::Status status;
  for (auto _ : state) {
    grpc::ClientContext context;
    response.Clear();
    status = f.stub->Run(&context, request, &response);
    benchmark::DoNotOptimize(response);
  }
  if (!status.ok()) state.SkipWithError(status.error_message().c_str());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RemoteSmall_Stub)->UseRealTime();

void BM_RemoteSmall_EmptyRpc(benchmark::State& state) {
  Fixture& f = Fixture::get();
  const v1::ListSessionsRequest request;
  v1::ListSessionsResponse response;
  grpc::Status status;
  for (auto _ : state) {
    grpc::ClientContext context;
    response.Clear();
    status = f.stub->ListSessions(&context, request, &response);
    benchmark::DoNotOptimize(response);
  }
  if (!status.ok()) state.SkipWithError(status.error_message().c_str());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RemoteSmall_EmptyRpc)->UseRealTime();

void BM_RemoteThroughput_Session(benchmark::State& state) {
  run_loop(state, *Fixture::get().local);
}
BENCHMARK(BM_RemoteThroughput_Session)->Threads(1)->Threads(8)->UseRealTime();

void BM_RemoteThroughput_RemoteSession(benchmark::State& state) {
  run_loop(state, *Fixture::get().remote);
}
BENCHMARK(BM_RemoteThroughput_RemoteSession)->Threads(1)->Threads(8)->UseRealTime();

// BenchSleep(x; ms): y = x after `ms` milliseconds (a kernel that holds its
// pool thread, as a slow model step would).
class SleepOp final : public OpKernel {
 public:
  explicit SleepOp(int64_t ms) : ms_(ms) {}
  Status compute(OpKernelContext& ctx) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return ctx.set_output(0, ctx.input(0));
  }

 private:
  const int64_t ms_;
};

void register_sleep_op() {
  static const Status registered =
      OpRegistry::global().add(OpDef("BenchSleep")
                                   .input("x", DType::kFloat32)
                                   .output("y", DType::kFloat32)
                                   .attr("ms", int64_t{100})
                                   .shape_fn(shape_fns::unchanged),
                               [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
                                 GRAPHRUN_ASSIGN_OR_RETURN(int64_t ms, c.attr<int64_t>("ms"));
                                 return std::make_unique<SleepOp>(ms);
                               });
  check_ok(registered, "registering BenchSleep");
}

std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

void BM_RemoteInFlight_SlowStep(benchmark::State& state) {
  register_sleep_op();
  const int n = static_cast<int>(state.range(0));
  std::unique_ptr<Server> server = Server::start().value();
  auto stub = v1::SessionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  Graph g;
  Output c = ops::Const(g, Tensor(2.0f), "c");
  Output slept = g.add_node(NodeSpec{.op = "BenchSleep",
                                     .name = "sleep",
                                     .inputs = {c},
                                     .attrs = {{"ms", AttrValue(int64_t{100})}}})
                     .value()
                     ->output(0);
  ops::Identity(g, slept, "out");
  v1::CreateSessionRequest create;
  *create.mutable_graph_def() = graph_to_graph_def(g).value();
  create.mutable_config()->set_inter_op_threads(2);
  v1::CreateSessionResponse created;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub->CreateSession(&context, create, &created);
    if (!status.ok()) return state.SkipWithError(status.error_message().c_str());
  }
  v1::RunRequest request;
  request.set_session_handle(created.session_handle());
  request.add_fetch(std::string("out"));

  struct Call {
    grpc::ClientContext context;
    v1::RunResponse response;
    grpc::Status status;
    std::chrono::steady_clock::time_point start;
    std::chrono::nanoseconds latency{0};
  };
  std::vector<double> latencies_ms;
  double steps_per_s = 0;
  std::size_t peak_threads = 0;
  int failed = 0;
  std::string error;
  for (auto _ : state) {
    std::vector<std::unique_ptr<Call>> calls;
    calls.reserve(static_cast<std::size_t>(n));
    std::mutex mu;
    std::condition_variable cv;
    int pending = n;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      calls.push_back(std::make_unique<Call>());
      Call* call = calls.back().get();
      call->start = std::chrono::steady_clock::now();
      stub->async()->Run(&call->context, &request, &call->response, [&, call](grpc::Status s) {
        call->latency = std::chrono::steady_clock::now() - call->start;
        call->status = std::move(s);
        const std::lock_guard lock(mu);
        if (--pending == 0) cv.notify_all();
      });
    }
    {
      std::unique_lock lock(mu);
      while (!cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return pending == 0; })) {
        peak_threads = std::max(peak_threads, thread_count());
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    steps_per_s = n / seconds;
    for (const auto& call : calls) {
      if (!call->status.ok()) {
        ++failed;
        if (error.empty()) error = call->status.error_message();
        continue;
      }
      latencies_ms.push_back(std::chrono::duration<double, std::milli>(call->latency).count());
    }
  }
  if (failed > 0) return state.SkipWithError(("failed calls: " + error).c_str());
  std::sort(latencies_ms.begin(), latencies_ms.end());
  const auto percentile = [&](double p) {
    if (latencies_ms.empty()) return 0.0;
    const auto i = static_cast<std::size_t>(p * static_cast<double>(latencies_ms.size() - 1));
    return latencies_ms[i];
  };
  state.counters["steps_per_s"] = steps_per_s;
  state.counters["p50_ms"] = percentile(0.50);
  state.counters["p99_ms"] = percentile(0.99);
  state.counters["threads"] = static_cast<double>(peak_threads);
  state.SetItemsProcessed(state.iterations() * n);
  server->shutdown();
}
BENCHMARK(BM_RemoteInFlight_SlowStep)
    ->Arg(1000)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace graphrun::bench
