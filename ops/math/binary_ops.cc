// Elementwise binary ops with NumPy broadcasting: Add (and its alias AddV2),
// Sub, Mul, Div (and its alias RealDiv).
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>

#include "ops/cpu/kernels.h"
#include "ops/math/math_util.h"

namespace graphrun {
namespace ops_internal {
namespace {

// Elements per parallel_for chunk: large enough that scheduling costs are
// negligible next to the arithmetic.
constexpr int64_t kGrain = 32 * 1024;

// Each op's entry in the level's table (integer Div: the caller rules out
// zero divisors first).
struct AddFn {
  static constexpr cpu::BinaryOp kOp = cpu::BinaryOp::kAdd;
};
struct SubFn {
  static constexpr cpu::BinaryOp kOp = cpu::BinaryOp::kSub;
};
struct MulFn {
  static constexpr cpu::BinaryOp kOp = cpu::BinaryOp::kMul;
};
struct DivFn {
  static constexpr cpu::BinaryOp kOp = cpu::BinaryOp::kDiv;
};

// One output dimension of a broadcast: its size and the element strides of
// x and y along it (0 where that input is broadcast).
struct BroadcastDim {
  int64_t size;
  int64_t x_stride;
  int64_t y_stride;
};

// The broadcast as a list of dimensions with size-1 dimensions dropped and
// adjacent dimensions merged where both inputs are contiguous across them.
// Returns the number of dimensions written to `dims`.
int collapse_broadcast(const Shape& xs, const Shape& ys, const Shape& out,
                       std::array<BroadcastDim, Shape::kMaxRank>& dims) {
  const int rank = out.rank();
  std::array<BroadcastDim, Shape::kMaxRank> full{};
  int64_t x_stride = 1;
  int64_t y_stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int ix = xs.rank() - rank + i;
    const int iy = ys.rank() - rank + i;
    const int64_t dx = ix >= 0 ? xs.dim(ix) : 1;
    const int64_t dy = iy >= 0 ? ys.dim(iy) : 1;
    full[i] = BroadcastDim{out.dim(i), dx == 1 ? 0 : x_stride, dy == 1 ? 0 : y_stride};
    x_stride *= dx;
    y_stride *= dy;
  }
  int n = 0;
  for (int i = 0; i < rank; ++i) {
    const BroadcastDim& d = full[i];
    if (d.size == 1) continue;
    if (n > 0) {
      BroadcastDim& prev = dims[n - 1];
      if (prev.x_stride == d.x_stride * d.size && prev.y_stride == d.y_stride * d.size) {
        prev.size *= d.size;
        prev.x_stride = d.x_stride;
        prev.y_stride = d.y_stride;
        continue;
      }
    }
    dims[n++] = d;
  }
  return n;
}

template <typename F, typename T>
void run_broadcast(const OpKernelContext& ctx, const T* x, const T* y, T* z, const Shape& xs,
                   const Shape& ys, const Shape& out) {
  std::array<BroadcastDim, Shape::kMaxRank> dims{};
  const int nd = collapse_broadcast(xs, ys, out, dims);
  const cpu::BinaryFn<T> fn = cpu::kernels().typed<T>().binary;
  if (nd == 0) {  // every dimension is 1: one element
    fn(F::kOp, cpu::Operands::kBothVectors, x, y, z, 1);
    return;
  }
  const BroadcastDim inner = dims[nd - 1];
  const int64_t rows = out.num_elements() / inner.size;
  const int64_t grain = std::max<int64_t>(1, kGrain / inner.size);
  ctx.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    // Odometer over the outer dimensions, started at row `begin`.
    std::array<int64_t, Shape::kMaxRank> idx{};
    int64_t xo = 0;
    int64_t yo = 0;
    int64_t rem = begin;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rem % dims[d].size;
      rem /= dims[d].size;
      xo += idx[d] * dims[d].x_stride;
      yo += idx[d] * dims[d].y_stride;
    }
    for (int64_t row = begin; row < end; ++row) {
      T* zr = z + row * inner.size;
      const T* xr = x + xo;
      const T* yr = y + yo;
      const cpu::Operands form = inner.x_stride == 0   ? cpu::Operands::kScalarX
                                 : inner.y_stride == 0 ? cpu::Operands::kScalarY
                                                       : cpu::Operands::kBothVectors;
      fn(F::kOp, form, xr, yr, zr, inner.size);
      // Advance the odometer.
      for (int d = nd - 2; d >= 0; --d) {
        xo += dims[d].x_stride;
        yo += dims[d].y_stride;
        if (++idx[d] < dims[d].size) break;
        xo -= dims[d].x_stride * dims[d].size;
        yo -= dims[d].y_stride * dims[d].size;
        idx[d] = 0;
      }
    }
  });
}

