// Const: a tensor held in the node's "value" attr. Also the Zeros and Ones
// builders, which add a Const of the filled tensor.
#include <graphrun/ops.h>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

// Outputs the attr tensor itself: every step shares its buffer (no copy).
// Downstream kernels never see it as sole owner, so they cannot write it in
// place. Thread safety: immutable after construction.
class ConstOp final : public OpKernel {
 public:
  explicit ConstOp(Tensor value) : value_(std::move(value)) {}

  Status compute(OpKernelContext& ctx) override { return ctx.set_output(0, value_); }
  bool is_cheap() const override { return true; }

 private:
  const Tensor value_;
};

Status const_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor value, c.attr<Tensor>("value"));
  if (!value.is_initialized()) return invalid_argument("attribute 'value' holds no tensor");
  if (value.dtype() != c.output_dtype(0)) {
    return invalid_argument("attribute 'dtype' is {} but the value is {}",
                            dtype_name(c.output_dtype(0)), value.debug_type());
  }
  c.set_output(0, value.shape());
  return Status::ok();
}

// `shape` filled with `one ? 1 : 0` of `dtype`, or InvalidArgument.
Result<Tensor> filled_tensor(DType dtype, const Shape& shape, bool one, std::string_view what) {
  if (!shape.is_fully_defined()) {
    return invalid_argument("{}: the shape must be fully defined, got {}", what, shape.to_string());
  }
  if (dtype == DType::kInvalid) return invalid_argument("{}: invalid dtype", what);
  // Shape::make rejects element counts that overflow int64.
  Result<Shape> checked = Shape::make(shape.dims());
  if (!checked.is_ok()) return checked.status().with_prefix(what);
  Result<Tensor> allocated = Tensor::allocate(dtype, shape);
  if (!allocated.is_ok()) return allocated.status().with_prefix(what);
  Tensor t = std::move(*allocated);
  if (one) {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      for (T& v : t.flat<T>()) v = static_cast<T>(1);
    });
  }
  return t;
}

Output filled_const(Graph& g, const Shape& shape, DType dtype, bool one, std::string_view name) {
  std::string node_name(name.empty() ? (one ? "ones" : "zeros") : name);
  Result<Tensor> value = filled_tensor(
      dtype, shape, one, fmt::format("{}('{}')", one ? "Ones" : "Zeros", g.unique_name(node_name)));
  if (!value.is_ok()) {
    g.record_error(value.status());
    return Output{};
  }
  return ops::Const(g, std::move(*value), node_name);
}

}  // namespace

namespace ops_internal {

void register_const_op(OpRegistry& r) {
  must(r.add(OpDef("Const")
                 .output("output", "dtype")
                 .type_attr("dtype", all_dtypes())
                 .required_attr("value", Tensor{})
                 .shape_fn(const_shape)
                 .doc("The tensor in attribute `value`."),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               GRAPHRUN_ASSIGN_OR_RETURN(Tensor value, ctx.attr<Tensor>("value"));
               return std::make_unique<ConstOp>(std::move(value));
             }));
}

}  // namespace ops_internal

namespace ops {

Output Const(Graph& g, Tensor value, std::string_view name) {
  const DType dtype = value.dtype();
  return ops_internal::first_output(g.add_node(NodeSpec{
      .op = "Const",
      .name = std::string(name),
      .attrs = {{"value", std::move(value)}, {"dtype", dtype}},
  }));
}

Output Zeros(Graph& g, Shape shape, DType dtype, std::string_view name) {
  return filled_const(g, shape, dtype, /*one=*/false, name);
}

Output Ones(Graph& g, Shape shape, DType dtype, std::string_view name) {
  return filled_const(g, shape, dtype, /*one=*/true, name);
}

}  // namespace ops
}  // namespace graphrun
