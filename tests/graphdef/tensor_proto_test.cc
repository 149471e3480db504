// Tensor <-> TensorProto: every dtype both ways, TensorFlow's typed-value
// rules (repeat the last value, none means zeros, too many is an error) and
// the checks on untrusted shapes and sizes.
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOkAndHolds;
using testing::StatusIs;
using testing::TensorEq;

v1::TensorProto proto_of(v1::DataType dtype, std::initializer_list<int64_t> dims) {
  v1::TensorProto p;
  p.set_dtype(dtype);
  for (int64_t d : dims) p.mutable_tensor_shape()->add_dim()->set_size(d);
  return p;
}

TEST(TensorProtoTest, EveryDtypeRoundTripsThroughTensorContent) {
  const Tensor tensors[] = {
      Tensor::matrix<float>({{1.5f, -2}, {3, 4}}),
      Tensor{1.0, -2.25, 1e300},
      Tensor{int32_t{1}, int32_t{-7}, std::numeric_limits<int32_t>::max()},
      Tensor{int64_t{1}, std::numeric_limits<int64_t>::min()},
      Tensor{true, false, true},
      Tensor(3.0f),
      Tensor(DType::kFloat32, Shape{0, 3}),
  };
  for (const Tensor& t : tensors) {
    v1::TensorProto p = tensor_to_proto(t);
    EXPECT_EQ(p.tensor_content().size(), t.byte_size());
    EXPECT_THAT(tensor_from_proto(p), IsOkAndHolds(TensorEq(t))) << t;
  }
}

TEST(TensorProtoTest, ContentIsLittleEndian) {
  v1::TensorProto p = tensor_to_proto(Tensor{int32_t{0x01020304}});
  EXPECT_EQ(p.dtype(), v1::DT_INT32);
  EXPECT_EQ(p.tensor_content(), std::string("\x04\x03\x02\x01", 4));
  // The fixture const_plus_placeholder_add's bytes: 1.0f, 2.0f, 3.0f.
  v1::TensorProto q = proto_of(v1::DT_FLOAT, {3});
  q.set_tensor_content(std::string("\0\0\x80?\0\0\0@\0\0@@", 12));
  EXPECT_THAT(tensor_from_proto(q), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f, 3.0f})));
}

TEST(TensorProtoTest, TypedValuesPerDtype) {
  v1::TensorProto f = proto_of(v1::DT_FLOAT, {2});
  f.add_float_val(1.5f);
  f.add_float_val(2.5f);
  EXPECT_THAT(tensor_from_proto(f), IsOkAndHolds(TensorEq(Tensor{1.5f, 2.5f})));
  v1::TensorProto d = proto_of(v1::DT_DOUBLE, {2});
  d.add_double_val(0.1);
  d.add_double_val(0.2);
  EXPECT_THAT(tensor_from_proto(d), IsOkAndHolds(TensorEq(Tensor{0.1, 0.2})));
  v1::TensorProto i = proto_of(v1::DT_INT32, {2});
  i.add_int_val(-3);
  i.add_int_val(4);
  EXPECT_THAT(tensor_from_proto(i), IsOkAndHolds(TensorEq(Tensor{int32_t{-3}, int32_t{4}})));
  v1::TensorProto l = proto_of(v1::DT_INT64, {2});
  l.add_int64_val(int64_t{1} << 40);
  l.add_int64_val(-1);
  EXPECT_THAT(tensor_from_proto(l), IsOkAndHolds(TensorEq(Tensor{int64_t{1} << 40, int64_t{-1}})));
  v1::TensorProto b = proto_of(v1::DT_BOOL, {2});
  b.add_bool_val(true);
  b.add_bool_val(false);
  EXPECT_THAT(tensor_from_proto(b), IsOkAndHolds(TensorEq(Tensor{true, false})));
}

TEST(TensorProtoTest, FewerValuesThanElementsRepeatTheLast) {
  v1::TensorProto f = proto_of(v1::DT_FLOAT, {2, 3});
  f.add_float_val(1);
  f.add_float_val(2);
  EXPECT_THAT(tensor_from_proto(f),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2, 2}, {2, 2, 2}}))));
  v1::TensorProto i = proto_of(v1::DT_INT64, {4});
  i.add_int64_val(7);
  EXPECT_THAT(tensor_from_proto(i), IsOkAndHolds(TensorEq(Tensor::filled<int64_t>(Shape{4}, 7))));
  v1::TensorProto b = proto_of(v1::DT_BOOL, {3});
  b.add_bool_val(true);
  EXPECT_THAT(tensor_from_proto(b), IsOkAndHolds(TensorEq(Tensor{true, true, true})));
  v1::TensorProto d = proto_of(v1::DT_DOUBLE, {2});
  d.add_double_val(0.5);
  EXPECT_THAT(tensor_from_proto(d), IsOkAndHolds(TensorEq(Tensor{0.5, 0.5})));
  v1::TensorProto n = proto_of(v1::DT_INT32, {3});
  n.add_int_val(9);
  EXPECT_THAT(tensor_from_proto(n), IsOkAndHolds(TensorEq(Tensor::filled<int32_t>(Shape{3}, 9))));
}

