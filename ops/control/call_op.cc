// Call and StatelessCall: a node whose kernel is a user's C++ callable
// (ops::Call). Two ops because statefulness belongs to the OpDef: "Call" is
// stateful (runs once per step, never deduplicated), "StatelessCall" is not;
// the builder picks one from CallAttrs::stateful.
//
// The callable lives in the node's own kernel factory (NodeSpec::kernel), so
// it is not in the graph's attrs and cannot be saved: the ops' registered
// factories fail with Unimplemented (a Call node loaded from a graph file).
//
// Attributes:
//   Tin   list(type)  dtypes of the inputs (any number, any dtypes).
//   Tout  list(type)  dtypes of the outputs; required.
//   _output_shapes_flat  list(int)  declared output shapes, flattened: empty
//         means every output's shape is unknown; otherwise, for each output
//         in order, its rank (-1: unknown rank) followed by that many dims
//         (-1: unknown dim). [2, 3, -1, -1] declares outputs [3,?] and
//         <unknown>.
//
// The kernel checks the callable's results against Tout and the declared
// shapes (InvalidArgument naming the output index), passes a Status error
// from the callable through, and turns a C++ exception into Internal (or
// ResourceExhausted for std::bad_alloc): kernels never throw.
#include <graphrun/ops.h>

#include <algorithm>
#include <array>
#include <exception>
#include <new>

#include "api/src/huge_pages.h"
#include "ops/control/control_ops.h"
#include "ops/internal/families.h"

namespace graphrun {
namespace {

constexpr char kShapesAttr[] = "_output_shapes_flat";

std::vector<int64_t> encode_shapes(std::span<const Shape> shapes) {
  std::vector<int64_t> flat;
  for (const Shape& s : shapes) {
    flat.push_back(s.rank());
    for (int64_t d : s.dims()) flat.push_back(d);
  }
  return flat;
}

// InvalidArgument unless `flat` describes exactly `n` shapes.
Result<std::vector<Shape>> decode_shapes(std::span<const int64_t> flat, int n) {
  std::vector<Shape> shapes;
  if (flat.empty()) {
    shapes.assign(static_cast<std::size_t>(n), Shape::unknown());
    return shapes;
  }
  std::size_t pos = 0;
  while (pos < flat.size()) {
    const int64_t rank = flat[pos++];
    if (rank < -1 || rank > Shape::kMaxRank ||
        pos + static_cast<std::size_t>(std::max<int64_t>(rank, 0)) > flat.size()) {
      return invalid_argument("attribute '{}' is malformed at position {}", kShapesAttr, pos - 1);
    }
    if (rank < 0) {
      shapes.push_back(Shape::unknown());
      continue;
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Shape s,
                              Shape::make(flat.subspan(pos, static_cast<std::size_t>(rank))));
    shapes.push_back(s);
    pos += static_cast<std::size_t>(rank);
  }
  if (static_cast<int>(shapes.size()) != n) {
    return invalid_argument("{} output shape(s) are declared for {} output(s)", shapes.size(), n);
  }
  return shapes;
}

Status call_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<DType> tin, c.attr<std::vector<DType>>("Tin"));
  if (!tin.empty()) {
    if (static_cast<int>(tin.size()) != c.num_inputs()) {
      return invalid_argument("attribute 'Tin' lists {} dtype(s) for {} input(s)", tin.size(),
                              c.num_inputs());
    }
    for (int i = 0; i < c.num_inputs(); ++i) {
      if (tin[static_cast<std::size_t>(i)] != c.input_dtype(i)) {
        return invalid_argument("input {} is {} but 'Tin' says {}", i, dtype_name(c.input_dtype(i)),
                                dtype_name(tin[static_cast<std::size_t>(i)]));
      }
    }
  }
  for (int i = 0; i < c.num_outputs(); ++i) {
    if (c.output_dtype(i) == DType::kInvalid) {
      return invalid_argument("output {} has an invalid dtype", i);
    }
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> flat, c.attr<std::vector<int64_t>>(kShapesAttr));
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, decode_shapes(flat, c.num_outputs()));
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, shapes[static_cast<std::size_t>(i)]);
  return Status::ok();
}

// Runs `f` (returning Status), converting any exception it throws.
template <typename F>
Status run_guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc& e) {
    return resource_exhausted("the callable ran out of memory: {}", e.what());
  } catch (const std::exception& e) {
    return internal_error("the callable threw an exception: {}", e.what());
  } catch (...) {
    return internal_error("the callable threw an exception that is not a std::exception");
  }
}

// InvalidArgument unless `t` fits the node's output `i`.
Status check_output(const Node& node, int i, const Tensor& t) {
  if (!t.is_initialized()) {
    return invalid_argument("output {} must be {} but the callable did not produce it", i,
                            dtype_name(node.output_dtype(i)));
  }
  if (t.dtype() != node.output_dtype(i)) {
    return invalid_argument("output {} must be {} but the callable returned {}", i,
                            dtype_name(node.output_dtype(i)), t.debug_type());
  }
  if (!t.shape().is_compatible_with(node.output_shape(i))) {
    return invalid_argument("output {} has shape {}, which is not compatible with the declared {}",
                            i, t.shape().to_string(), node.output_shape(i).to_string());
  }
  return Status::ok();
}

