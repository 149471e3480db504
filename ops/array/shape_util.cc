// Helpers shared by the array ops' shape functions and kernels.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/array/array_ops.h"

namespace graphrun::ops_internal {

Result<std::vector<int64_t>> read_int_vector(const Tensor& t, std::string_view what) {
  if (t.dtype() != DType::kInt32 && t.dtype() != DType::kInt64) {
    return invalid_argument("{} must be an int32 or int64 vector, got {}", what, t.debug_type());
  }
  if (t.shape().rank() != 1) {
    return invalid_argument("{} must be a vector, got shape {}", what, t.shape().to_string());
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(t.num_elements()));
  if (t.dtype() == DType::kInt32) {
    for (int32_t v : t.flat<int32_t>()) out.push_back(v);
  } else {
    for (int64_t v : t.flat<int64_t>()) out.push_back(v);
  }
  return out;
}

Result<int> read_dims(const Tensor& t, std::string_view what,
                      std::array<int64_t, Shape::kMaxRank>& out) {
  if (t.dtype() != DType::kInt32 && t.dtype() != DType::kInt64) {
    return invalid_argument("{} must be an int32 or int64 vector, got {}", what, t.debug_type());
  }
  if (t.shape().rank() != 1) {
    return invalid_argument("{} must be a vector, got shape {}", what, t.shape().to_string());
  }
  if (t.num_elements() > Shape::kMaxRank) {
    return invalid_argument("{} has {} entries; the maximum rank is {}", what, t.num_elements(),
                            Shape::kMaxRank);
  }
  const auto n = static_cast<std::size_t>(t.num_elements());
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = t.dtype() == DType::kInt32 ? int64_t{t.flat<int32_t>()[i]} : t.flat<int64_t>()[i];
  }
  return static_cast<int>(n);
}

Result<Shape> shape_from_unknown_dims(const Shape& vector_shape, std::string_view what) {
  if (vector_shape.is_unknown_rank() || vector_shape.dim(0) < 0) return Shape::unknown();
  if (vector_shape.dim(0) > Shape::kMaxRank) {
    return invalid_argument("{} has {} entries, more than the maximum rank {}", what,
                            vector_shape.dim(0), Shape::kMaxRank);
  }
  Shape out;
  for (int64_t i = 0; i < vector_shape.dim(0); ++i) out.add_dim(Shape::kUnknownDim);
  return out;
}

std::string dims_to_string(std::span<const int64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}

std::string free_local_name(const Graph& g, std::string_view base) {
  // unique_name() returns "<scope>/<candidate>" exactly when the candidate
  // is free, and appends a suffix otherwise.
  auto is_free = [&](const std::string& candidate) {
    const std::string full = g.unique_name(candidate);
    if (full == candidate) return true;
    return full.size() > candidate.size() && full.ends_with(candidate) &&
           full[full.size() - candidate.size() - 1] == '/';
  };
  std::string candidate(base);
  for (int i = 1; !is_free(candidate); ++i) candidate = fmt::format("{}_{}", base, i);
  return candidate;
}

}  // namespace graphrun::ops_internal
