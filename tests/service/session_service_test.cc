// The gRPC SessionService end to end: a Server in-process on 127.0.0.1:0,
// driven by the generated stub over an insecure channel.
#include <graphrun/graph_def.h>
#include <graphrun/ops.h>
#include <graphrun/server.h>
#include <graphrun/session_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/service/slow_graph.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::slow_graph;

using ::graphrun::testing::IsOk;
using ::graphrun::testing::TensorEq;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class SessionServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Server::start().value();
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::SessionService::NewStub(channel_);
  }

  std::string create(const Graph& g) {
    v1::CreateSessionRequest request;
    *request.mutable_graph_def() = graph_to_graph_def(g).value();
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->CreateSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_handle();
  }

  // A Run of session `handle` fetching `fetch`, nothing fed.
  grpc::Status run_fetch(const std::string& handle, const std::string& fetch) {
    v1::RunRequest request;
    request.set_session_handle(handle);
    request.add_fetch(fetch);
    v1::RunResponse response;
    grpc::ClientContext context;
    return stub_->Run(&context, request, &response);
  }

  static void add_feed(google::protobuf::RepeatedPtrField<v1::NamedTensorProto>* feeds,
                       const std::string& name, const Tensor& value) {
    v1::NamedTensorProto* feed = feeds->Add();
    feed->set_name(name);
    *feed->mutable_tensor() = tensor_to_proto(value);
  }

  static Tensor fetched(const v1::RunResponse& response, int i) {
    return tensor_from_proto(response.tensor(i).tensor()).value();
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SessionService::Stub> stub_;
};

TEST_F(SessionServiceTest, RunFeedsAndFetchesByName) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output y = ops::Mul(g, x, ops::Const(g, Tensor(2.0f)), "y");
  ops::Add(g, y, x, "z");
  const std::string handle = create(g);
  ASSERT_THAT(handle, StartsWith("s-"));

  v1::RunRequest request;
  request.set_session_handle(handle);
  add_feed(request.mutable_feed(), "x", Tensor::vector<float>({1, 2, 3}));
  request.add_fetch("z");
  request.add_fetch("y:0");
  request.mutable_options()->set_trace(true);
  v1::RunResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->Run(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.tensor_size(), 2);
  EXPECT_EQ(response.tensor(0).name(), "z");
  EXPECT_EQ(response.tensor(1).name(), "y:0");
  EXPECT_THAT(fetched(response, 0), TensorEq(Tensor::vector<float>({3, 6, 9})));
  EXPECT_THAT(fetched(response, 1), TensorEq(Tensor::vector<float>({2, 4, 6})));
  EXPECT_GE(response.metadata().step_stats().node_stats_size(), 2);

  grpc::ClientContext list_context;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(&list_context, {}, &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).session_handle(), handle);
  EXPECT_EQ(list.sessions(0).num_nodes(), 4);
}

// The seed example: a partial run over several RPCs whose expensive stage
// runs once. The stage counts its executions in a variable and draws a
// random number; both later fetches see the same draw.
TEST_F(SessionServiceTest, PartialRunAcrossRpcsRunsTheExpensiveStageOnce) {
  Graph g;
  Output count = ops::Variable(g, Tensor(0.0f), "count");
  Output inc = ops::AssignAdd(g, count, ops::Const(g, Tensor(1.0f)), {}, "inc");
  ops::GlobalVariablesInitializer(g, "init");
  Output expensive;
  {
    auto deps = g.control_dependencies({inc.node()});
    expensive = ops::Identity(g, ops::RandomUniform(g, Shape{}), "expensive");
  }
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{}, "b");
  ops::Mul(g, expensive, a, "y1");
  ops::Mul(g, expensive, b, "y2");
  const std::string handle = create(g);

  {
    v1::RunRequest init;
    init.set_session_handle(handle);
    init.add_target("init");
    grpc::ClientContext context;
    v1::RunResponse response;
    ASSERT_TRUE(stub_->Run(&context, init, &response).ok());
  }
  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(handle);
  setup.add_feed("a");
  setup.add_feed("b");
  setup.add_fetch("y1");
  setup.add_fetch("y2");
  v1::PartialRunSetupResponse setup_response;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->PartialRunSetup(&context, setup, &setup_response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_THAT(setup_response.partial_run_handle(), StartsWith("pr-"));

  auto step = [&](const std::string& feed, float value, const std::string& fetch) {
    v1::PartialRunRequest request;
    request.set_session_handle(handle);
    request.set_partial_run_handle(setup_response.partial_run_handle());
    add_feed(request.mutable_feed(), feed, Tensor(value));
    request.add_fetch(fetch);
    v1::RunResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->PartialRun(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return fetched(response, 0).scalar<float>();
  };
  const float y1 = step("a", 2.0f, "y1");
  const float y2 = step("b", 4.0f, "y2");
  EXPECT_EQ(y1 / 2.0f, y2 / 4.0f);  // one draw (powers of two scale exactly)
  EXPECT_NE(y1, 0.0f);

  v1::RunRequest read;
  read.set_session_handle(handle);
  read.add_fetch("count");
  v1::RunResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->Run(&context, read, &response).ok());
  EXPECT_THAT(fetched(response, 0), TensorEq(Tensor(1.0f)));  // the stage ran once
}