// A Call node's kernel (one per node and session) takes its memory from the
// node-object allocator, as its callable does (api/src/huge_pages.h).
struct NodeObjectStorage {
  static void* operator new(std::size_t n) { return internal::allocate_node_object(n); }
  static void operator delete(void* p) noexcept { internal::free_node_object(p); }
  static void operator delete(void* p, std::size_t) noexcept { internal::free_node_object(p); }
};

// kCheap is the node's `cheap` hint, a template argument rather than a field
// so that the kernel takes 40 bytes (a 48-byte allocation, not 64).
// Thread safety: as thread-safe as the user's callable (required to be).
template <bool kCheap>
class CallOp final : public OpKernel, public NodeObjectStorage {
 public:
  explicit CallOp(ops::CallableFn fn) : fn_(std::move(fn)) {}
  bool is_cheap() const override { return kCheap; }

  Status compute(OpKernelContext& ctx) override {
    return run_guarded([&]() -> Status {
      const int n = ctx.num_inputs();
      Result<std::vector<Tensor>> result =
          n == 0 ? fn_(std::span<const Tensor>()) : call_with_inputs(ctx, n);
      if (!result.is_ok()) return std::move(result).status();
      std::vector<Tensor>& outputs = *result;
      if (static_cast<int>(outputs.size()) != ctx.num_outputs()) [[unlikely]] {
        return invalid_argument("the callable returned {} tensor(s) but {} output(s) are declared",
                                outputs.size(), ctx.num_outputs());
      }
      for (int i = 0; i < ctx.num_outputs(); ++i) {
        Tensor& t = outputs[static_cast<std::size_t>(i)];
        GRAPHRUN_RETURN_IF_ERROR(check_output(ctx.node(), i, t));
        GRAPHRUN_RETURN_IF_ERROR(ctx.set_output(i, std::move(t)));
      }
      return Status::ok();
    });
  }

 private:
  // The callable sees its inputs as one span: copies of the slots' tensors
  // (a reference each), on the stack for a few inputs.
  [[gnu::noinline]] Result<std::vector<Tensor>> call_with_inputs(OpKernelContext& ctx,
                                                                 int n) const {
    constexpr int kOnStack = 4;
    if (n <= kOnStack) {
      std::array<Tensor, kOnStack> inputs;
      for (int i = 0; i < n; ++i) inputs[static_cast<std::size_t>(i)] = ctx.input(i);
      return fn_(std::span<const Tensor>(inputs.data(), static_cast<std::size_t>(n)));
    }
    std::vector<Tensor> inputs;
    inputs.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) inputs.push_back(ctx.input(i));
    return fn_(std::span<const Tensor>(inputs));
  }

  // A copy per kernel, next to the kernel (one cache line fewer per node
  // than a shared one); its captures are shared as the user made them.
  const ops::CallableFn fn_;
};

// The callable writes the outputs through the context itself.
// Thread safety: as thread-safe as the user's callable (required to be).
template <bool kCheap>
class CallKernelOp final : public OpKernel, public NodeObjectStorage {
 public:
  explicit CallKernelOp(ops::CallableKernelFn fn) : fn_(std::move(fn)) {}
  bool is_cheap() const override { return kCheap; }

  Status compute(OpKernelContext& ctx) override {
    GRAPHRUN_RETURN_IF_ERROR(run_guarded([&] { return fn_(ctx); }));
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      GRAPHRUN_RETURN_IF_ERROR(check_output(ctx.node(), i, *ctx.mutable_output(i)));
    }
    return Status::ok();
  }

 private:
  const ops::CallableKernelFn fn_;  // a copy per kernel, as in CallOp
};

Result<std::unique_ptr<OpKernel>> no_callable(OpKernelConstruction& ctx) {
  return unimplemented(
      "{}: a Call node needs its C++ callable; it cannot be loaded from a graph file",
      ctx.node().describe());
}

OpDef call_def(std::string name, bool stateful) {
  OpDef def(std::move(name));
  def.variadic_inputs()
      .output_list("Tout")
      .required_attr("Tout", std::vector<DType>{})
      .attr("Tin", std::vector<DType>{})
      .attr(kShapesAttr, std::vector<int64_t>{})
      .shape_fn(call_shape)
      .stateful(stateful)
      .doc(stateful ? "Runs a C++ callable (ops::Call); stateful."
                    : "Runs a C++ callable (ops::Call) that depends only on its inputs.");
  return def;
}

// The node's kernel factory and the callable it copies into each kernel, in
// one allocation (a node holds it for the graph's lifetime; clones share it).
// The `cheap` hint is the factory's choice of kernel, not a field: a field
// would round the allocation up by 16 bytes.
template <typename Fn>
struct CallFactory {
  Fn fn;
  KernelFactory factory;
};

