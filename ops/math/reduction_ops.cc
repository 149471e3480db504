// Reductions over a set of axes: Sum, Mean, Max. TF's signature: inputs
// "input" (T) and "reduction_indices" (Tidx: int32/int64, a scalar or a
// vector), attr "keep_dims".
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/math/math_util.h"

namespace graphrun {
namespace ops_internal {
namespace {

// Input elements per parallel_for chunk, at least.
constexpr int64_t kGrain = 32 * 1024;

// Each reducer: the identity, its entry in the level's table (which
// reduces contiguous runs and combines rows into partial results), how two
// partial results combine, and whether the result is divided by the element
// count afterwards (Mean).
struct SumReducer {
  static constexpr bool kMean = false;
  static constexpr cpu::ReduceOp kOp = cpu::ReduceOp::kSum;
  template <typename T>
  static T identity() {
    return T{0};
  }
  template <typename T>
  static T combine(T a, T b) {
    return wrapping_add(a, b);
  }
};

struct MeanReducer : SumReducer {
  static constexpr bool kMean = true;
};

// NaN propagates, as in TF.
struct MaxReducer {
  static constexpr bool kMean = false;
  static constexpr cpu::ReduceOp kOp = cpu::ReduceOp::kMax;
  template <typename T>
  static T identity() {
    if constexpr (std::is_floating_point_v<T>) {
      return -std::numeric_limits<T>::infinity();
    } else {
      return std::numeric_limits<T>::lowest();
    }
  }
  template <typename T>
  static T combine(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
      return (std::isnan(b) || b > a) ? b : a;
    } else {
      return b > a ? b : a;
    }
  }
};

// The axes in `t` (int32 or int64, rank <= 1).
Result<std::vector<int64_t>> read_axes(const Tensor& t) {
  if (t.shape().rank() > 1) {
    return invalid_argument("reduction_indices must be a scalar or a vector, got shape {}",
                            t.shape());
  }
  std::vector<int64_t> axes;
  if (t.dtype() == DType::kInt32) {
    for (int32_t a : t.flat<int32_t>()) axes.push_back(a);
  } else if (t.dtype() == DType::kInt64) {
    for (int64_t a : t.flat<int64_t>()) axes.push_back(a);
  } else {
    return invalid_argument("reduction_indices must be int32 or int64, got {}", t.dtype());
  }
  return axes;
}

// Bit i set when dimension i of `shape` is reduced. Negative axes count
// from the end; duplicates count once.
Result<uint32_t> reduced_mask(std::span<const int64_t> axes, const Shape& shape) {
  const int rank = shape.rank();
  uint32_t mask = 0;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) {
      return invalid_argument("axis {} is out of range for input of rank {} (shape {})", a, rank,
                              shape);
    }
    mask |= uint32_t{1} << (a < 0 ? a + rank : a);
  }
  return mask;
}

Shape reduced_shape(const Shape& in, uint32_t mask, bool keep_dims) {
  Shape out;
  for (int i = 0; i < in.rank(); ++i) {
    if ((mask >> i) & 1u) {
      if (keep_dims) out.add_dim(1);
    } else {
      out.add_dim(in.dim(i));
    }
  }
  return out;
}

Status reduction_shape(InferenceContext& c) {
  const Shape& in = c.input_shape(0);
  GRAPHRUN_ASSIGN_OR_RETURN(bool keep_dims, c.attr<bool>("keep_dims"));
  if (in.is_unknown_rank()) {
    c.set_output(0, Shape::unknown());
    return Status::ok();
  }
  if (const Tensor* axes_t = c.input_constant(1)) {
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, read_axes(*axes_t));
    GRAPHRUN_ASSIGN_OR_RETURN(uint32_t mask, reduced_mask(axes, in));
    c.set_output(0, reduced_shape(in, mask, keep_dims));
    return Status::ok();
  }
  const Shape& axes_shape = c.input_shape(1);
  if (axes_shape.is_fully_defined() && axes_shape.num_elements() == 0) {
    c.set_output(0, in);  // no axes: the identity
  } else if (keep_dims) {
    // Same rank; a dimension is kept or becomes 1, so only 1s are certain.
    Shape out;
    for (int i = 0; i < in.rank(); ++i) out.add_dim(in.dim(i) == 1 ? 1 : Shape::kUnknownDim);
    c.set_output(0, out);
  } else {
    c.set_output(0, Shape::unknown());
  }
  return Status::ok();
}

