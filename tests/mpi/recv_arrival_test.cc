// What a Recv makes of a message on its tag (scheduler/mpi/src/wire.h,
// read_arrival): packets written as a Send writes them (write_packet) read
// back as the tensor sent; a packet of another key or an earlier
// invocation is stale, with any bytes after it counted for the drain; and
// a wrong dtype or shape, a later invocation or a malformed header is
// refused, naming the peer, with nothing allocated for a byte count that
// is not the shape's. No MPI: a received message is plain bytes.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "scheduler/mpi/src/wire.h"
#include "tests/testing/op_harness.h"

namespace graphrun::mpi::internal {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using Kind = Arrival::Kind;

constexpr uint64_t kHash = 0x5eed'f00d'1234'abcdULL;
constexpr uint64_t kInvocation = 3000;  // past 2^10: the compact word's bits are not zero
constexpr int kPeer = 1;

// `t` as a Send writes it, received into a Packet as a Recv receives it
// (header.bytes set to the compact marker first; a compact message leaves
// the bytes past its own alone).
Packet sent(const Tensor& t, uint64_t hash = kHash, uint64_t invocation = kInvocation) {
  Packet message;
  const std::size_t bytes = write_packet(message, t, hash, invocation);
  Packet received;
  received.header.bytes = kCompactMarker;
  std::memcpy(&received, &message, bytes);
  return received;
}

RecvExpectation expecting(DType dtype, const Shape& shape) {
  return RecvExpectation{
      .key_hash = kHash, .invocation = kInvocation, .dtype = dtype, .shape = &shape, .peer = kPeer};
}

TEST(RecvArrivalTest, WhatASendWritesReadsBackAsTheTensorSent) {
  const Shape unknown = Shape::unknown();
  const std::vector<Tensor> tensors{
      Tensor(2.5f),                                // compact, 4 bytes
      Tensor(int64_t{-7}),                         // compact, 8 bytes
      Tensor(true),                                // compact, 1 byte
      Tensor(DType::kFloat64, Shape{1, 1, 1}),     // compact, rank 3
      Tensor{1.0f, 2.0f, 3.0f},                    // a header and its bytes
      Tensor(DType::kInt32, Shape{2, 0}),          // a header and no bytes
      Tensor(DType::kFloat64, Shape{8, 8}),        // 512 bytes: the largest inline
      Tensor{int64_t{1}, int64_t{2}, int64_t{3}},  // int64 inline
  };
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.debug_type());
    // Against the Recv's own full shape, and against an unknown shape.
    for (const Shape* shape : {&t.shape(), &unknown}) {
      const Arrival a = read_arrival(sent(t), expecting(t.dtype(), *shape));
      ASSERT_EQ(a.kind, Kind::kValue) << a.status.to_string();
      EXPECT_THAT(a.value, TensorEq(t));
    }
  }
}

TEST(RecvArrivalTest, ALargeTensorsBytesFollowIntoATensorOfItsShape) {
  const Tensor t(DType::kFloat32, Shape{3, 100});
  const Shape declared{Shape::kUnknownDim, 100};
  const Arrival a = read_arrival(sent(t), expecting(DType::kFloat32, declared));
  ASSERT_EQ(a.kind, Kind::kFollows) << a.status.to_string();
  EXPECT_EQ(a.value.dtype(), DType::kFloat32);
  EXPECT_EQ(a.value.shape(), (Shape{3, 100}));
  EXPECT_EQ(a.value.byte_size(), 1200U);
}

TEST(RecvArrivalTest, AnotherKeysOrAnEarlierInvocationsMessageIsStale) {
  const Shape two{2};
  const RecvExpectation e = expecting(DType::kFloat32, two);
  // A header and its bytes: nothing follows.
  Arrival a = read_arrival(sent(Tensor{1.0f, 2.0f}, kHash + 1), e);
  EXPECT_EQ(a.kind, Kind::kStale);
  EXPECT_EQ(a.follows, 0U);
  a = read_arrival(sent(Tensor{1.0f, 2.0f}, kHash, kInvocation - 1), e);
  EXPECT_EQ(a.kind, Kind::kStale);
  // A large one: its bytes follow, to be dropped.
  a = read_arrival(sent(Tensor(DType::kFloat32, Shape{1000}), kHash + 1), e);
  EXPECT_EQ(a.kind, Kind::kStale);
  EXPECT_EQ(a.follows, 4000U);
  // A compact one: another key's check, or bits 10-17 of an earlier
  // invocation.
  const Shape scalar;
  const RecvExpectation es = expecting(DType::kFloat32, scalar);
  EXPECT_EQ(read_arrival(sent(Tensor(1.0f), kHash ^ 0xffff), es).kind, Kind::kStale);
  EXPECT_EQ(read_arrival(sent(Tensor(1.0f), kHash, kInvocation - 1024), es).kind, Kind::kStale);
  // The current invocation of the same key is not.
  EXPECT_EQ(read_arrival(sent(Tensor(1.0f)), es).kind, Kind::kValue);
}