TEST(TensorProtoTest, NoValuesMeanZeros) {
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT, {2, 2})),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{2, 2}))));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_BOOL, {})), IsOkAndHolds(TensorEq(Tensor(false))));
  // The fixture's empty int32 shape tensor: shape [0], no values.
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_INT32, {0})),
              IsOkAndHolds(TensorEq(Tensor(DType::kInt32, Shape{0}))));
}

TEST(TensorProtoTest, TooManyValuesIsAnError) {
  v1::TensorProto f = proto_of(v1::DT_FLOAT, {2});
  for (int k = 0; k < 3; ++k) f.add_float_val(1);
  EXPECT_THAT(tensor_from_proto(f),
              StatusIs(StatusCode::kInvalidArgument,
                       "3 value(s) given for a float32[2] tensor of 2 element(s)"));
}

TEST(TensorProtoTest, ValuesInAnotherDtypesFieldAreAnError) {
  v1::TensorProto f = proto_of(v1::DT_FLOAT, {1});
  f.add_int_val(1);
  EXPECT_THAT(tensor_from_proto(f), StatusIs(StatusCode::kInvalidArgument,
                                             "a float32 tensor has 1 value(s) in fields of other"));
}

TEST(TensorProtoTest, ContentSizeMustMatchShapeAndDtype) {
  v1::TensorProto p = proto_of(v1::DT_FLOAT, {2, 3});
  p.set_tensor_content(std::string(20, '\0'));
  EXPECT_THAT(tensor_from_proto(p),
              StatusIs(StatusCode::kInvalidArgument,
                       "tensor_content holds 20 bytes, but a float32[2,3] tensor needs 24"));
}

TEST(TensorProtoTest, BoolContentBytesAreNormalized) {
  v1::TensorProto p = proto_of(v1::DT_BOOL, {3});
  p.set_tensor_content(std::string("\x00\x01\x07", 3));
  EXPECT_THAT(tensor_from_proto(p), IsOkAndHolds(TensorEq(Tensor{false, true, true})));
}

TEST(TensorProtoTest, BadShapesAreErrors) {
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT, {2, -3})),
              StatusIs(StatusCode::kInvalidArgument, "dimensions >= 0, got -3"));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT, {-1})),
              StatusIs(StatusCode::kInvalidArgument, "dimensions >= 0, got -1"));
  // The product overflows int64: rejected before anything is allocated.
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT, {int64_t{1} << 40, int64_t{1} << 40})),
              StatusIs(StatusCode::kInvalidArgument, "more elements than int64 can count"));
  // Fits int64 but not the 2 GiB cap: one value asking for 4 TiB.
  v1::TensorProto huge = proto_of(v1::DT_FLOAT, {int64_t{1} << 20, int64_t{1} << 20});
  huge.add_float_val(1);
  EXPECT_THAT(tensor_from_proto(huge),
              StatusIs(StatusCode::kInvalidArgument, "byte limit of a TensorProto"));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT, {1, 1, 1, 1, 1, 1, 1, 1, 1})),
              StatusIs(StatusCode::kInvalidArgument, "rank 9 exceeds graphrun's maximum of 8"));
  v1::TensorProto unknown = proto_of(v1::DT_FLOAT, {});
  unknown.mutable_tensor_shape()->set_unknown_rank(true);
  EXPECT_THAT(tensor_from_proto(unknown),
              StatusIs(StatusCode::kInvalidArgument, "must have a known rank"));
}

TEST(TensorProtoTest, UnsupportedDtypes) {
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_STRING, {1})),
              StatusIs(StatusCode::kUnimplemented, "dtype DT_STRING is not supported"));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_HALF, {1})),
              StatusIs(StatusCode::kUnimplemented, "dtype DT_HALF is not supported"));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_FLOAT_REF, {1})),
              StatusIs(StatusCode::kUnimplemented, "DT_FLOAT_REF"));
  v1::TensorProto bad = proto_of(v1::DT_FLOAT, {1});
  bad.set_dtype(static_cast<v1::DataType>(77));
  EXPECT_THAT(tensor_from_proto(bad),
              StatusIs(StatusCode::kInvalidArgument, "77 is not a valid dtype number"));
  EXPECT_THAT(tensor_from_proto(proto_of(v1::DT_INVALID, {1})),
              StatusIs(StatusCode::kInvalidArgument, "dtype is not set"));
}

TEST(TensorProtoTest, UninitializedTensorHasNoDtype) {
  v1::TensorProto p = tensor_to_proto(Tensor());
  EXPECT_EQ(p.dtype(), v1::DT_INVALID);
  EXPECT_TRUE(p.tensor_content().empty());
}

}  // namespace
}  // namespace graphrun
