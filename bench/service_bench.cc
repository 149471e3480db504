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
//                  (one channel; the server runs each call on its own threads)
#include <benchmark/benchmark.h>

#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <graphrun/remote_session.h>
#include <graphrun/server.h>
#include <graphrun/v1/session_service.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
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

}  // namespace
}  // namespace graphrun::bench
