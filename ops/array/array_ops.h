// Registration functions and shared helpers of the array op family
// (ops/array). register.cc calls each register_* once; the helpers are used
// by the shape functions and kernels of several files here.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include "ops/internal/families.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace graphrun::ops_internal {

void register_placeholder_ops(OpRegistry& r);  // Placeholder, PlaceholderWithDefault
void register_const_op(OpRegistry& r);         // Const
void register_identity_op(OpRegistry& r);      // Identity
void register_reshape_op(OpRegistry& r);       // Reshape
void register_cast_op(OpRegistry& r);          // Cast
void register_fill_op(OpRegistry& r);          // Fill

// The values of an int32 or int64 vector (a shape or dims input).
// InvalidArgument naming `what` when `t` is not such a vector.
Result<std::vector<int64_t>> read_int_vector(const Tensor& t, std::string_view what);

// The same into a fixed inline buffer (no heap allocation: kernels' hot
// path). InvalidArgument past Shape::kMaxRank entries. Returns the count.
Result<int> read_dims(const Tensor& t, std::string_view what,
                      std::array<int64_t, Shape::kMaxRank>& out);

// The output shape when a shape comes from a vector input whose values are
// unknown at build time: rank = the vector's length when known, every
// dimension unknown. `what` names the input in the rank error.
Result<Shape> shape_from_unknown_dims(const Shape& vector_shape, std::string_view what);

// "[2,-1,3]": a requested shape as given, -1 kept literally.
std::string dims_to_string(std::span<const int64_t> dims);

// The name (without the current name scope) that a node named `base` would
// get now: `base` itself or `base_<k>`. For builders naming helper nodes
// after the main one ("Reshape_1/shape").
std::string free_local_name(const Graph& g, std::string_view base);

// The first output of a builder's node, or an invalid Output when add_node
// failed (it already recorded the error in the graph).
inline Output first_output(const Result<Node*>& node) {
  return node.is_ok() ? (*node)->output(0) : Output{};
}

}  // namespace graphrun::ops_internal
