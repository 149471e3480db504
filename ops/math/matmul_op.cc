// MatMul: the product of two rank-2 tensors, either optionally transposed.
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

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

// What a fused MatMul adds after the product: a bias per column, then an
// activation.
struct Epilogue {
  bool bias = false;
  cpu::Activation activation = cpu::Activation::kNone;
};

// The built-in kernel of `op`, as registered globally (a node of a custom
// registry, or one whose op was replaced, is not fused).
bool is_builtin(const Node& n, std::string_view op) {
  return n.op() == op && &n.registration() == OpRegistry::global().find(op);
}

cpu::Activation activation_of(const Node& n) {
  if (is_builtin(n, "Relu")) return cpu::Activation::kRelu;
  if (is_builtin(n, "Sigmoid")) return cpu::Activation::kSigmoid;
  if (is_builtin(n, "Tanh")) return cpu::Activation::kTanh;
  return cpu::Activation::kNone;
}

// A packed copy of a Const operand costs its size once more per MatMul
// that reads it; larger operands are packed per product as before (their
// packing is a smaller share of a product anyway).
constexpr int64_t kMaxPackedBytes = int64_t{16} << 20;

// The value of `b` when it is a built-in Const's float32 or float64 matrix
// of at most kMaxPackedBytes (a product may keep it packed), else an empty
// tensor.
Tensor constant_operand(const Output& b) {
  const Node* n = b.node();
  if (n == nullptr || b.index() != 0 || !is_builtin(*n, "Const")) return {};
  Result<Tensor> value = n->attr<Tensor>("value");
  if (!value.is_ok() || value->shape().rank() != 2) return {};
  if (value->dtype() != DType::kFloat32 && value->dtype() != DType::kFloat64) return {};
  if (value->byte_size() > static_cast<std::size_t>(kMaxPackedBytes)) return {};
  return *std::move(value);
}

// op(B) packed once, at the first product that can use it (the level's
// layout and blocking, panels sized for that product's m).
template <typename T>
class PackedOperand {
 public:
  const cpu::PackedGemmB<T>& get(const cpu::GemmArgs<T>& g) const {
    std::call_once(once_, [&] {
      packed_ = cpu::kernels().typed<T>().pack_b(g.b, g.ldb, g.transpose_b, g.k, g.n, g.m,
                                                 /*max_block=*/0);
    });
    return *packed_;
  }

 private:
  mutable std::once_flag once_;
  mutable std::unique_ptr<cpu::PackedGemmB<T>> packed_;
};

// A Const operand's value and its packed form, one per (session, Const,
// transpose_b): every MatMul of a session reading the same Const shares it,
// so a weight read by many products is packed (and cached) once.
// Thread safety: as PackedOperand (packed once, read-only afterwards).
class PackedConstant final : public Resource {
 public:
  explicit PackedConstant(Tensor value) : value_(std::move(value)) {}

  // The Const's value, kept so that its buffer is never another tensor's.
  const Tensor& value() const { return value_; }
  template <typename T>
  const PackedOperand<T>& operand() const {
    if constexpr (std::is_same_v<T, float>) {
      return f32_;
    } else {
      return f64_;
    }
  }

 private:
  const Tensor value_;
  PackedOperand<float> f32_;
  PackedOperand<double> f64_;
};

// The session's PackedConstant for `node`'s B when B is a Const worth
// packing (constant_operand), else null. The name cannot be a resource's
// that users create: node names never start with a control character.
PackedConstant* packed_constant(OpKernelConstruction& c, bool transpose_b) {
  Tensor value = constant_operand(c.node().input(1));
  if (!value.is_initialized()) return nullptr;
  const std::string key = fmt::format("\x01packed-matmul-operand:{}:{}",
                                      c.node().input(1).node()->name(), transpose_b ? "T" : "N");
  Result<PackedConstant*> r = c.resources().lookup_or_create<PackedConstant>(
      key, [&]() -> Result<std::unique_ptr<PackedConstant>> {
        return std::make_unique<PackedConstant>(value);
      });
  return r.is_ok() ? *r : nullptr;
}

// product = op(a) * op(b), op = transpose when the flag is set; with an
// epilogue (a fused kernel), + bias (input 2, [n]) and the activation.
// When b is a Const's value (and not fed in its place), blocked products
// read it packed once (a session resource) instead of packing it per call.
// Thread safety: compute() may run concurrently; the packed operand is
// made once (std::call_once) and read-only afterwards.
class MatMulOp final : public OpKernel {
 public:
  MatMulOp(const Node& node, bool transpose_a, bool transpose_b, PackedConstant* packed_b,
           Epilogue epilogue = {}, std::string fused_names = {})
      : node_(node),
        transpose_a_(transpose_a),
        transpose_b_(transpose_b),
        epilogue_(epilogue),
        fused_names_(std::move(fused_names)),
        packed_b_(packed_b) {}