// A run of adjacent input dimensions that are all reduced or all kept.
struct DimGroup {
  int64_t size;
  bool reduced;
};

// `shape`'s dimensions without the size-1 ones, neighbours of the same
// kind (reduced or kept by `mask`) merged; at least one group.
struct DimGroups {
  std::array<DimGroup, Shape::kMaxRank> g{};
  int k = 0;
};
DimGroups group_dims(const Shape& shape, uint32_t mask) {
  DimGroups out;
  for (int i = 0; i < shape.rank(); ++i) {
    const int64_t d = shape.dim(i);
    if (d == 1) continue;
    const bool reduced = (mask >> i) & 1u;
    if (out.k > 0 && out.g[out.k - 1].reduced == reduced) {
      out.g[out.k - 1].size *= d;
    } else {
      out.g[out.k++] = DimGroup{d, reduced};
    }
  }
  if (out.k == 0) out.g[out.k++] = DimGroup{1, false};  // one element
  return out;
}

// Calls run(in, oo) for each contiguous run of the innermost group, `in`
// the run's offset in the input and `oo` the offset of its output element
// (its first output element when the innermost group is kept): an odometer
// over the outer groups.
template <typename Run>
void for_each_run(const DimGroups& dims, int64_t num_elements, Run run) {
  const auto& groups = dims.g;
  const int k = dims.k;
  std::array<int64_t, Shape::kMaxRank> out_stride{};
  int64_t stride = 1;
  for (int d = k - 1; d >= 0; --d) {
    out_stride[d] = groups[d].reduced ? 0 : stride;
    if (!groups[d].reduced) stride *= groups[d].size;
  }
  const int64_t inner = groups[k - 1].size;
  const int64_t rows = num_elements / inner;
  std::array<int64_t, Shape::kMaxRank> idx{};
  int64_t oo = 0;
  for (int64_t r = 0; r < rows; ++r) {
    run(r * inner, oo);
    for (int d = k - 2; d >= 0; --d) {
      oo += out_stride[d];
      if (++idx[d] < groups[d].size) break;
      oo -= out_stride[d] * groups[d].size;
      idx[d] = 0;
    }
  }
}

// out (already holding R's identity) = R-reduction of x over `mask`.
template <typename R, typename T>
void reduce_into(const OpKernelContext& ctx, const T* x, const Shape& shape, uint32_t mask,
                 T* out) {
  const DimGroups dims = group_dims(shape, mask);
  const auto& groups = dims.g;
  const int k = dims.k;
  const cpu::TypedKernels<T>& kern = cpu::kernels().typed<T>();

  if (k == 2 && !groups[0].reduced) {
    // [rows, reduced]: each row reduces to one output; rows in parallel.
    const int64_t inner = groups[1].size;
    ctx.parallel_for(groups[0].size, std::max<int64_t>(1, kGrain / inner),
                     [&](int64_t b, int64_t e) {
                       for (int64_t r = b; r < e; ++r)
                         out[r] = kern.reduce(R::kOp, x + r * inner, inner);
                     });
    return;
  }
  if (k == 2) {
    // [reduced, cols]: every row accumulates into the output vector; column
    // ranges in parallel.
    const int64_t rows = groups[0].size;
    const int64_t cols = groups[1].size;
    ctx.parallel_for(cols, std::max<int64_t>(64, kGrain / rows), [&](int64_t b, int64_t e) {
      for (int64_t r = 0; r < rows; ++r) kern.accumulate(R::kOp, x + r * cols + b, out + b, e - b);
    });
    return;
  }

  // General: the innermost group is a contiguous run of the input.
  const DimGroup inner = groups[k - 1];
  for_each_run(dims, shape.num_elements(), [&](int64_t in, int64_t oo) {
    if (inner.reduced) {
      out[oo] = R::combine(out[oo], kern.reduce(R::kOp, x + in, inner.size));
    } else {
      kern.accumulate(R::kOp, x + in, out + oo, inner.size);
    }
  });
}

