// Cast: elementwise conversion between any two of the five dtypes.
//
// Conversions: to bool, nonzero -> true; from bool, false/true -> 0/1;
// float to integer truncates toward zero and saturates (NaN -> 0, values
// beyond the integer range -> its min/max) so that no input is undefined
// behaviour; other conversions are static_cast.
#include <graphrun/ops.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/array/array_ops.h"

namespace graphrun {
namespace {

template <typename Dst, typename Src>
Dst cast_value(Src v) {
  if constexpr (std::is_same_v<Dst, bool>) {
    return v != Src{};
  } else if constexpr (std::is_floating_point_v<Src> && std::is_integral_v<Dst>) {
    if (std::isnan(v)) return Dst{0};
    // min() is a power of two (exact as Src); max() may round up to 2^k, so
    // anything at or above it saturates and everything below fits.
    if (v <= static_cast<Src>(std::numeric_limits<Dst>::min())) {
      return std::numeric_limits<Dst>::min();
    }
    if (v >= static_cast<Src>(std::numeric_limits<Dst>::max())) {
      return std::numeric_limits<Dst>::max();
    }
    return static_cast<Dst>(v);
  } else {
    return static_cast<Dst>(v);
  }
}

// Elements per parallel_for chunk.
constexpr int64_t kCastGrain = 1 << 15;

// Cheap when the node's shapes are small and known at build.
// Thread safety: immutable after construction.
class CastOp final : public OpKernel {
 public:
  CastOp(DType src, DType dst, bool cheap) : src_(src), dst_(dst), cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != src_) {
      return invalid_argument("input is {}, expected {}", x.debug_type(), dtype_name(src_));
    }
    if (src_ == dst_) return ctx.set_output(0, x);  // nothing to convert: share the buffer
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * y, ctx.allocate_output_uninitialized(0, x.shape()));
    visit_dtype(src_, [&](auto src_zero) {
      using Src = decltype(src_zero);
      visit_dtype(dst_, [&](auto dst_zero) {
        using Dst = decltype(dst_zero);
        if constexpr (!std::is_same_v<Src, Dst>) {
          std::span<const Src> in = x.flat<Src>();
          std::span<Dst> out = y->flat<Dst>();
          ctx.parallel_for(x.num_elements(), kCastGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
              const auto k = static_cast<std::size_t>(i);
              out[k] = cast_value<Dst>(in[k]);
            }
          });
        }
      });
    });
    return Status::ok();
  }

 private:
  const DType src_;
  const DType dst_;
  const bool cheap_;
};

}  // namespace

namespace ops_internal {

void register_cast_op(OpRegistry& r) {
  must(r.add(OpDef("Cast")
                 .input("x", "SrcT")
                 .output("y", "DstT")
                 .type_attr("SrcT", all_dtypes())
                 .type_attr("DstT", all_dtypes())
                 .attr("Truncate", false)
                 .shape_fn(shape_fns::unchanged)
                 .doc("`x` converted to DstT (to bool: nonzero is true; float to int truncates)."),
             [](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
               GRAPHRUN_ASSIGN_OR_RETURN(DType src, ctx.attr<DType>("SrcT"));
               GRAPHRUN_ASSIGN_OR_RETURN(DType dst, ctx.attr<DType>("DstT"));
               return std::make_unique<CastOp>(src, dst, small_static_shapes(ctx.node()));
             }));
}

}  // namespace ops_internal

namespace ops {

Output Cast(Graph& g, Output x, DType to, std::string_view name) {
  return ops_internal::first_output(g.add_node(NodeSpec{
      .op = "Cast",
      .name = std::string(name),
      .inputs = {x},
      .attrs = {{"DstT", to}},
  }));
}

}  // namespace ops
}  // namespace graphrun