TEST_F(SessionServiceTest, ErrorsNameTheTensor) {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  const std::string handle = create(g);
  const grpc::Status status = run_fetch(handle, "nosuch:0");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("nosuch"));

  // A bad feed value is named by its feed.
  v1::RunRequest bad_feed;
  bad_feed.set_session_handle(handle);
  v1::NamedTensorProto* feed = bad_feed.add_feed();
  feed->set_name("one");
  feed->mutable_tensor()->set_dtype(v1::DT_FLOAT);
  feed->mutable_tensor()->set_tensor_content("abc");
  bad_feed.add_fetch("one");
  grpc::ClientContext feed_context;
  v1::RunResponse response;
  const grpc::Status feed_status = stub_->Run(&feed_context, bad_feed, &response);
  EXPECT_EQ(feed_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(feed_status.error_message(), StartsWith("feed 'one'"));
}

TEST_F(SessionServiceTest, BadGraphIsInvalidArgumentNamingTheNode) {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  v1::CreateSessionRequest request;
  *request.mutable_graph_def() = graph_to_graph_def(g).value();
  request.mutable_graph_def()->mutable_node(0)->add_input("ghost");
  v1::CreateSessionResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->CreateSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), StartsWith("node 'one'"));
}

TEST_F(SessionServiceTest, RequestTimeoutIsDeadlineExceeded) {
  const std::string handle = create(slow_graph());
  v1::RunRequest request;
  request.set_session_handle(handle);
  request.add_fetch("slow");
  request.mutable_options()->set_timeout_ms(50);
  v1::RunResponse response;
  grpc::ClientContext context;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = stub_->Run(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(SessionServiceTest, CallDeadlineReachesTheStep) {
  const std::string handle = create(slow_graph());
  v1::RunRequest request;
  request.set_session_handle(handle);
  request.add_fetch("slow");
  v1::RunResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  const grpc::Status status = stub_->Run(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server stopped the step too: a shutdown that would let the handler
  // run on for a minute returns at once.
  const auto start = std::chrono::steady_clock::now();
  server_->shutdown(std::chrono::seconds(60));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(SessionServiceTest, ClientCancelStopsTheStep) {
  const std::string handle = create(slow_graph());
  v1::RunRequest request;
  request.set_session_handle(handle);
  request.add_fetch("slow");
  v1::RunResponse response;
  grpc::ClientContext context;
  std::thread canceller([&] {
    // Long enough for the step to be running (the chain takes seconds).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    context.TryCancel();
  });
  const grpc::Status status = stub_->Run(&context, request, &response);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  // The server stopped the step: a shutdown that would let it run on for a
  // minute returns at once (it does not without the cancellation).
  const auto start = std::chrono::steady_clock::now();
  server_->shutdown(std::chrono::seconds(60));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(SessionServiceTest, ClientCancelEndsThePartialRun) {
  Graph g = slow_graph();
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  ops::Identity(g, x, "x_out");
  const std::string handle = create(g);
  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(handle);
  setup.add_feed("x");
  setup.add_fetch("slow");
  setup.add_fetch("x_out");
  v1::PartialRunSetupResponse setup_response;
  grpc::ClientContext setup_context;
  ASSERT_TRUE(stub_->PartialRunSetup(&setup_context, setup, &setup_response).ok());

  v1::PartialRunRequest request;
  request.set_session_handle(handle);
  request.set_partial_run_handle(setup_response.partial_run_handle());
  request.add_fetch("slow");
  v1::RunResponse response;
  grpc::ClientContext context;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    context.TryCancel();
  });
  EXPECT_EQ(stub_->PartialRun(&context, request, &response).error_code(),
            grpc::StatusCode::CANCELLED);
  canceller.join();
  // The server cancelled the whole partial run and forgot it: a call on it
  // is NOT_FOUND once the cancelled call has returned there. One arriving
  // while that call is still ending is refused as in use, or (having waited
  // for the cancellation to end the run) answered CANCELLED.
  v1::PartialRunRequest next;
  next.set_session_handle(handle);
  next.set_partial_run_handle(setup_response.partial_run_handle());
  add_feed(next.mutable_feed(), "x", Tensor(1.0f));
  next.add_fetch("x_out");
  grpc::Status after;
  const auto start = std::chrono::steady_clock::now();
  do {
    v1::RunResponse next_response;
    grpc::ClientContext next_context;
    after = stub_->PartialRun(&next_context, next, &next_response);
  } while ((after.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
            after.error_code() == grpc::StatusCode::CANCELLED) &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  EXPECT_EQ(after.error_code(), grpc::StatusCode::NOT_FOUND) << after.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(SessionServiceTest, CloseThenRunIsNotFound) {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  const std::string handle = create(g);
  v1::CloseSessionRequest close;
  close.set_session_handle(handle);
  v1::CloseSessionResponse closed;
  grpc::ClientContext close_context;
  ASSERT_TRUE(stub_->CloseSession(&close_context, close, &closed).ok());

  const grpc::Status status = run_fetch(handle, "one");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr(handle));
}

TEST_F(SessionServiceTest, LongStatusMessagesAreCapped) {
  // An unknown node whose 10 000-character name is echoed in the message.
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  const std::string handle = create(g);
  const std::string name(10000, 'n');
  const grpc::Status status = run_fetch(handle, name);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_THAT(status.error_message(), HasSubstr("nnnnnnnn"));
  EXPECT_THAT(status.error_message(), ::testing::EndsWith(" bytes cut)"));
}

TEST(CapStatusMessageTest, KeepsTheHeadAndCountsTheCut) {
  EXPECT_EQ(cap_status_message("short", 10), "short");
  const std::string message = "node 'a' (Add): " + std::string(100, 'x');
  const std::string capped = cap_status_message(message, 40);
  EXPECT_EQ(capped.size(), 40u);
  EXPECT_THAT(capped, StartsWith("node 'a' (Add): xxx"));
  const std::size_t head = capped.find("... (");
  ASSERT_NE(head, std::string::npos);
  EXPECT_EQ(capped.substr(head), "... (" + std::to_string(message.size() - head) + " bytes cut)");
  // A cut never splits a UTF-8 character: "é" is two bytes.
  std::string accents;
  for (int i = 0; i < 50; ++i) accents += "\xc3\xa9";
  const std::string cut = cap_status_message(accents, 41);
  const std::size_t accent_head = cut.find("...");
  EXPECT_EQ(accent_head % 2, 0u);
  EXPECT_LE(encoded_message_size(cut), 41u);
}

// gRPC percent-encodes the message in metadata: non-ASCII bytes, control
// bytes and '%' take three bytes each, so the cap counts them as three (a
// 700-"é" name made a 4,096-byte message 8 KiB on the wire, past a client's
// metadata limit: RESOURCE_EXHAUSTED instead of the real error).
TEST(CapStatusMessageTest, CountsPercentEncodedBytesAsGrpcSendsThem) {
  EXPECT_EQ(encoded_message_size("plain text"), 10u);
  EXPECT_EQ(encoded_message_size("100%"), 6u);
  EXPECT_EQ(encoded_message_size("\xc3\xa9\x01\n"), 12u);
  std::string accents;
  for (int i = 0; i < 700; ++i) accents += "\xc3\xa9";
  const std::string capped = cap_status_message("node '" + accents + "': not found", 4096);
  EXPECT_LE(encoded_message_size(capped), 4096u);
  EXPECT_THAT(capped, ::testing::EndsWith(" bytes cut)"));
  EXPECT_THAT(capped, StartsWith("node '\xc3\xa9"));
  const std::string percents(3000, '%');
  EXPECT_LE(encoded_message_size(cap_status_message(percents, 4096)), 4096u);
  // What fits once encoded is kept whole.
  const std::string fits(1000, '%');
  EXPECT_EQ(cap_status_message(fits, 4096), fits);
}

// The same end to end: a fetch name of 700 "é" and one of 1,500 "%" come
// back as NOT_FOUND naming them, not as a metadata-size error.
TEST_F(SessionServiceTest, NonAsciiNamesInErrorsFitTheClientsMetadataLimit) {
  Graph g;
  ops::Const(g, Tensor(1.0f), "one");
  const std::string handle = create(g);
  std::string accents;
  for (int i = 0; i < 700; ++i) accents += "\xc3\xa9";
  for (const std::string& name : {accents, std::string(1500, '%'), std::string(1500, '\x01')}) {
    const grpc::Status status = run_fetch(handle, name);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  }
}

}  // namespace
}  // namespace graphrun