// float32 sums add in double: a float running total stops growing once it
// is 2^24 times what is added (2e7 ones summed to 16,777,216, their mean to
// 0.84), and a long contiguous sum drifted by 3.5% over 2e8 elements.
// Contiguous runs and rows alike accumulate doubles (the level's kernels:
// cpu::TypedKernels::sum_to_double, accumulate_to_double); out = sum /
// divisor (1 for Sum, the element count for Mean), rounded to float once.
void sum_floats_into(const OpKernelContext& ctx, const float* x, const Shape& shape, uint32_t mask,
                     double divisor, std::span<float> out) {
  const cpu::TypedKernels<float>& kern = cpu::kernels().typed<float>();
  const auto sum_run = [&kern](const float* run, int64_t n) { return kern.sum_to_double(run, n); };
  const DimGroups dims = group_dims(shape, mask);
  const auto& groups = dims.g;
  const int k = dims.k;
  if (k == 2 && !groups[0].reduced) {
    const int64_t inner = groups[1].size;
    ctx.parallel_for(groups[0].size, std::max<int64_t>(1, kGrain / inner),
                     [&](int64_t b, int64_t e) {
                       for (int64_t r = b; r < e; ++r) {
                         out[static_cast<std::size_t>(r)] =
                             static_cast<float>(sum_run(x + r * inner, inner) / divisor);
                       }
                     });
    return;
  }
  if (k == 2) {
    const int64_t rows = groups[0].size;
    const int64_t cols = groups[1].size;
    ctx.parallel_for(cols, std::max<int64_t>(64, kGrain / rows), [&](int64_t b, int64_t e) {
      std::vector<double> acc(static_cast<std::size_t>(e - b), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        kern.accumulate_to_double(x + r * cols + b, acc.data(), e - b);
      for (std::size_t j = 0; j < acc.size(); ++j) {
        out[static_cast<std::size_t>(b) + j] = static_cast<float>(acc[j] / divisor);
      }
    });
    return;
  }
  // General: as reduce_into, into doubles.
  std::vector<double> acc(out.size(), 0.0);
  const DimGroup inner = groups[k - 1];
  for_each_run(dims, shape.num_elements(), [&](int64_t in, int64_t oo) {
    if (inner.reduced) {
      acc[static_cast<std::size_t>(oo)] += sum_run(x + in, inner.size);
    } else {
      kern.accumulate_to_double(x + in, acc.data() + oo, inner.size);
    }
  });
  for (std::size_t j = 0; j < acc.size(); ++j) out[j] = static_cast<float>(acc[j] / divisor);
}

// Thread safety: immutable after construction; compute() may run
// concurrently.
template <typename R>
class ReductionOp final : public OpKernel {
 public:
  ReductionOp(bool keep_dims, bool cheap) : keep_dims_(keep_dims), cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, read_axes(ctx.input(1)));
    GRAPHRUN_ASSIGN_OR_RETURN(uint32_t mask, reduced_mask(axes, x.shape()));
    const Shape out_shape = reduced_shape(x.shape(), mask, keep_dims_);
    int64_t count = 1;  // input elements per output element
    for (int i = 0; i < x.shape().rank(); ++i) {
      if ((mask >> i) & 1u) count *= x.shape().dim(i);
    }
    return visit_numeric(x.dtype(), [&](auto tag) -> Status {
      using T = decltype(tag);
      GRAPHRUN_ASSIGN_OR_RETURN(Tensor * y, ctx.allocate_output_uninitialized(0, out_shape));
      const std::span<T> out = y->flat<T>();
      std::fill(out.begin(), out.end(), R::template identity<T>());
      if (out.empty()) return Status::ok();
      if constexpr (std::is_same_v<T, float> && R::kOp == cpu::ReduceOp::kSum) {
        if (x.num_elements() > 0) {
          sum_floats_into(ctx, x.flat<float>().data(), x.shape(), mask,
                          R::kMean ? static_cast<double>(count) : 1.0, out);
          return Status::ok();
        }
      }
      if (x.num_elements() > 0) {
        reduce_into<R, T>(ctx, x.flat<T>().data(), x.shape(), mask, out.data());
      }
      if constexpr (R::kMean) {
        for (T& v : out) {
          if (count == 0) {
            // The mean of nothing: NaN for floats; 0 for integers.
            v = std::numeric_limits<T>::has_quiet_NaN ? std::numeric_limits<T>::quiet_NaN() : T{0};
          } else if constexpr (std::is_integral_v<T>) {
            v = static_cast<T>(static_cast<int64_t>(v) / count);  // truncates, as TF
          } else {
            v = v / static_cast<T>(count);
          }
        }
      }
      return Status::ok();
    });
  }

 private:
  const bool keep_dims_;
  const bool cheap_;  // small input and output, known at build
};

