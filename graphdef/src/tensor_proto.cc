// Tensor <-> TensorProto, and the dtype/shape conversions of convert.h.
//
// tensor_content is little-endian on the wire (TensorFlow writes the host's
// bytes and every platform it ships on is little-endian); a big-endian host
// swaps each element.
#include <graphrun/graph_def.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "graphdef/src/convert.h"

namespace graphrun {
namespace graphdef_internal {
namespace {

// Reverses each element's bytes on a big-endian host; nothing on a
// little-endian one.
void to_or_from_little_endian(void* data, std::size_t elements, std::size_t element_size) {
  if constexpr (std::endian::native == std::endian::big) {
    auto* bytes = static_cast<unsigned char*>(data);
    for (std::size_t i = 0; i < elements; ++i) {
      std::reverse(bytes + i * element_size, bytes + (i + 1) * element_size);
    }
  } else {
    (void)data;
    (void)elements;
    (void)element_size;
  }
}

}  // namespace

Result<DType> dtype_from_proto(int proto_dtype) {
  switch (proto_dtype) {
    case v1::DT_FLOAT: return DType::kFloat32;
    case v1::DT_DOUBLE: return DType::kFloat64;
    case v1::DT_INT32: return DType::kInt32;
    case v1::DT_INT64: return DType::kInt64;
    case v1::DT_BOOL: return DType::kBool;
    case v1::DT_INVALID: return invalid_argument("the dtype is not set (DT_INVALID)");
    default: break;
  }
  if (v1::DataType_IsValid(proto_dtype)) {
    return unimplemented(
        "dtype {} is not supported (graphrun has float32, float64, int32, int64 and bool)",
        proto_dtype_name(proto_dtype));
  }
  return invalid_argument("{} is not a valid dtype number", proto_dtype);
}

v1::DataType dtype_to_proto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return v1::DT_FLOAT;
    case DType::kFloat64: return v1::DT_DOUBLE;
    case DType::kInt32: return v1::DT_INT32;
    case DType::kInt64: return v1::DT_INT64;
    case DType::kBool: return v1::DT_BOOL;
    case DType::kInvalid: break;
  }
  return v1::DT_INVALID;
}

std::string proto_dtype_name(int proto_dtype) {
  if (v1::DataType_IsValid(proto_dtype)) {
    return v1::DataType_Name(static_cast<v1::DataType>(proto_dtype));
  }
  return "dtype " + std::to_string(proto_dtype);
}

Result<Shape> shape_from_proto(const v1::TensorShapeProto& proto) {
  if (proto.unknown_rank()) {
    if (proto.dim_size() != 0) {
      return invalid_argument("a shape of unknown rank lists {} dimension(s)", proto.dim_size());
    }
    return Shape::unknown();
  }
  if (proto.dim_size() > Shape::kMaxRank) {
    return invalid_argument("rank {} exceeds graphrun's maximum of {}", proto.dim_size(),
                            Shape::kMaxRank);
  }
  std::vector<int64_t> dims;
  dims.reserve(static_cast<std::size_t>(proto.dim_size()));
  for (const auto& d : proto.dim()) dims.push_back(d.size());
  // Checks dims >= -1 and that the element count fits int64.
  return Shape::make(dims);
}

Result<Shape> tensor_shape_from_proto(const v1::TensorShapeProto& proto) {
  if (proto.unknown_rank()) return invalid_argument("a tensor's shape must have a known rank");
  for (const auto& d : proto.dim()) {
    if (d.size() < 0) {
      return invalid_argument("a tensor's shape must have dimensions >= 0, got {}", d.size());
    }
  }
  return shape_from_proto(proto);
}

void shape_to_proto(const Shape& shape, v1::TensorShapeProto* proto) {
  proto->Clear();
  if (shape.is_unknown_rank()) {
    proto->set_unknown_rank(true);
    return;
  }
  for (int64_t d : shape.dims()) proto->add_dim()->set_size(d);
}

}  // namespace graphdef_internal

namespace {

using graphdef_internal::dtype_from_proto;
using graphdef_internal::dtype_to_proto;
using graphdef_internal::tensor_shape_from_proto;

// The typed field a dtype's values live in, as a span of its values.
template <typename T, typename Field>
std::span<const T> values_of(const Field& field) {
  return {field.data(), static_cast<std::size_t>(field.size())};
}

// The number of values in each typed field, to reject values given in the
// field of another dtype.
int64_t typed_values_besides(const v1::TensorProto& p, DType dtype) {
  int64_t n = p.string_val_size() + p.scomplex_val_size() + p.dcomplex_val_size() +
              p.half_val_size() + p.uint32_val_size() + p.uint64_val_size();
  if (dtype != DType::kFloat32) n += p.float_val_size();
  if (dtype != DType::kFloat64) n += p.double_val_size();
  if (dtype != DType::kInt32) n += p.int_val_size();
  if (dtype != DType::kInt64) n += p.int64_val_size();
  if (dtype != DType::kBool) n += p.bool_val_size();
  return n;
}

// Fills `out` from `values` by TensorFlow's rule: fewer values than
// elements repeat the last one; none leave the (zeroed) tensor as it is.
template <typename T, typename V>
void fill_from_values(std::span<const V> values, std::span<T> out) {
  if (values.empty()) return;
  const std::size_t given = std::min(values.size(), out.size());
  for (std::size_t i = 0; i < given; ++i) out[i] = static_cast<T>(values[i]);
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(given), out.end(),
            static_cast<T>(values[values.size() - 1]));
}

}  // namespace