// z = F(x, y) elementwise, broadcasting x and y to a common shape. Cheap
// when the node's shapes are small and known at build.
// Thread safety: immutable after construction; compute() may run
// concurrently.
template <typename F>
class BinaryOp final : public OpKernel {
 public:
  explicit BinaryOp(bool cheap) : cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& y = ctx.input(1);
    if (x.dtype() != y.dtype()) {
      return invalid_argument("x is {} but y is {}", x.debug_type(), y.debug_type());
    }
    // Names both shapes when they cannot broadcast.
    GRAPHRUN_ASSIGN_OR_RETURN(Shape out_shape, broadcast_shapes(x.shape(), y.shape()));
    return visit_numeric(x.dtype(), [&](auto tag) -> Status {
      using T = decltype(tag);
      return compute_typed<T>(ctx, x, y, out_shape);
    });
  }

 private:
  template <typename T>
  static Status compute_typed(OpKernelContext& ctx, const Tensor& x, const Tensor& y,
                              const Shape& out_shape) {
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output_uninitialized(0, out_shape));
    const int64_t n = out->num_elements();
    if (n == 0) return Status::ok();
    const std::span<const T> xv = x.flat<T>();
    const std::span<const T> yv = y.flat<T>();
    if constexpr (std::is_same_v<F, DivFn> && std::is_integral_v<T>) {
      if (std::find(yv.begin(), yv.end(), T{0}) != yv.end()) {
        return invalid_argument("integer division by zero (x {}, y {})", x.shape(), y.shape());
      }
    }
    const T* xp = xv.data();
    const T* yp = yv.data();
    T* zp = out->flat<T>().data();
    const cpu::BinaryFn<T> fn = cpu::kernels().typed<T>().binary;
    if (x.shape() == y.shape()) {
      ctx.parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
        fn(F::kOp, cpu::Operands::kBothVectors, xp + b, yp + b, zp + b, e - b);
      });
    } else if (x.num_elements() == 1 && y.shape() == out_shape) {
      ctx.parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
        fn(F::kOp, cpu::Operands::kScalarX, xp, yp + b, zp + b, e - b);
      });
    } else if (y.num_elements() == 1 && x.shape() == out_shape) {
      ctx.parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
        fn(F::kOp, cpu::Operands::kScalarY, xp + b, yp, zp + b, e - b);
      });
    } else {
      run_broadcast<F, T>(ctx, xp, yp, zp, x.shape(), y.shape(), out_shape);
    }
    return Status::ok();
  }

  const bool cheap_;
};

template <typename F>
void register_binary(OpRegistry& r, const char* op, const char* doc) {
  must(r.add(OpDef(op)
                 .input("x", "T")
                 .input("y", "T")
                 .output("z", "T")
                 .type_attr("T", numeric_dtypes())
                 .shape_fn(shape_fns::broadcast_binary)
                 .doc(doc),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               return std::make_unique<BinaryOp<F>>(small_static_shapes(ctx.node()));
             }));
}

}  // namespace

void register_binary_ops(OpRegistry& r) {
  register_binary<AddFn>(r, "Add", "x + y elementwise, with broadcasting.");
  register_binary<AddFn>(r, "AddV2", "x + y elementwise, with broadcasting (alias of Add).");
  register_binary<SubFn>(r, "Sub", "x - y elementwise, with broadcasting.");
  register_binary<MulFn>(r, "Mul", "x * y elementwise, with broadcasting.");
  register_binary<DivFn>(r, "Div",
                         "x / y elementwise, with broadcasting. Integer division truncates toward "
                         "zero; an integer zero divisor is InvalidArgument.");
  register_binary<DivFn>(r, "RealDiv", "x / y elementwise, with broadcasting (alias of Div).");
}

}  // namespace ops_internal

namespace ops {

Output Add(Graph& g, Output x, Output y, std::string_view name) {
  return ops_internal::add_math_node(g, "Add", {x, y}, {}, name);
}
Output Sub(Graph& g, Output x, Output y, std::string_view name) {
  return ops_internal::add_math_node(g, "Sub", {x, y}, {}, name);
}
Output Mul(Graph& g, Output x, Output y, std::string_view name) {
  return ops_internal::add_math_node(g, "Mul", {x, y}, {}, name);
}
Output Div(Graph& g, Output x, Output y, std::string_view name) {
  return ops_internal::add_math_node(g, "Div", {x, y}, {}, name);
}

}  // namespace ops
}  // namespace graphrun