template <template <bool> class Op, bool kCheap, typename Fn>
std::shared_ptr<const KernelFactory> make_call_factory(Fn fn) {
  auto holder = std::allocate_shared<CallFactory<Fn>>(
      internal::NodeObjectAllocator<CallFactory<Fn>>(), CallFactory<Fn>{std::move(fn), {}});
  // One pointer: fits std::function's own storage.
  holder->factory = [h = holder.get()](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return std::make_unique<Op<kCheap>>(h->fn);
  };
  return std::shared_ptr<const KernelFactory>(holder, &holder->factory);
}

template <template <bool> class Op, typename Fn>
std::shared_ptr<const KernelFactory> call_factory(Fn fn, bool cheap) {
  return cheap ? make_call_factory<Op, true>(std::move(fn))
               : make_call_factory<Op, false>(std::move(fn));
}

// The attributes of the last Call node this thread built, kept: a run of
// Call nodes of one signature (the common case) hands add_node the same map
// instead of building one per node. Per thread, as graphs are built on any.
const AttrMap& call_attrs(std::vector<DType> input_dtypes, std::vector<DType> output_dtypes,
                          std::vector<int64_t> shapes) {
  struct Last {
    bool valid = false;
    std::vector<DType> tin, tout;
    std::vector<int64_t> shapes;
    AttrMap attrs;
  };
  thread_local Last last;
  if (!last.valid || last.tin != input_dtypes || last.tout != output_dtypes ||
      last.shapes != shapes) {
    last.valid = false;  // until the new map is whole
    last.attrs = AttrMap{{"Tin", input_dtypes}, {"Tout", output_dtypes}, {kShapesAttr, shapes}};
    last.tin = std::move(input_dtypes);
    last.tout = std::move(output_dtypes);
    last.shapes = std::move(shapes);
    last.valid = true;
  }
  return last.attrs;
}

// Adds the node; `factory` makes its kernel. One Output per output dtype,
// all invalid on failure.
std::vector<Output> add_call(Graph& g, std::vector<Output> inputs, std::vector<DType> output_dtypes,
                             bool has_fn, std::shared_ptr<const KernelFactory> factory,
                             const ops::CallAttrs& attrs, std::string_view name) {
  const std::size_t n = output_dtypes.size();
  const std::string op = attrs.stateful ? "Call" : "StatelessCall";
  const std::string node_name = name.empty() ? op : std::string(name);
  auto fail = [&](Status s) {
    g.record_error(std::move(s));
    return std::vector<Output>(n);
  };
  if (!has_fn) return fail(invalid_argument("{}: the callable is empty", node_name));
  if (!attrs.output_shapes.empty() && attrs.output_shapes.size() != n) {
    return fail(invalid_argument("{}: {} output shape(s) given for {} output dtype(s)", node_name,
                                 attrs.output_shapes.size(), n));
  }
  std::vector<DType> input_dtypes;
  for (const Output& in : inputs) {
    if (!in.is_valid()) break;  // add_node reports it
    input_dtypes.push_back(in.dtype());
  }
  if (input_dtypes.size() != inputs.size()) input_dtypes.clear();
  Result<Node*> node = g.add_node(
      NodeSpec{
          .op = op,
          .name = node_name,
          .inputs = std::move(inputs),
          .kernel = std::move(factory),
      },
      call_attrs(std::move(input_dtypes), std::move(output_dtypes),
                 encode_shapes(attrs.output_shapes)));
  if (!node.is_ok()) return std::vector<Output>(n);
  std::vector<Output> outputs;
  outputs.reserve(n);
  for (int i = 0; i < (*node)->num_outputs(); ++i) outputs.push_back((*node)->output(i));
  return outputs;
}

}  // namespace

namespace ops_internal {

void register_call_ops(OpRegistry& r) {
  must(r.add(call_def("Call", /*stateful=*/true), no_callable));
  must(r.add(call_def("StatelessCall", /*stateful=*/false), no_callable));
}

}  // namespace ops_internal

namespace ops {

std::vector<Output> Call(Graph& g, std::vector<Output> inputs, std::vector<DType> output_dtypes,
                         CallableFn fn, CallAttrs attrs, std::string_view name) {
  const bool has_fn = static_cast<bool>(fn);
  return add_call(g, std::move(inputs), std::move(output_dtypes), has_fn,
                  call_factory<CallOp>(std::move(fn), attrs.cheap), attrs, name);
}

std::vector<Output> Call(Graph& g, std::vector<Output> inputs, std::vector<DType> output_dtypes,
                         CallableKernelFn fn, CallAttrs attrs, std::string_view name) {
  const bool has_fn = static_cast<bool>(fn);
  return add_call(g, std::move(inputs), std::move(output_dtypes), has_fn,
                  call_factory<CallKernelOp>(std::move(fn), attrs.cheap), attrs, name);
}

}  // namespace ops
}  // namespace graphrun