int64_t tensor_proto_bytes(const v1::TensorProto& proto) {
  if (!proto.tensor_content().empty()) return static_cast<int64_t>(proto.tensor_content().size());
  int64_t bytes = 8;
  if (Result<DType> dtype = dtype_from_proto(proto.dtype()); dtype.is_ok()) {
    bytes = static_cast<int64_t>(dtype_size(*dtype));
  }
  // A dimension below 1 anywhere makes no bytes, whatever comes before it
  // ([2^40, 0] too).
  std::vector<int64_t> dims;
  dims.reserve(static_cast<std::size_t>(proto.tensor_shape().dim_size()));
  for (const auto& dim : proto.tensor_shape().dim()) {
    if (dim.size() <= 0) return 0;
    dims.push_back(dim.size());
  }
  return product_of_positive_dims(bytes, dims, kMaxTensorProtoBytes)
      .value_or(kMaxTensorProtoBytes + 1);
}

Result<Tensor> tensor_from_proto(const v1::TensorProto& proto) {
  GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, dtype_from_proto(proto.dtype()));
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, tensor_shape_from_proto(proto.tensor_shape()));
  const int64_t elements = shape.num_elements();
  const auto element_size = static_cast<int64_t>(dtype_size(dtype));
  if (elements > kMaxTensorProtoBytes / element_size) {
    return invalid_argument("a {}{} tensor is larger than the {} byte limit of a TensorProto",
                            dtype_name(dtype), shape, kMaxTensorProtoBytes);
  }
  const auto bytes = static_cast<std::size_t>(elements * element_size);

  if (!proto.tensor_content().empty()) {
    if (proto.tensor_content().size() != bytes) {
      return invalid_argument("tensor_content holds {} bytes, but a {}{} tensor needs {}",
                              proto.tensor_content().size(), dtype_name(dtype), shape, bytes);
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, Tensor::allocate_uninitialized(dtype, shape));
    if (dtype == DType::kBool) {
      // Any non-zero byte is true; never copy a byte that is not a valid bool.
      auto out = t.flat<bool>();
      for (std::size_t i = 0; i < bytes; ++i) out[i] = proto.tensor_content()[i] != 0;
    } else {
      std::memcpy(t.raw_data(), proto.tensor_content().data(), bytes);
      graphdef_internal::to_or_from_little_endian(t.raw_data(), static_cast<std::size_t>(elements),
                                                  static_cast<std::size_t>(element_size));
    }
    return t;
  }

  if (const int64_t others = typed_values_besides(proto, dtype); others > 0) {
    return invalid_argument("a {} tensor has {} value(s) in fields of other dtypes",
                            dtype_name(dtype), others);
  }
  int64_t given = 0;
  switch (dtype) {
    case DType::kFloat32: given = proto.float_val_size(); break;
    case DType::kFloat64: given = proto.double_val_size(); break;
    case DType::kInt32: given = proto.int_val_size(); break;
    case DType::kInt64: given = proto.int64_val_size(); break;
    case DType::kBool: given = proto.bool_val_size(); break;
    case DType::kInvalid: break;
  }
  if (given > elements) {
    return invalid_argument("{} value(s) given for a {}{} tensor of {} element(s)", given,
                            dtype_name(dtype), shape, elements);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, Tensor::allocate(dtype, shape));  // zeros
  switch (dtype) {
    case DType::kFloat32:
      fill_from_values(values_of<float>(proto.float_val()), t.flat<float>());
      break;
    case DType::kFloat64:
      fill_from_values(values_of<double>(proto.double_val()), t.flat<double>());
      break;
    case DType::kInt32:
      fill_from_values(values_of<int32_t>(proto.int_val()), t.flat<int32_t>());
      break;
    case DType::kInt64:
      fill_from_values(values_of<int64_t>(proto.int64_val()), t.flat<int64_t>());
      break;
    case DType::kBool: fill_from_values(values_of<bool>(proto.bool_val()), t.flat<bool>()); break;
    case DType::kInvalid: break;
  }
  return t;
}

v1::TensorProto tensor_to_proto(const Tensor& tensor) {
  v1::TensorProto proto;
  if (!tensor.is_initialized()) return proto;
  proto.set_dtype(dtype_to_proto(tensor.dtype()));
  graphdef_internal::shape_to_proto(tensor.shape(), proto.mutable_tensor_shape());
  std::string* content = proto.mutable_tensor_content();
  content->resize(tensor.byte_size());
  if (tensor.byte_size() > 0) std::memcpy(content->data(), tensor.raw_data(), tensor.byte_size());
  graphdef_internal::to_or_from_little_endian(
      content->data(), static_cast<std::size_t>(tensor.num_elements()), dtype_size(tensor.dtype()));
  return proto;
}

}  // namespace graphrun