  Status compute(OpKernelContext& ctx) override {
    Status s = compute_product(ctx);
    if (s.is_ok() || fused_names_.empty()) return s;
    return Status(s.code(), fmt::format("{} (fused): {}", fused_names_, s.message()));
  }

  // MatMul, then an Add of a [n] bias (either operand order), then Relu,
  // Sigmoid or Tanh; or MatMul then one of those. float32 and float64.
  std::unique_ptr<OpKernel> fuse(std::span<const Node* const> chain) const override {
    const bool already_fused = epilogue_.bias || epilogue_.activation != cpu::Activation::kNone;
    const DType dtype = node_.output_dtype(0);
    if (already_fused || chain.empty() || (dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
      return nullptr;
    }
    const Shape& product = node_.output_shape(0);
    Epilogue e;
    std::size_t i = 0;
    const Node& first = *chain[0];
    if ((is_builtin(first, "Add") || is_builtin(first, "AddV2")) && first.num_inputs() == 2) {
      const int other = first.input(0).node() == &node_ ? 1 : 0;
      const Output& bias = first.input(other);
      // The bias must be one value per column, known at build, so that the
      // Add's broadcast is exactly the epilogue's.
      if (product.is_unknown_rank() || product.rank() != 2 || product.dim(1) < 0 ||
          bias.dtype() != dtype || bias.shape().is_unknown_rank() || bias.shape().rank() != 1 ||
          bias.shape().dim(0) != product.dim(1)) {
        return nullptr;
      }
      e.bias = true;
      ++i;
    }
    if (i < chain.size()) {
      e.activation = activation_of(*chain[i]);
      if (e.activation == cpu::Activation::kNone) return nullptr;
      ++i;
    }
    if (i != chain.size()) return nullptr;
    std::string names = fmt::format("MatMul '{}'", node_.name());
    for (const Node* n : chain) names += fmt::format(" + {} '{}'", n->op(), n->name());
    return std::make_unique<MatMulOp>(node_, transpose_a_, transpose_b_, packed_b_, e,
                                      std::move(names));
  }

 private:
  Status compute_product(OpKernelContext& ctx) const {
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
    const Tensor* bias = nullptr;
    if (epilogue_.bias) {
      bias = &ctx.input(2);
      if (bias->dtype() != a.dtype() || bias->shape() != Shape{n}) {
        return invalid_argument("the bias is {}, expected {}[{}]", bias->debug_type(),
                                dtype_name(a.dtype()), n);
      }
    }
    switch (a.dtype()) {
      case DType::kFloat32: return compute_typed<float>(ctx, a, b, bias, m, ka, n);
      case DType::kFloat64: return compute_typed<double>(ctx, a, b, bias, m, ka, n);
      case DType::kInt32: return compute_typed<int32_t>(ctx, a, b, bias, m, ka, n);
      case DType::kInt64: return compute_typed<int64_t>(ctx, a, b, bias, m, ka, n);
      default: return invalid_argument("unsupported dtype {}", a.dtype());
    }
  }

  template <typename T>
  Status compute_typed(OpKernelContext& ctx, const Tensor& a, const Tensor& b, const Tensor* bias,
                       int64_t m, int64_t k, int64_t n) const {
    const bool has_epilogue = bias != nullptr || epilogue_.activation != cpu::Activation::kNone;
    if (k == 0 && !has_epilogue) {  // an empty sum: zeros
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
    g.bias = bias != nullptr ? bias->flat<T>().data() : nullptr;
    g.activation = epilogue_.activation;
    if constexpr (std::is_floating_point_v<T>) {
      // The Const's own buffer (not a fed tensor), and a product the
      // blocked kernel runs.
      if (packed_b_ != nullptr && b.raw_data() == packed_b_->value().raw_data() &&
          b.shape() == packed_b_->value().shape() && cpu::gemm_is_blocked(m, n, k)) {
        const PackedOperand<T>& packed = packed_b_->operand<T>();
        parallel_gemm_packed(ctx, g, packed.get(g));
        return Status::ok();
      }
    }
    // With k = 0 the product is zeros, then the epilogue (as the unfused
    // nodes would compute).
    parallel_gemm(ctx, g);
    return Status::ok();
  }

  const Node& node_;
  const bool transpose_a_;
  const bool transpose_b_;
  const Epilogue epilogue_;
  const std::string fused_names_;  // empty unless fused
  // B's value and packed form when B is a Const (the session owns it).
  PackedConstant* const packed_b_;
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
        return std::make_unique<MatMulOp>(c.node(), ta, tb, packed_constant(c, tb));
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
