#include "tests/scheduler/test_ops.h"

#include <chrono>
#include <thread>

namespace graphrun::testing {
namespace {

class ValueOp final : public OpKernel {
 public:
  explicit ValueOp(Tensor v) : v_(std::move(v)) {}
  Status compute(OpKernelContext& ctx) override { return ctx.set_output(0, v_); }

 private:
  Tensor v_;
};

class Sum2Op final : public OpKernel {
 public:
  explicit Sum2Op(ExecCounter* c) : c_(c) {}
  Status compute(OpKernelContext& ctx) override {
    c_->hit(ctx.node().name());
    const Tensor& x = ctx.input(0);
    const Tensor& y = ctx.input(1);
    if (!(x.shape() == y.shape())) return invalid_argument("shape mismatch");
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output(0, x.shape()));
    auto a = x.flat<float>();
    auto b = y.flat<float>();
    auto o = out->flat<float>();
    for (std::size_t i = 0; i < o.size(); ++i) o[i] = a[i] + b[i];
    return Status::ok();
  }

 private:
  ExecCounter* c_;
};

class CountOp final : public OpKernel {
 public:
  explicit CountOp(ExecCounter* c) : c_(c) {}
  Status compute(OpKernelContext& ctx) override {
    c_->hit(ctx.node().name());
    if (ctx.num_outputs() > 0) return ctx.set_output(0, Tensor(1.0f));
    return Status::ok();
  }

 private:
  ExecCounter* c_;
};

class FailOp final : public OpKernel {
 public:
  Status compute(OpKernelContext&) override { return invalid_argument("boom"); }
};

class SlowOp final : public OpKernel {
 public:
  explicit SlowOp(int64_t ms) : ms_(ms) {}
  Status compute(OpKernelContext& ctx) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return ctx.set_output(0, ctx.input(0));
  }

 private:
  int64_t ms_;
};

// Another kernel, reporting `cheap` as its cost.
class WithCost final : public OpKernel {
 public:
  WithCost(std::unique_ptr<OpKernel> kernel, bool cheap)
      : kernel_(std::move(kernel)), cheap_(cheap) {}
  Status compute(OpKernelContext& ctx) override { return kernel_->compute(ctx); }
  bool is_cheap() const override { return cheap_; }

 private:
  std::unique_ptr<OpKernel> kernel_;
  bool cheap_;
};

template <typename K, typename... Args>
KernelFactory factory_of(Args... args) {
  return [=](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new K(args...));
  };
}

KernelFactory with_cost(KernelFactory factory, bool cheap) {
  return [factory = std::move(factory),
          cheap](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
    GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> k, factory(c));
    return std::unique_ptr<OpKernel>(new WithCost(std::move(k), cheap));
  };
}

Output add1(Graph& g, NodeSpec spec) {
  Result<Node*> n = g.add_node(std::move(spec));
  return n.is_ok() ? (*n)->num_outputs() > 0 ? (*n)->output(0) : Output() : Output();
}

}  // namespace

std::unique_ptr<OpRegistry> make_test_registry(ExecCounter* counter, bool cheap) {
  auto r = std::make_unique<OpRegistry>();
  auto must = [](Status s) { GRAPHRUN_CHECK_MSG(s.is_ok(), s.to_string()); };
  auto add = [&](OpDef def, KernelFactory factory) {
    must(r->add(std::move(def), with_cost(std::move(factory), cheap)));
  };
  add(OpDef("Value")
          .output("y", DType::kFloat32)
          .required_attr("value", Tensor())
          .shape_fn(shape_fns::scalar),
      [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
        GRAPHRUN_ASSIGN_OR_RETURN(Tensor v, c.attr<Tensor>("value"));
        return std::unique_ptr<OpKernel>(new ValueOp(v));
      });
  add(OpDef("Sum2")
          .input("x", DType::kFloat32)
          .input("y", DType::kFloat32)
          .output("z", DType::kFloat32)
          .shape_fn(shape_fns::broadcast_binary),
      factory_of<Sum2Op>(counter));
  add(OpDef("Fail").input("x", DType::kFloat32).output("y", DType::kFloat32), factory_of<FailOp>());
  add(OpDef("Source").output("y", DType::kFloat32).stateful().shape_fn(shape_fns::scalar),
      factory_of<CountOp>(counter));
  add(OpDef("Sink").variadic_inputs().stateful(), factory_of<CountOp>(counter));
  must(r->add(OpDef("Slow")
                  .input("x", DType::kFloat32)
                  .output("y", DType::kFloat32)
                  .attr("ms", int64_t{0})
                  .shape_fn(shape_fns::unchanged),
              [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
                GRAPHRUN_ASSIGN_OR_RETURN(int64_t ms, c.attr<int64_t>("ms"));
                return std::unique_ptr<OpKernel>(new SlowOp(ms));
              }));
  add(OpDef("Placeholder")
          .output("output", "dtype")
          .type_attr("dtype", all_dtypes())
          .attr("shape", Shape::unknown())
          .shape_fn([](InferenceContext& c) {
            GRAPHRUN_ASSIGN_OR_RETURN(Shape s, c.attr<Shape>("shape"));
            c.set_output(0, s);
            return Status::ok();
          }),
      factory_of<FailOp>());
  return r;
}

Output value(Graph& g, float v, std::string_view name) {
  return add1(g, NodeSpec{"Value", std::string(name), {}, {}, {{"value", Tensor(v)}}, nullptr});
}
Output sum2(Graph& g, Output x, Output y, std::string_view name) {
  return add1(g, NodeSpec{"Sum2", std::string(name), {x, y}, {}, {}, nullptr});
}
Output fail(Graph& g, Output x, std::string_view name) {
  return add1(g, NodeSpec{"Fail", std::string(name), {x}, {}, {}, nullptr});
}
Output source(Graph& g, std::string_view name) {
  return add1(g, NodeSpec{"Source", std::string(name), {}, {}, {}, nullptr});
}
const Node* sink(Graph& g, std::vector<Output> inputs, std::string_view name) {
  Result<Node*> n =
      g.add_node(NodeSpec{"Sink", std::string(name), std::move(inputs), {}, {}, nullptr});
  return n.is_ok() ? *n : nullptr;
}
Output slow(Graph& g, Output x, int ms, std::string_view name) {
  return add1(g, NodeSpec{"Slow", std::string(name), {x}, {}, {{"ms", int64_t{ms}}}, nullptr});
}
Output placeholder(Graph& g, Shape shape, std::string_view name) {
  return add1(g, NodeSpec{"Placeholder",
                          std::string(name),
                          {},
                          {},
                          {{"dtype", DType::kFloat32}, {"shape", shape}},
                          nullptr});
}

}  // namespace graphrun::testing
