// Conversions shared by graph_def.cc and tensor_proto.cc: dtypes and shapes
// between graphrun and the graphrun.v1 protos. Private to graphrun_graphdef.
//
// Thread safety: pure functions.
#pragma once

#include <graphrun/status.h>
#include <graphrun/tensor.h>
#include <graphrun/v1/tensor_shape.pb.h>
#include <graphrun/v1/types.pb.h>

#include <string>

namespace graphrun::graphdef_internal {

// A proto DataType number (an int: proto3 enums are open) as a graphrun
// DType. Unimplemented for a TensorFlow dtype graphrun lacks (DT_STRING,
// DT_HALF, reference types, ...), InvalidArgument for a number that is no
// dtype at all.
Result<DType> dtype_from_proto(int proto_dtype);
v1::DataType dtype_to_proto(DType dtype);
// "DT_FLOAT", or "dtype 77" for numbers without a name.
std::string proto_dtype_name(int proto_dtype);

// A declared shape (placeholder, variable): unknown rank and -1 dims are
// allowed. Rank above Shape::kMaxRank, dims below -1, element counts that
// overflow int64: InvalidArgument.
Result<Shape> shape_from_proto(const v1::TensorShapeProto& proto);
// A tensor's shape: every dimension known and >= 0.
Result<Shape> tensor_shape_from_proto(const v1::TensorShapeProto& proto);
void shape_to_proto(const Shape& shape, v1::TensorShapeProto* proto);

}  // namespace graphrun::graphdef_internal
