// Fill: a tensor of shape `dims` with every element equal to scalar `value`.
#include <graphrun/ops.h>

#include <algorithm>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

// `dims` as a shape: non-negative, rank and element count within limits.
Result<Shape> dims_to_shape(std::span<const int64_t> dims) {
  for (int64_t d : dims) {
    if (d < 0) {
      return invalid_argument("dims {} has a negative dimension {}",
                              ops_internal::dims_to_string(dims), d);
    }
  }
  return Shape::make(dims);
}

constexpr int64_t kFillGrain = 1 << 15;

// Cheap when the output's shape is small and known at build (constant dims).
// Thread safety: immutable after construction.
class FillOp final : public OpKernel {
 public:
  explicit FillOp(bool cheap) : cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& value = ctx.input(1);
    if (value.shape().rank() != 0) {
      return invalid_argument("value must be a scalar, got shape {}", value.shape().to_string());
    }
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                              ops_internal::read_int_vector(ctx.input(0), "dims"));
    GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, dims_to_shape(dims));
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output_uninitialized(0, shape));
    visit_dtype(value.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T v = value.scalar<T>();
      std::span<T> elements = out->flat<T>();
      ctx.parallel_for(out->num_elements(), kFillGrain, [&](int64_t begin, int64_t end) {
        std::fill(elements.begin() + begin, elements.begin() + end, v);
      });
    });
    return Status::ok();
  }

 private:
  const bool cheap_;
};

Status fill_shape(InferenceContext& c) {
  const Shape& dims_shape = c.input_shape(0);
  const Shape& value_shape = c.input_shape(1);
  if (!dims_shape.is_unknown_rank() && dims_shape.rank() != 1) {
    return invalid_argument("dims must be a vector, got shape {}", dims_shape.to_string());
  }
  if (!value_shape.is_unknown_rank() && value_shape.rank() != 0) {
    return invalid_argument("value must be a scalar, got shape {}", value_shape.to_string());
  }
  if (const Tensor* dims = c.input_constant(0)) {
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> values,
                              ops_internal::read_int_vector(*dims, "dims"));
    GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, dims_to_shape(values));
    c.set_output(0, shape);
    return Status::ok();
  }
  // Not a constant: the rank is known when the vector's length is.
  GRAPHRUN_ASSIGN_OR_RETURN(Shape out, ops_internal::shape_from_unknown_dims(dims_shape, "dims"));
  c.set_output(0, out);
  return Status::ok();
}

}  // namespace

namespace ops_internal {

void register_fill_op(OpRegistry& r) {
  must(r.add(OpDef("Fill")
                 .input("dims", "index_type")
                 .input("value", "T")
                 .output("output", "T")
                 .type_attr("T", all_dtypes())
                 .type_attr("index_type", {DType::kInt32, DType::kInt64})
                 .shape_fn(fill_shape)
                 .doc("A tensor of shape `dims` filled with the scalar `value`."),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<FillOp>(small_static_shapes(ctx.node()));
             }));
}

}  // namespace ops_internal

namespace ops {

Output Fill(Graph& g, Output dims, Output value, std::string_view name) {
  return ops_internal::first_output(
      g.add_node(NodeSpec{.op = "Fill", .name = std::string(name), .inputs = {dims, value}}));
}

}  // namespace ops
}  // namespace graphrun
