// Helpers shared by the math family's kernels and builders (ops/math only).
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/internal/families.h"

namespace graphrun::ops_internal {

// The math family's registration steps; register_math_ops() calls each.
void register_binary_ops(OpRegistry& r);
void register_unary_ops(OpRegistry& r);
void register_matmul_op(OpRegistry& r);
void register_conv2d_op(OpRegistry& r);
void register_reduction_ops(OpRegistry& r);

// Calls fn(T{}) for the numeric dtypes (float32, float64, int32, int64);
// InvalidArgument for the others. `fn` returns a Status.
template <typename Fn>
Status visit_numeric(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kInt64: return fn(int64_t{});
    default: return invalid_argument("unsupported dtype {}", dtype);
  }
}

// Same for float32 and float64 only.
template <typename Fn>
Status visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    default: return invalid_argument("unsupported dtype {} (expects float32 or float64)", dtype);
  }
}

// Integer addition wraps around (two's complement) instead of being
// undefined on overflow, as TensorFlow's kernels do in practice (the
// level kernels of ops/cpu wrap the same way).
template <typename T>
T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// Adds one node and returns its output 0, or an invalid Output when
// add_node failed (the graph has recorded the error).
inline Output add_math_node(Graph& g, std::string_view op, std::vector<Output> inputs,
                            AttrMap attrs, std::string_view name) {
  Result<Node*> node = g.add_node(NodeSpec{.op = std::string(op),
                                           .name = std::string(name),
                                           .inputs = std::move(inputs),
                                           .attrs = std::move(attrs)});
  if (!node.is_ok()) return Output{};
  return (*node)->output(0);
}

}  // namespace graphrun::ops_internal
