// MatMul: the product of two rank-2 tensors, either optionally transposed.
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "ops/math/gemm.h"
#include "ops/math/math_util.h"

namespace graphrun {
namespace ops_internal {
namespace {

// "inner dimensions differ: [2,3] x [4,5] (3 vs 4)", plus the transpose
// flags when either is set.
Status inner_dims_error(const Shape& a, const Shape& b, bool ta, bool tb, int64_t ka, int64_t kb) {
  std::string flags;
  if (ta || tb) flags = fmt::format("; transpose_a={}, transpose_b={}", ta, tb);
  return invalid_argument("inner dimensions differ: {} x {} ({} vs {}{})", a, b, ka, kb, flags);
}

Status rank_error(const Shape& a, const Shape& b) {
  return invalid_argument("MatMul requires rank-2 inputs, got a {} and b {}", a, b);
}

Status matmul_shape(InferenceContext& c) {
  const Shape& a = c.input_shape(0);
  const Shape& b = c.input_shape(1);
  GRAPHRUN_ASSIGN_OR_RETURN(bool ta, c.attr<bool>("transpose_a"));
  GRAPHRUN_ASSIGN_OR_RETURN(bool tb, c.attr<bool>("transpose_b"));
  if ((!a.is_unknown_rank() && a.rank() != 2) || (!b.is_unknown_rank() && b.rank() != 2)) {
    return rank_error(a, b);
  }
  int64_t m = Shape::kUnknownDim;
  int64_t ka = Shape::kUnknownDim;
  int64_t kb = Shape::kUnknownDim;
  int64_t n = Shape::kUnknownDim;
  if (!a.is_unknown_rank()) {
    m = a.dim(ta ? 1 : 0);
    ka = a.dim(ta ? 0 : 1);
  }
  if (!b.is_unknown_rank()) {
    kb = b.dim(tb ? 1 : 0);
    n = b.dim(tb ? 0 : 1);
  }
  if (ka >= 0 && kb >= 0 && ka != kb) return inner_dims_error(a, b, ta, tb, ka, kb);
  c.set_output(0, Shape{m, n});
  return Status::ok();
}

// product = op(a) * op(b), op = transpose when the flag is set.
// Thread safety: immutable after construction; compute() may run
// concurrently.
class MatMulOp final : public OpKernel {
 public:
  MatMulOp(bool transpose_a, bool transpose_b)
      : transpose_a_(transpose_a), transpose_b_(transpose_b) {}

  Status compute(OpKernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype()) {
      return invalid_argument("a is {} but b is {}", a.debug_type(), b.debug_type());
    }
    if (a.shape().rank() != 2 || b.shape().rank() != 2) return rank_error(a.shape(), b.shape());
    const int64_t m = a.shape().dim(transpose_a_ ? 1 : 0);
    const int64_t ka = a.shape().dim(transpose_a_ ? 0 : 1);
    const int64_t kb = b.shape().dim(transpose_b_ ? 1 : 0);
    const int64_t n = b.shape().dim(transpose_b_ ? 0 : 1);
    if (ka != kb) return inner_dims_error(a.shape(), b.shape(), transpose_a_, transpose_b_, ka, kb);
    switch (a.dtype()) {
      case DType::kFloat32: return compute_typed<float>(ctx, a, b, m, ka, n);
      case DType::kFloat64: return compute_typed<double>(ctx, a, b, m, ka, n);
      case DType::kInt32: return compute_typed<int32_t>(ctx, a, b, m, ka, n);
      case DType::kInt64: return compute_typed<int64_t>(ctx, a, b, m, ka, n);
      default: return invalid_argument("unsupported dtype {}", a.dtype());
    }
  }

 private:
  template <typename T>
  Status compute_typed(OpKernelContext& ctx, const Tensor& a, const Tensor& b, int64_t m, int64_t k,
                       int64_t n) const {
    if (k == 0) {  // an empty sum: zeros
      GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output(0, Shape{m, n}));
      (void)out;
      return Status::ok();
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output_uninitialized(0, Shape{m, n}));
    if (m == 0 || n == 0) return Status::ok();
    cpu::GemmArgs<T> g;
    g.a = a.flat<T>().data();
    g.lda = a.shape().dim(1);
    g.transpose_a = transpose_a_;
    g.b = b.flat<T>().data();
    g.ldb = b.shape().dim(1);
    g.transpose_b = transpose_b_;
    g.c = out->flat<T>().data();
    g.ldc = n;
    g.m = m;
    g.n = n;
    g.k = k;
    parallel_gemm(ctx, g);
    return Status::ok();
  }

  const bool transpose_a_;
  const bool transpose_b_;
};

}  // namespace

void register_matmul_op(OpRegistry& r) {
  must(r.add(
      OpDef("MatMul")
          .input("a", "T")
          .input("b", "T")
          .output("product", "T")
          .type_attr("T", numeric_dtypes())
          .attr("transpose_a", false)
          .attr("transpose_b", false)
          .shape_fn(matmul_shape)
          .doc("The matrix product of two rank-2 tensors; transpose_a/transpose_b transpose an "
               "input first. Products of 2^20 multiply-adds or more split their output "
               "columns (or rows, when taller than wide) across the session's threads."),
      [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
        GRAPHRUN_ASSIGN_OR_RETURN(bool ta, c.attr<bool>("transpose_a"));
        GRAPHRUN_ASSIGN_OR_RETURN(bool tb, c.attr<bool>("transpose_b"));
        return std::make_unique<MatMulOp>(ta, tb);
      }));
}

}  // namespace ops_internal

namespace ops {

Output MatMul(Graph& g, Output a, Output b, MatMulAttrs attrs, std::string_view name) {
  return ops_internal::add_math_node(
      g, "MatMul", {a, b}, {{"transpose_a", attrs.transpose_a}, {"transpose_b", attrs.transpose_b}},
      name);
}

}  // namespace ops
}  // namespace graphrun
