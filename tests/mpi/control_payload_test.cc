// The payloads of the distributed session's control messages, read from
// bytes a peer sent (scheduler/mpi/src/control.h, ship.h): every
// truncation and thousands of byte-level mutations of real payloads are
// refused or read, never a crash or an out-of-bounds read (ASan in CI),
// and a header never makes the reader allocate more than the message
// holds. No MPI: the payloads are plain bytes.
#include <google/protobuf/stubs/logging.h>
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/ship.h"
#include "scheduler/mpi/src/wire.h"
#include "tests/mpi/payload_graphs.h"
#include "tests/testing/op_harness.h"

namespace graphrun::mpi::internal {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::StatusIs;

// A graph of two ranks (over the global registry, where the partition's
// Send and Recv ops are added).
Graph two_rank_graph() {
  register_ops(OpRegistry::global());
  return graphrun::testing::product_across_two_ranks();
}

// Calls `read` on `payload` cut at every length, then on `mutations`
// copies with one to four bytes changed: it must return without crashing
// (its result is not checked: a mutation may still be well formed).
template <typename Read>
void survives_truncation_and_mutation(const std::string& payload, Read read, int mutations) {
  // Mutated strings are often invalid UTF-8, which protobuf logs: one line
  // each, nothing the test needs.
  google::protobuf::LogHandler* const old_handler = google::protobuf::SetLogHandler(nullptr);
  for (std::size_t n = 0; n < payload.size(); ++n) read(std::string_view(payload).substr(0, n));
  std::mt19937_64 random(20261206);
  for (int m = 0; m < mutations; ++m) {
    std::string bytes = payload;
    const int changes = 1 + static_cast<int>(random() % 4);
    for (int c = 0; c < changes; ++c) {
      bytes[random() % bytes.size()] = static_cast<char>(random());
    }
    read(bytes);
  }
  google::protobuf::SetLogHandler(old_handler);
}

TEST(ControlPayloadTest, ReaderReadsWhatTheWriterWrote) {
  Writer w;
  w.u64(7).i64(-3).str("name").tensor(Tensor{1.5f, 2.5f}).status(invalid_argument("bad"));
  w.status(Status::ok());
  const std::string bytes = w.take();
  Reader r(bytes);
  EXPECT_EQ(*r.u64(), 7U);
  EXPECT_EQ(*r.i64(), -3);
  EXPECT_EQ(*r.str(), "name");
  Result<Tensor> t = r.tensor();
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->shape(), Shape{2});
  EXPECT_EQ(t->flat<float>()[1], 2.5f);
  EXPECT_THAT(r.status(), StatusIs(StatusCode::kInvalidArgument, "bad"));
  EXPECT_THAT(r.status(), IsOk());
  EXPECT_THAT(r.u64().status(), StatusIs(StatusCode::kInternal, "ends after"));
}

// A bool tensor's bytes read as 0 or 1, whatever byte came: any other
// byte would be an invalid bool for the kernels that read it.
TEST(ControlPayloadTest, ABoolTensorsBytesReadAsZeroOrOne) {
  std::string bytes = Writer().tensor(Tensor{true, false, true}).take();
  ASSERT_EQ(bytes.size(), sizeof(Header) + 3);  // the header, then the bytes
  bytes[sizeof(Header)] = 5;
  bytes[sizeof(Header) + 2] = static_cast<char>(0xff);
  Result<Tensor> t = Reader(bytes).tensor();
  ASSERT_THAT(t, IsOk());
  const auto* b = static_cast<const unsigned char*>(t->raw_data());
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(b[2], 1);
}

TEST(ControlPayloadTest, ATruncatedPayloadIsInternalAtEveryLength) {
  Writer w;
  w.str("step").tensor(Tensor{1, 2, 3}).status(not_found("x"));
  const std::string bytes = w.take();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    Reader r(std::string_view(bytes).substr(0, n));
    Status s = r.str().status();
    if (s.is_ok()) s = r.tensor().status();
    if (s.is_ok()) s = r.status();
    EXPECT_EQ(s.code(), StatusCode::kInternal) << "cut at " << n << " of " << bytes.size();
  }
}

