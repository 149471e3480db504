// Placeholder and PlaceholderWithDefault: the graph's inputs.
//
// A Placeholder must be fed; the scheduler rejects a run that needs an unfed
// one before any kernel starts, and the kernel below is the backstop. A
// PlaceholderWithDefault passes its input through unless fed.
#include <graphrun/ops.h>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

// Fails: reaching it means the placeholder was needed and not fed.
// Thread safety: immutable after construction.
class PlaceholderOp final : public OpKernel {
 public:
  PlaceholderOp(std::string name, DType dtype, Shape shape)
      : name_(std::move(name)), dtype_(dtype), shape_(shape) {}

  Status compute(OpKernelContext&) override {
    if (shape_.is_unknown_rank()) {
      return invalid_argument("You must feed a value for placeholder tensor '{}' with dtype {}",
                              name_, dtype_name(dtype_));
    }
    return invalid_argument(
        "You must feed a value for placeholder tensor '{}' with dtype {} and shape {}", name_,
        dtype_name(dtype_), shape_.to_string());
  }
  bool is_cheap() const override { return true; }

 private:
  const std::string name_;
  const DType dtype_;
  const Shape shape_;
};

// Output = input (same buffer), after checking it fits the declared shape.
// Thread safety: immutable after construction.
class PlaceholderWithDefaultOp final : public OpKernel {
 public:
  explicit PlaceholderWithDefaultOp(Shape shape) : shape_(shape) {}

  Status compute(OpKernelContext& ctx) override {
    const Tensor& in = ctx.input(0);
    if (!in.shape().is_compatible_with(shape_)) {
      return invalid_argument(
          "the default value has shape {}, which is not compatible with "
          "the declared shape {}",
          in.shape().to_string(), shape_.to_string());
    }
    return ctx.set_output(0, in);
  }
  bool is_cheap() const override { return true; }

 private:
  const Shape shape_;
};

Status placeholder_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
  c.set_output(0, shape);
  return Status::ok();
}

Status placeholder_with_default_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
  if (!c.input_shape(0).is_compatible_with(shape)) {
    return invalid_argument(
        "the default value has shape {}, which is not compatible with the "
        "declared shape {}",
        c.input_shape(0).to_string(), shape.to_string());
  }
  c.set_output(0, shape);
  return Status::ok();
}

}  // namespace

namespace ops_internal {

void register_placeholder_ops(OpRegistry& r) {
  must(r.add(OpDef("Placeholder")
                 .output("output", "dtype")
                 .type_attr("dtype", all_dtypes())
                 .attr("shape", Shape::unknown())
                 .shape_fn(placeholder_shape)
                 .doc("A value that must be fed."),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, ctx.attr<DType>("dtype"));
               GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, ctx.attr<Shape>("shape"));
               return std::make_unique<PlaceholderOp>(ctx.node().name(), dtype, shape);
             }));
  must(r.add(OpDef("PlaceholderWithDefault")
                 .input("input", "dtype")
                 .output("output", "dtype")
                 .type_attr("dtype", all_dtypes())
                 .required_attr("shape", Shape::unknown())
                 .shape_fn(placeholder_with_default_shape)
                 .doc("Passes `input` through unless fed; `shape` may be less specific."),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, ctx.attr<Shape>("shape"));
               return std::make_unique<PlaceholderWithDefaultOp>(shape);
             }));
}

}  // namespace ops_internal

namespace ops {

Output Placeholder(Graph& g, DType dtype, Shape shape, std::string_view name) {
  return ops_internal::first_output(g.add_node(NodeSpec{
      .op = "Placeholder",
      .name = std::string(name),
      .attrs = {{"dtype", dtype}, {"shape", shape}},
  }));
}

Output PlaceholderWithDefault(Graph& g, Output default_value, Shape shape, std::string_view name) {
  return ops_internal::first_output(g.add_node(NodeSpec{
      .op = "PlaceholderWithDefault",
      .name = std::string(name),
      .inputs = {default_value},
      .attrs = {{"shape", shape}},
  }));
}

}  // namespace ops
}  // namespace graphrun
