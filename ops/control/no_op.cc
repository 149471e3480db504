// NoOp: does nothing. A target, and an anchor for control dependencies; the
// Group builder is a NoOp whose control inputs are the nodes to group.
#include <graphrun/ops.h>

#include "ops/control/control_ops.h"
#include "ops/internal/families.h"

namespace graphrun {
namespace {

// Thread safety: stateless.
class NoOpOp final : public OpKernel {
 public:
  Status compute(OpKernelContext&) override { return Status::ok(); }
  bool is_cheap() const override { return true; }
};

}  // namespace

namespace ops_internal {

void register_no_op(OpRegistry& r) {
  must(r.add(OpDef("NoOp").doc("Does nothing; runs after its control inputs."),
             [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<NoOpOp>();
             }));
}

}  // namespace ops_internal

namespace ops {

const Node* NoOp(Graph& g, std::string_view name) {
  Result<Node*> node = g.add_node(NodeSpec{.op = "NoOp", .name = std::string(name)});
  return node.is_ok() ? *node : nullptr;
}

const Node* Group(Graph& g, std::vector<const Node*> deps, std::string_view name) {
  Result<Node*> node = g.add_node(
      NodeSpec{.op = "NoOp", .name = std::string(name), .control_inputs = std::move(deps)});
  return node.is_ok() ? *node : nullptr;
}

}  // namespace ops
}  // namespace graphrun
