// Elementwise unary ops: Neg, Square, Relu (numeric) and Sqrt, Exp, Log,
// Tanh, Sigmoid (float32/float64).
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "ops/cpu/kernels.h"
#include "ops/math/math_util.h"

namespace graphrun {
namespace ops_internal {
namespace {

// Each function: which dtypes it takes, its entry in the level's table,
// and a chunk size for parallel_for (less for expensive functions).
struct NegFn {
  static constexpr bool kFloatOnly = false;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kNeg;
  static constexpr int64_t kGrain = 32 * 1024;
};
struct SquareFn {
  static constexpr bool kFloatOnly = false;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kSquare;
  static constexpr int64_t kGrain = 32 * 1024;
};
struct ReluFn {
  static constexpr bool kFloatOnly = false;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kRelu;
  static constexpr int64_t kGrain = 32 * 1024;
};
struct SqrtFn {
  static constexpr bool kFloatOnly = true;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kSqrt;
  static constexpr int64_t kGrain = 16 * 1024;
};
struct ExpFn {
  static constexpr bool kFloatOnly = true;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kExp;
  static constexpr int64_t kGrain = 8 * 1024;
};
struct LogFn {
  static constexpr bool kFloatOnly = true;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kLog;
  static constexpr int64_t kGrain = 8 * 1024;
};
struct TanhFn {
  static constexpr bool kFloatOnly = true;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kTanh;
  static constexpr int64_t kGrain = 8 * 1024;
};
struct SigmoidFn {  // 1 / (1 + exp(-x)), stable for large |x|
  static constexpr bool kFloatOnly = true;
  static constexpr cpu::UnaryOp kOp = cpu::UnaryOp::kSigmoid;
  static constexpr int64_t kGrain = 8 * 1024;
};

// y = F(x) elementwise. Cheap when the node's shapes are known at build and
// small: kCheapElements for the simplest functions (grain 32K), fewer for
// the ones that cost more per element (smaller grain).
// Thread safety: immutable after construction; compute() may run
// concurrently.
template <typename F>
class UnaryOp final : public OpKernel {
 public:
  static constexpr int64_t kCheapLimit = kCheapElements * F::kGrain / (32 * 1024);

  explicit UnaryOp(bool cheap) : cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    auto body = [&](auto tag) -> Status {
      using T = decltype(tag);
      GRAPHRUN_ASSIGN_OR_RETURN(Tensor * y, ctx.allocate_output_uninitialized(0, x.shape()));
      const T* in = x.flat<T>().data();
      T* out = y->flat<T>().data();
      const cpu::UnaryFn<T> fn = cpu::kernels().typed<T>().unary;
      ctx.parallel_for(x.num_elements(), F::kGrain,
                       [&](int64_t b, int64_t e) { fn(F::kOp, in + b, out + b, e - b); });
      return Status::ok();
    };
    if constexpr (F::kFloatOnly) {
      return visit_float(x.dtype(), body);
    } else {
      return visit_numeric(x.dtype(), body);
    }
  }

 private:
  const bool cheap_;
};

template <typename F>
void register_unary(OpRegistry& r, const char* op, const char* doc) {
  must(r.add(OpDef(op)
                 .input("x", "T")
                 .output("y", "T")
                 .type_attr("T", F::kFloatOnly ? float_dtypes() : numeric_dtypes())
                 .shape_fn(shape_fns::unchanged)
                 .doc(doc),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<UnaryOp<F>>(
                   small_static_shapes(ctx.node(), UnaryOp<F>::kCheapLimit));
             }));
}

}  // namespace

void register_unary_ops(OpRegistry& r) {
  register_unary<NegFn>(r, "Neg", "-x elementwise.");
  register_unary<SquareFn>(r, "Square", "x * x elementwise.");
  register_unary<SqrtFn>(r, "Sqrt", "Square root elementwise.");
  register_unary<ExpFn>(r, "Exp", "e^x elementwise.");
  register_unary<LogFn>(r, "Log", "Natural logarithm elementwise.");
  register_unary<TanhFn>(r, "Tanh", "Hyperbolic tangent elementwise.");
  register_unary<SigmoidFn>(r, "Sigmoid", "1 / (1 + exp(-x)) elementwise.");
  register_unary<ReluFn>(r, "Relu", "max(x, 0) elementwise.");
}

}  // namespace ops_internal

namespace ops {

Output Neg(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Neg", {x}, {}, name);
}
Output Square(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Square", {x}, {}, name);
}
Output Sqrt(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Sqrt", {x}, {}, name);
}
Output Exp(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Exp", {x}, {}, name);
}
Output Log(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Log", {x}, {}, name);
}
Output Tanh(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Tanh", {x}, {}, name);
}
Output Sigmoid(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Sigmoid", {x}, {}, name);
}
Output Relu(Graph& g, Output x, std::string_view name) {
  return ops_internal::add_math_node(g, "Relu", {x}, {}, name);
}

}  // namespace ops
}  // namespace graphrun