TEST(RecvArrivalTest, AMismatchIsRefusedNamingThePeerAndItsBytesAreDrained) {
  const Shape two{2};
  // Another dtype: InvalidArgument naming both.
  Arrival a = read_arrival(sent(Tensor{1, 2}), expecting(DType::kFloat32, two));
  EXPECT_EQ(a.kind, Kind::kRefused);
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInvalidArgument,
                                 "rank 1 sent int32 where this Recv expects float32"));
  EXPECT_EQ(a.follows, 0U);
  // Another shape.
  a = read_arrival(sent(Tensor{1.0f, 2.0f, 3.0f}), expecting(DType::kFloat32, two));
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInvalidArgument,
                                 "rank 1 sent shape [3] where this Recv expects [2]"));
  // A large tensor of another shape: refused, its bytes drained.
  a = read_arrival(sent(Tensor(DType::kFloat32, Shape{1000})), expecting(DType::kFloat32, two));
  EXPECT_EQ(a.kind, Kind::kRefused);
  EXPECT_EQ(a.follows, 4000U);
  // A later invocation of the same key (the header, then the compact word).
  a = read_arrival(sent(Tensor{1.0f, 2.0f}, kHash, kInvocation + 1),
                   expecting(DType::kFloat32, two));
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInternal, "rank 1 sent invocation 3001"));
  const Shape scalar;
  a = read_arrival(sent(Tensor(1.0f), kHash, kInvocation + 1024),
                   expecting(DType::kFloat32, scalar));
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInternal, "a later invocation"));
  // A compact value of another dtype.
  a = read_arrival(sent(Tensor(int32_t{4})), expecting(DType::kFloat32, scalar));
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInvalidArgument, "rank 1 sent int32"));
}

TEST(RecvArrivalTest, AMalformedHeaderIsInternalAndAllocatesNothing) {
  const Shape unknown = Shape::unknown();
  const RecvExpectation e = expecting(DType::kFloat32, unknown);
  // Two floats: a header, not a compact word.
  const Tensor two{1.0f, 2.0f};
  const int64_t before = graphrun::internal::tensor_buffers_allocated_by_this_thread();
  // A shape of a terabyte announced with a byte count of 4 (in the inline
  // range), and with one of 8 KiB (its bytes would follow).
  Packet p = sent(two);
  p.header.rank = 2;
  p.header.dims[0] = int64_t{1} << 20;
  p.header.dims[1] = int64_t{1} << 18;
  p.header.bytes = 4;
  Arrival a = read_arrival(p, e);
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInternal, "rank 1 sent a malformed header"));
  EXPECT_EQ(a.follows, 0U);
  p.header.bytes = 8192;
  a = read_arrival(p, e);
  EXPECT_THAT(a.status, StatusIs(StatusCode::kInternal, "a header of 8192 bytes"));
  EXPECT_EQ(a.follows, 8192U);
  EXPECT_EQ(graphrun::internal::tensor_buffers_allocated_by_this_thread(), before);
  // A rank past the largest, an unknown dtype, a negative dimension.
  p = sent(two);
  p.header.rank = Shape::kMaxRank + 1;
  EXPECT_THAT(read_arrival(p, e).status, StatusIs(StatusCode::kInternal, "a shape of rank 9"));
  p = sent(two);
  p.header.dtype = 77;
  EXPECT_THAT(
      read_arrival(p, e).status,
      StatusIs(StatusCode::kInternal, "rank 1 sent a malformed header: a header of dtype 77"));
  p = sent(two);
  p.header.dims[0] = -5;
  EXPECT_THAT(read_arrival(p, e).status,
              StatusIs(StatusCode::kInternal, "rank 1 sent a malformed header"));
  // A count past INT32_MAX on another key is refused (Internal, another
  // tensor) rather than drained as stale: at most INT32_MAX bytes are
  // received after it.
  p = sent(two, kHash + 1);
  p.header.bytes = uint64_t{1} << 40;
  a = read_arrival(p, e);
  EXPECT_EQ(a.kind, Kind::kRefused);
  EXPECT_EQ(a.follows, static_cast<uint64_t>(INT32_MAX));
  EXPECT_EQ(graphrun::internal::tensor_buffers_allocated_by_this_thread(), before);
}

TEST(RecvArrivalTest, ABoolTensorsBytesReadAsZeroOrOne) {
  const Shape three{3};
  Packet p = sent(Tensor{true, false, true});
  p.payload[0] = 2;  // not a valid bool: reads as true
  p.payload[1] = 0;
  p.payload[2] = static_cast<char>(0x80);
  const Arrival a = read_arrival(p, expecting(DType::kBool, three));
  ASSERT_EQ(a.kind, Kind::kValue) << a.status.to_string();
  const auto* b = static_cast<const unsigned char*>(a.value.raw_data());
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(b[2], 1);
  // The compact form too.
  const Shape scalar;
  Packet c = sent(Tensor(true));
  reinterpret_cast<char*>(&c)[kCompactWord] = 7;
  const Arrival ac = read_arrival(c, expecting(DType::kBool, scalar));
  ASSERT_EQ(ac.kind, Kind::kValue) << ac.status.to_string();
  EXPECT_EQ(*static_cast<const unsigned char*>(ac.value.raw_data()), 1);
}

}  // namespace
}  // namespace graphrun::mpi::internal