template <typename R>
void register_reduction(OpRegistry& r, const char* op, const char* doc) {
  must(r.add(OpDef(op)
                 .input("input", "T")
                 .input("reduction_indices", "Tidx")
                 .output("output", "T")
                 .type_attr("T", numeric_dtypes())
                 .type_attr("Tidx", {DType::kInt32, DType::kInt64})
                 .attr("keep_dims", false)
                 .shape_fn(reduction_shape)
                 .doc(doc),
             [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
               GRAPHRUN_ASSIGN_OR_RETURN(bool keep_dims, c.attr<bool>("keep_dims"));
               return std::make_unique<ReductionOp<R>>(keep_dims, small_static_shapes(c.node()));
             }));
}

Output reduction(Graph& g, const char* op, Output x, Output axes, bool keep_dims,
                 std::string_view name) {
  return add_math_node(g, op, {x, axes}, {{"keep_dims", keep_dims}}, name);
}

// The axes become an int32 Const named "<name>/reduction_indices" (int64
// when some axis does not fit).
Output reduction(Graph& g, const char* op, Output x, const std::vector<int64_t>& axes,
                 bool keep_dims, std::string_view name) {
  if (!x.is_valid()) return reduction(g, op, x, Output{}, keep_dims, name);  // records the error
  const bool fits_int32 = std::all_of(axes.begin(), axes.end(), [](int64_t a) {
    return a >= std::numeric_limits<int32_t>::min() && a <= std::numeric_limits<int32_t>::max();
  });
  const Shape shape{static_cast<int64_t>(axes.size())};
  Tensor value;
  if (fits_int32) {
    std::vector<int32_t> narrow(axes.begin(), axes.end());
    value = Tensor::from_span(shape, std::span<const int32_t>(narrow));
  } else {
    value = Tensor::from_span(shape, std::span<const int64_t>(axes));
  }
  const std::string base(name.empty() ? std::string_view(op) : name);
  Output indices = ops::Const(g, std::move(value), base + "/reduction_indices");
  return reduction(g, op, x, indices, keep_dims, name);
}

}  // namespace

void register_reduction_ops(OpRegistry& r) {
  register_reduction<SumReducer>(r, "Sum", "The sum over reduction_indices.");
  register_reduction<MeanReducer>(
      r, "Mean", "The mean over reduction_indices; integer means truncate toward zero.");
  register_reduction<MaxReducer>(r, "Max", "The maximum over reduction_indices; NaN propagates.");
}

}  // namespace ops_internal

namespace ops {

Output Sum(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Sum", x, axes, keep_dims, name);
}
Output Mean(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Mean", x, axes, keep_dims, name);
}
Output Max(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Max", x, axes, keep_dims, name);
}
Output Sum(Graph& g, Output x, Output axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Sum", x, axes, keep_dims, name);
}
Output Mean(Graph& g, Output x, Output axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Mean", x, axes, keep_dims, name);
}
Output Max(Graph& g, Output x, Output axes, bool keep_dims, std::string_view name) {
  return ops_internal::reduction(g, "Max", x, axes, keep_dims, name);
}

}  // namespace ops
}  // namespace graphrun
