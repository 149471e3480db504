// Identity: output = input, sharing its buffer.
#include <graphrun/ops.h>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

// Thread safety: stateless.
class IdentityOp final : public OpKernel {
 public:
  Status compute(OpKernelContext& ctx) override { return ctx.set_output(0, ctx.input(0)); }
  bool is_cheap() const override { return true; }
};

}  // namespace

namespace ops_internal {

void register_identity_op(OpRegistry& r) {
  must(r.add(OpDef("Identity")
                 .input("input", "T")
                 .output("output", "T")
                 .type_attr("T", all_dtypes())
                 .shape_fn(shape_fns::unchanged)
                 .doc("Returns its input (the same buffer)."),
             [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<IdentityOp>();
             }));
}

}  // namespace ops_internal

namespace ops {

Output Identity(Graph& g, Output x, std::string_view name) {
  return ops_internal::first_output(
      g.add_node(NodeSpec{.op = "Identity", .name = std::string(name), .inputs = {x}}));
}

}  // namespace ops
}  // namespace graphrun