// A header that claims more bytes than the message holds is refused
// before any tensor is allocated: a 1 TiB claim costs nothing.
TEST(ControlPayloadTest, AHeaderClaimingMoreBytesThanTheMessageAllocatesNothing) {
  Header h;
  h.dtype = static_cast<int32_t>(DType::kFloat32);
  h.rank = 2;
  h.dims[0] = int64_t{1} << 20;
  h.dims[1] = int64_t{1} << 18;
  h.bytes = uint64_t{1} << 40;
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
  bytes += "tail";
  const int64_t before = graphrun::internal::tensor_buffers_allocated_by_this_thread();
  Reader r(bytes);
  EXPECT_THAT(r.tensor().status(), StatusIs(StatusCode::kInternal, "more expected"));
  EXPECT_EQ(graphrun::internal::tensor_buffers_allocated_by_this_thread(), before);

  // A header whose byte count fits the message but whose shape claims a
  // terabyte: refused by the count, before the shape's tensor is
  // allocated (it was allocated first, and the count compared after).
  h.bytes = 4;
  std::string small_count(reinterpret_cast<const char*>(&h), sizeof h);
  small_count += "tail";
  Reader r3(small_count);
  EXPECT_THAT(r3.tensor().status(), StatusIs(StatusCode::kInternal, "a header of 4 bytes"));
  EXPECT_EQ(graphrun::internal::tensor_buffers_allocated_by_this_thread(), before);
  // The same check on its own: an unknown dimension, and a count that
  // overflows, are refused too.
  EXPECT_THAT(check_bytes(DType::kFloat32, Shape{2, 3}, 24), IsOk());
  EXPECT_THAT(check_bytes(DType::kFloat32, Shape{2, 3}, 23),
              StatusIs(StatusCode::kInternal, "a header of 23 bytes"));
  EXPECT_THAT(check_bytes(DType::kBool, Shape{Shape::kUnknownDim}, ~uint64_t{0}),
              StatusIs(StatusCode::kInternal, "unknown shape"));
  EXPECT_THAT(check_bytes(DType::kFloat64, Shape{int64_t{1} << 31, int64_t{1} << 31}, 0),
              StatusIs(StatusCode::kInternal, "a header of 0 bytes"));

  // A byte count that disagrees with the shape: Internal naming both.
  Header lying = header_of(Tensor{1.0f, 2.0f}, 0, 0);
  lying.bytes = 4;
  std::string short_bytes(reinterpret_cast<const char*>(&lying), sizeof lying);
  short_bytes += std::string(8, '\0');
  Reader r2(short_bytes);
  EXPECT_THAT(r2.tensor().status(), StatusIs(StatusCode::kInternal, "a header of 4 bytes"));
}

TEST(ControlPayloadTest, APartSurvivesEveryTruncationAndMutation) {
  const Graph g = two_rank_graph();
  ASSERT_THAT(g.status(), IsOk());
  Result<std::string> payload = encode_part(g, 2, 1, 42);
  ASSERT_THAT(payload, IsOk());
  // The payload as sent reads back as rank 1's part.
  Result<std::unique_ptr<Partition>> part = decode_part(*payload, 1, 42);
  ASSERT_THAT(part, IsOk());
  EXPECT_NE((*part)->local().find_node("product"), nullptr);
  EXPECT_EQ((*part)->local().find_node("y"), nullptr);
  int refused = 0;
  survives_truncation_and_mutation(
      *payload,
      [&](std::string_view bytes) {
        if (!decode_part(bytes, 1, 42).is_ok()) ++refused;
      },
      3000);
  // Every truncation at least is refused.
  EXPECT_GE(refused, static_cast<int>(payload->size()));
}

TEST(ControlPayloadTest, ADeltaSurvivesEveryTruncationAndMutation) {
  Graph delta;
  Output a = ops::Const(delta, Tensor(2.0f), "a");
  ops::Identity(delta, a, "b");
  ASSERT_THAT(delta.status(), IsOk());
  const std::vector<Stub> stubs{{.name = "s0", .kind = Stub::kTensor, .ref = "x:0", .edge = 0},
                                {.name = "s1", .kind = Stub::kRecv, .ref = "", .edge = 3}};
  Result<std::string> payload = encode_delta(delta, stubs);
  ASSERT_THAT(payload, IsOk());
  auto decoded = decode_delta(*payload);
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->first.num_nodes(), 2);
  ASSERT_EQ(decoded->second.size(), 2U);
  EXPECT_EQ(decoded->second[1].kind, Stub::kRecv);
  EXPECT_EQ(decoded->second[1].edge, 3);
  int refused = 0;
  survives_truncation_and_mutation(
      *payload,
      [&](std::string_view bytes) {
        if (!decode_delta(bytes).is_ok()) ++refused;
      },
      3000);
  EXPECT_GE(refused, static_cast<int>(payload->size()));
}

}  // namespace
}  // namespace graphrun::mpi::internal
