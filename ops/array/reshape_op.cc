// Reshape: the same elements (the same buffer) under another shape. One entry
// of the requested shape may be -1, inferred from the element count.
#include <graphrun/ops.h>

#include <limits>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

// The shape `requested` resolves to for an input of shape `in`. When `in` is
// not fully defined, the -1 stays unknown. InvalidArgument naming both
// shapes on a mismatch or a malformed request.
Result<Shape> resolve_reshape(const Shape& in, std::span<const int64_t> requested) {
  if (requested.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
    return invalid_argument("requested shape {} has rank {}, more than the maximum of {}",
                            ops_internal::dims_to_string(requested), requested.size(),
                            Shape::kMaxRank);
  }
  // One rule for every shape (product_of_positive_dims): the dimensions
  // above 0 must multiply within int64 wherever a 0 stands ([0,M,M] was
  // accepted where [M,M,0] was refused, and its .npy could not be read).
  if (!product_of_positive_dims(1, requested, std::numeric_limits<int64_t>::max())) {
    return invalid_argument("requested shape {} has more elements than int64 can count",
                            ops_internal::dims_to_string(requested));
  }
  int unknown_index = -1;
  int64_t known = 1;  // product of the given dimensions
  for (std::size_t i = 0; i < requested.size(); ++i) {
    const int64_t d = requested[i];
    if (d == -1) {
      if (unknown_index >= 0) {
        return invalid_argument("requested shape {} has more than one -1 dimension",
                                ops_internal::dims_to_string(requested));
      }
      unknown_index = static_cast<int>(i);
    } else if (d < 0) {
      return invalid_argument("requested shape {} has a negative dimension {} (only -1 is allowed)",
                              ops_internal::dims_to_string(requested), d);
    } else {
      known *= d;  // cannot overflow: the positive dimensions' product fits
    }
  }
  Shape out(requested);
  if (!in.is_fully_defined()) return out;
  const int64_t n = in.num_elements();
  if (unknown_index < 0) {
    if (known != n) {
      return invalid_argument(
          "cannot reshape a tensor of shape {} ({} elements) into shape {} ({} elements)",
          in.to_string(), n, ops_internal::dims_to_string(requested), known);
    }
    return out;
  }
  if (known == 0) {
    if (n == 0) {
      return invalid_argument(
          "cannot reshape a tensor of shape {} (0 elements) into shape {}: the -1 dimension "
          "cannot be inferred when another dimension is 0",
          in.to_string(), ops_internal::dims_to_string(requested));
    }
    return invalid_argument(
        "cannot reshape a tensor of shape {} ({} elements) into shape {} (0 elements)",
        in.to_string(), n, ops_internal::dims_to_string(requested));
  }
  if (n % known != 0) {
    return invalid_argument(
        "cannot reshape a tensor of shape {} ({} elements) into shape {}: {} is not a multiple "
        "of {}",
        in.to_string(), n, ops_internal::dims_to_string(requested), n, known);
  }
  out.set_dim(unknown_index, n / known);
  return out;
}

// Thread safety: stateless.
class ReshapeOp final : public OpKernel {
 public:
  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    std::array<int64_t, Shape::kMaxRank> buffer{};
    GRAPHRUN_ASSIGN_OR_RETURN(int rank,
                              ops_internal::read_dims(ctx.input(1), "the shape input", buffer));
    GRAPHRUN_ASSIGN_OR_RETURN(
        Shape shape,
        resolve_reshape(x.shape(),
                        std::span<const int64_t>(buffer.data(), static_cast<std::size_t>(rank))));
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor y, x.reshaped(shape));
    return ctx.set_output(0, std::move(y));
  }
  bool is_cheap() const override { return true; }
};

Status reshape_shape(InferenceContext& c) {
  const Shape& shape_shape = c.input_shape(1);
  if (!shape_shape.is_unknown_rank() && shape_shape.rank() != 1) {
    return invalid_argument("the shape input must be a vector, got shape {}",
                            shape_shape.to_string());
  }
  if (const Tensor* requested = c.input_constant(1)) {
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                              ops_internal::read_int_vector(*requested, "the shape input"));
    GRAPHRUN_ASSIGN_OR_RETURN(Shape out, resolve_reshape(c.input_shape(0), dims));
    c.set_output(0, out);
    return Status::ok();
  }
  // Not a constant: the rank is known when the vector's length is.
  GRAPHRUN_ASSIGN_OR_RETURN(Shape out,
                            ops_internal::shape_from_unknown_dims(shape_shape, "the shape input"));
  c.set_output(0, out);
  return Status::ok();
}

}  // namespace

namespace ops_internal {

void register_reshape_op(OpRegistry& r) {
  must(r.add(OpDef("Reshape")
                 .input("tensor", "T")
                 .input("shape", "Tshape")
                 .output("output", "T")
                 .type_attr("T", all_dtypes())
                 .type_attr("Tshape", {DType::kInt32, DType::kInt64})
                 .shape_fn(reshape_shape)
                 .doc("`tensor`'s elements (its buffer) under `shape`; one -1 is inferred."),
             [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<ReshapeOp>();
             }));
}

}  // namespace ops_internal

namespace ops {

Output Reshape(Graph& g, Output x, Output shape, std::string_view name) {
  return ops_internal::first_output(
      g.add_node(NodeSpec{.op = "Reshape", .name = std::string(name), .inputs = {x, shape}}));
}

Output Reshape(Graph& g, Output x, std::vector<int64_t> shape, std::string_view name) {
  // Do nothing more after an earlier failure (add_node reports it).
  if (!x.is_valid()) return Reshape(g, x, Output{}, name);
  bool fits_int32 = true;
  for (int64_t d : shape) {
    fits_int32 = fits_int32 && d >= std::numeric_limits<int32_t>::min() &&
                 d <= std::numeric_limits<int32_t>::max();
  }
  Tensor value;
  if (fits_int32) {
    std::vector<int32_t> dims(shape.begin(), shape.end());
    value = Tensor::vector<int32_t>(std::span<const int32_t>(dims));
  } else {
    value = Tensor::vector<int64_t>(std::span<const int64_t>(shape));
  }
  // Name the constant after the Reshape node it feeds ("Reshape_1/shape"),
  // as TensorFlow does.
  const std::string local = ops_internal::free_local_name(g, name.empty() ? "Reshape" : name);
  Output shape_const = Const(g, std::move(value), local + "/shape");
  return Reshape(g, x, shape_const, local);
}

}  // namespace ops
}  // namespace graphrun
