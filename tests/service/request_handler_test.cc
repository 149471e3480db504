// RequestHandler without gRPC: the response size limit on Run and
// PartialRun (sync and async), and the byte counts of the request checks
// (zero-element shapes in any dimension order, saturated counts).
#include <fmt/format.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <graphrun/graph_def.h>
#include <graphrun/ops.h>
#include <graphrun/session_registry.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "service/src/request_handler.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::StatusIs;
using service_internal::CallContext;
using service_internal::Method;
using service_internal::RequestHandler;
using ::testing::HasSubstr;

// A session whose node `f` is a Fill of 65536 floats (256 KiB), and `y` an
// Identity of the float placeholder `x`.
std::string create_session(SessionRegistry& registry) {
  Graph g;
  ops::Fill(g, ops::Const(g, Tensor::vector<int32_t>({65536})), ops::Const(g, Tensor(1.0f)), "f");
  ops::Identity(g, ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x"), "y");
  auto created = registry.create(graph_to_graph_def(g).value());
  EXPECT_THAT(created, IsOk());
  return created.is_ok() ? created->handle : std::string();
}

constexpr int64_t kFillBytes = 65536 * 4;
constexpr int64_t kLimit = 1 << 20;  // four fetches of `f` fit, five do not

v1::RunRequest fetch_f(const std::string& handle, int times) {
  v1::RunRequest request;
  request.set_session_handle(handle);
  for (int i = 0; i < times; ++i) request.add_fetch("f");
  return request;
}

void expect_response_too_large(const Status& status, std::string_view method) {
  EXPECT_THAT(status, StatusIs(StatusCode::kResourceExhausted, "max_message_bytes"));
  EXPECT_THAT(status.message(), HasSubstr(fmt::format("the {} response", method)));
  EXPECT_THAT(status.message(), HasSubstr(fmt::format("{} bytes", kLimit)));
  EXPECT_THAT(status.message(), HasSubstr(fmt::format("'f' ({} bytes)", kFillBytes)));
}

// Fetching one tensor many times: each fetch is encoded in full, so the
// response is refused from the fetches' sizes (ResourceExhausted naming
// the limit and the largest fetch), not built and then failed by gRPC.
TEST(RequestHandlerTest, RunResponseOverTheLimitIsResourceExhausted) {
  SessionRegistry registry;
  RequestHandler handler(registry, kLimit);
  const std::string handle = create_session(registry);

  v1::RunResponse fits;
  ASSERT_THAT(handler.run(fetch_f(handle, 3), CallContext{}, fits), IsOk());
  EXPECT_EQ(fits.tensor_size(), 3);

  v1::RunResponse too_large;
  const Status status = handler.run(fetch_f(handle, 5), CallContext{}, too_large);
  expect_response_too_large(status, "Run");
  EXPECT_THAT(status.message(), HasSubstr("5 fetched tensors"));
  EXPECT_EQ(too_large.tensor_size(), 0);  // nothing was copied in
}

// The asynchronous path (the one the gRPC service uses for Run).
TEST(RequestHandlerTest, AsyncRunResponseOverTheLimitIsResourceExhausted) {
  SessionRegistry registry;
  RequestHandler handler(registry, kLimit);
  const std::string handle = create_session(registry);
  const std::string bytes = fetch_f(handle, 20).SerializeAsString();
  std::promise<Status> answered;
  std::shared_ptr<void> hold;
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  handler.handle_async(
      Method::kRun, in, static_cast<int64_t>(bytes.size()), CallContext{},
      [&](Result<std::unique_ptr<google::protobuf::Message>> out, std::shared_ptr<void> h) {
        hold = std::move(h);
        answered.set_value(out.status());
      });
  expect_response_too_large(answered.get_future().get(), "Run");
}

TEST(RequestHandlerTest, PartialRunResponseOverTheLimitIsResourceExhausted) {
  SessionRegistry registry;
  RequestHandler handler(registry, kLimit);
  const std::string handle = create_session(registry);
  v1::PartialRunSetupRequest setup;
  setup.set_session_handle(handle);
  setup.add_fetch("f");
  v1::PartialRunSetupResponse opened;
  ASSERT_THAT(handler.partial_run_setup(setup, CallContext{}, opened), IsOk());
  v1::PartialRunRequest request;
  request.set_session_handle(handle);
  request.set_partial_run_handle(opened.partial_run_handle());
  for (int i = 0; i < 5; ++i) request.add_fetch("f");
  v1::RunResponse response;
  expect_response_too_large(handler.partial_run(request, CallContext{}, response), "PartialRun");
}

// The trace's statistics count too: the encoded size is checked as well.
TEST(RequestHandlerTest, EncodedSizeIsCheckedWithTheTrace) {
  SessionRegistry registry;
  RequestHandler handler(registry, kFillBytes + 2);  // the fetch and its name fit, framing not
  const std::string handle = create_session(registry);
  v1::RunRequest request = fetch_f(handle, 1);
  request.mutable_options()->set_trace(true);
  v1::RunResponse response;
  EXPECT_THAT(handler.run(request, CallContext{}, response),
              StatusIs(StatusCode::kResourceExhausted, "the step statistics"));
}

// A float feed of `dims`, no values.
v1::NamedTensorProto float_feed(std::string name, const std::vector<int64_t>& dims) {
  v1::NamedTensorProto feed;
  feed.set_name(std::move(name));
  *feed.mutable_tensor() = tensor_to_proto(Tensor(0.0f));
  feed.mutable_tensor()->clear_tensor_content();
  for (const int64_t d : dims)
    feed.mutable_tensor()->mutable_tensor_shape()->add_dim()->set_size(d);
  return feed;
}

// A zero dimension anywhere makes a tensor of 0 bytes: [1e5, 1e5, 0] and
// [2^40, 0] are fed as [0, 1e5, 1e5] is, whatever the order (the count
// saturated on the first dimensions before it saw the 0).
TEST(RequestHandlerTest, ZeroElementFeedsCountNoBytesInAnyOrder) {
  SessionRegistry registry;
  RequestHandler handler(registry);
  const std::string handle = create_session(registry);
  const std::vector<std::vector<int64_t>> shapes = {
      {0, 100000, 100000}, {100000, 100000, 0}, {100000, 0, 100000}, {int64_t{1} << 40, 0}};
  for (const std::vector<int64_t>& dims : shapes) {
    v1::RunRequest request;
    request.set_session_handle(handle);
    *request.add_feed() = float_feed("x", dims);
    request.add_fetch("y");
    v1::RunResponse response;
    ASSERT_THAT(handler.run(request, CallContext{}, response), IsOk()) << dims.size();
    ASSERT_EQ(response.tensor_size(), 1);
    EXPECT_EQ(response.tensor(0).tensor().tensor_shape().dim_size(), static_cast<int>(dims.size()));
  }
}

// A saturated count is "more than" the largest count, not a made-up size.
TEST(RequestHandlerTest, HugeFeedIsReportedAsMoreThanTheLimitOfACount) {
  SessionRegistry registry;
  RequestHandler handler(registry);
  const std::string handle = create_session(registry);
  v1::RunRequest request;
  request.set_session_handle(handle);
  *request.add_feed() = float_feed("x", {int64_t{1} << 40});
  request.add_fetch("y");
  v1::RunResponse response;
  const Status status = handler.run(request, CallContext{}, response);
  EXPECT_THAT(status, StatusIs(StatusCode::kResourceExhausted,
                               "request feeds more than 2147483648 tensor bytes"));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("2147483649")));
}

// The same for a GraphDef's Const values: [1e5, 1e5, 0] takes no bytes.
TEST(RequestHandlerTest, ZeroElementConstsCountNoBytesInAnyOrder) {
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{0, 100000, 100000}, std::vector<int64_t>{100000, 100000, 0}}) {
    SessionRegistry registry;
    v1::GraphDef def;
    v1::NodeDef* node = def.add_node();
    node->set_name("c");
    node->set_op("Const");
    const v1::NamedTensorProto value = float_feed("c", dims);
    (*node->mutable_attr())["dtype"].set_type(value.tensor().dtype());
    *(*node->mutable_attr())["value"].mutable_tensor() = value.tensor();
    EXPECT_THAT(registry.create(def), IsOk()) << dims[0];
  }
}

}  // namespace
}  // namespace graphrun
