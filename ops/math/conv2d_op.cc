// Conv2D: TensorFlow's 2-D convolution (NHWC input, HWIO filter, SAME or
// VALID padding, strides and dilations), as im2col + one GEMM per block of
// output pixels.
#include <graphrun/op_kernel.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/math/math_util.h"

namespace graphrun {
namespace ops_internal {
namespace {

// Below this many multiply-adds the kernel runs as one chunk (as MatMul);
// above it output rows are split across the session's threads in chunks of
// about kChunkMacs multiply-adds. Chunks can be finer than MatMul's
// (matmul_op.cc), whose chunks each re-pack the right-hand matrix: here
// every im2col block is a GEMM of its own whether or not the rows are split.
constexpr int64_t kParallelMinMacs = int64_t{128} * 128 * 128;
constexpr int64_t kChunkMacs = int64_t{1} << 20;
// Elements of one im2col block (1 MiB of float): the patches of this many
// output pixels are gathered, then multiplied by the filter in one GEMM.
constexpr int64_t kIm2colElements = int64_t{1} << 18;

constexpr int64_t kUnknown = Shape::kUnknownDim;

// The validated attributes of one Conv2D node.
struct Conv2DParams {
  int64_t stride_h = 1;
  int64_t stride_w = 1;
  int64_t dilation_h = 1;
  int64_t dilation_w = 1;
  bool same = false;  // padding "SAME", else "VALID"
};

std::string list_string(const std::vector<int64_t>& v) { return attr_to_string(AttrValue(v)); }

// `what` is "strides" or "dilations": 4 positive entries, 1 on batch and
// channels.
Status check_nhwc_list(std::string_view what, const std::vector<int64_t>& v) {
  if (v.size() != 4) {
    return invalid_argument("{} must have 4 entries [1, height, width, 1], got {}", what,
                            list_string(v));
  }
  for (int64_t x : v) {
    if (x <= 0) return invalid_argument("{} must be positive, got {}", what, list_string(v));
  }
  if (v[0] != 1 || v[3] != 1) {
    return invalid_argument("{} on the batch and channel dimensions must be 1, got {}", what,
                            list_string(v));
  }
  return Status::ok();
}

// Reads and checks the attributes; `c` is an InferenceContext or an
// OpKernelConstruction. Errors are bare reasons (callers name the node).
template <typename Context>
Result<Conv2DParams> read_params(const Context& c) {
  // Kept in its Result: moving the string out made GCC 12's -O3
  // -Wmaybe-uninitialized misfire in the comparisons below.
  const Result<std::string> data_format = c.template attr<std::string>("data_format");
  if (!data_format.is_ok()) return data_format.status();
  if (*data_format == "NCHW") {
    return unimplemented("data_format \"NCHW\" is not supported on CPU; use \"NHWC\"");
  }
  if (*data_format != "NHWC") {
    return invalid_argument("data_format must be \"NHWC\" or \"NCHW\", got \"{}\"", *data_format);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::string padding, c.template attr<std::string>("padding"));
  if (padding == "EXPLICIT") {
    return unimplemented("padding \"EXPLICIT\" is not supported; use \"SAME\" or \"VALID\"");
  }
  if (padding != "SAME" && padding != "VALID") {
    return invalid_argument("padding must be \"SAME\" or \"VALID\", got \"{}\"", padding);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> explicit_paddings,
                            c.template attr<std::vector<int64_t>>("explicit_paddings"));
  if (!explicit_paddings.empty()) {
    return invalid_argument(
        "explicit_paddings must be empty unless padding is \"EXPLICIT\", got {}",
        list_string(explicit_paddings));
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                            c.template attr<std::vector<int64_t>>("strides"));
  GRAPHRUN_RETURN_IF_ERROR(check_nhwc_list("strides", strides));
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int64_t> dilations,
                            c.template attr<std::vector<int64_t>>("dilations"));
  GRAPHRUN_RETURN_IF_ERROR(check_nhwc_list("dilations", dilations));
  return Conv2DParams{.stride_h = strides[1],
                      .stride_w = strides[2],
                      .dilation_h = dilations[1],
                      .dilation_w = dilations[2],
                      .same = padding == "SAME"};
}

// One spatial dimension of the output: its size and the padding before the
// first input element (TF's rule: SAME pads total/2 before, the rest after).
struct Window {
  int64_t out = kUnknown;
  int64_t pad_before = kUnknown;
};

// `in` and `k` may be kUnknown; `dim` is "height" or "width". TF's sizes:
// VALID ceil((in - (k-1)*d) / s), SAME ceil(in / s).
Result<Window> conv_window(int64_t in, int64_t k, int64_t s, int64_t d, bool same,
                           std::string_view dim) {
  Window w;
  int64_t effective = kUnknown;  // (k-1)*d + 1, the dilated filter's extent
  if (k >= 0) {
    if (k == 0) return invalid_argument("filter {} must be positive, got 0", dim);
    if (k - 1 > (std::numeric_limits<int64_t>::max() - 1) / d) {
      return invalid_argument("filter {} {} with dilation {} overflows int64", dim, k, d);
    }
    effective = (k - 1) * d + 1;
  }
  if (in < 0) return w;
  if (same) {
    w.out = in / s + (in % s != 0 ? 1 : 0);
    if (effective >= 0) {
      // (out-1)*s < in, so the sum stays below `effective`.
      const int64_t total = w.out == 0 ? 0 : std::max<int64_t>(0, effective - in + (w.out - 1) * s);
      w.pad_before = total / 2;
    }
    return w;
  }
  if (effective < 0) return w;
  if (effective > in) {
    if (d == 1) {
      return invalid_argument("filter {} {} is larger than the input {} {} with padding VALID", dim,
                              k, dim, in);
    }
    return invalid_argument(
        "filter {} {} dilated by {} spans {}, larger than the input {} {} with padding VALID", dim,
        k, d, effective, dim, in);
  }
  w.out = (in - effective) / s + 1;
  w.pad_before = 0;
  return w;
}

Status rank_error(const Shape& input, const Shape& filter) {
  return invalid_argument(
      "Conv2D requires a rank-4 input [batch, height, width, channels] and a rank-4 filter "
      "[height, width, in_channels, out_channels], got input {} and filter {}",
      input, filter);
}

// The output's shape and windows for (possibly partly unknown) input and
// filter shapes.
struct Geometry {
  Shape output;
  Window rows;
  Window cols;
};

Result<Geometry> conv_geometry(const Shape& input, const Shape& filter, const Conv2DParams& p) {
  if ((!input.is_unknown_rank() && input.rank() != 4) ||
      (!filter.is_unknown_rank() && filter.rank() != 4)) {
    return rank_error(input, filter);
  }
  auto dim = [](const Shape& s, int i) { return s.is_unknown_rank() ? kUnknown : s.dim(i); };
  const int64_t in_channels = dim(input, 3);
  const int64_t filter_in = dim(filter, 2);
  if (filter_in == 0) {
    return invalid_argument("filter in_channels must be positive, got filter {}", filter);
  }
  if (in_channels >= 0 && filter_in >= 0 && in_channels != filter_in) {
    return invalid_argument(
        "input has {} channels but the filter expects {} (input {}, filter {}; grouped "
        "convolution is not supported)",
        in_channels, filter_in, input, filter);
  }
  Geometry g;
  GRAPHRUN_ASSIGN_OR_RETURN(g.rows, conv_window(dim(input, 1), dim(filter, 0), p.stride_h,
                                                p.dilation_h, p.same, "height"));
  GRAPHRUN_ASSIGN_OR_RETURN(g.cols, conv_window(dim(input, 2), dim(filter, 1), p.stride_w,
                                                p.dilation_w, p.same, "width"));
  const std::vector<int64_t> dims{dim(input, 0), g.rows.out, g.cols.out, dim(filter, 3)};
  GRAPHRUN_ASSIGN_OR_RETURN(g.output, Shape::make(dims));
  return g;
}

Status conv2d_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Conv2DParams p, read_params(c));
  GRAPHRUN_ASSIGN_OR_RETURN(Geometry g, conv_geometry(c.input_shape(0), c.input_shape(1), p));
  c.set_output(0, g.output);
  return Status::ok();
}

// output[b, y, x, o] = sum over (ky, kx, c) of
//   input[b, y*sh - pad_top + ky*dh, x*sw - pad_left + kx*dw, c] * filter[ky, kx, c, o]
// with zeros outside the input.
// Thread safety: immutable after construction; compute() may run
// concurrently.
class Conv2DOp final : public OpKernel {
 public:
  explicit Conv2DOp(Conv2DParams params) : params_(params) {}

  Status compute(OpKernelContext& ctx) override {
    const Tensor& input = ctx.input(0);
    const Tensor& filter = ctx.input(1);
    if (input.dtype() != filter.dtype()) {
      return invalid_argument("input is {} but filter is {}", input.debug_type(),
                              filter.debug_type());
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Geometry g, conv_geometry(input.shape(), filter.shape(), params_));
    return visit_float(input.dtype(), [&](auto zero) {
      return compute_typed<decltype(zero)>(ctx, input, filter, g);
    });
  }

 private:
  template <typename T>
  Status compute_typed(OpKernelContext& ctx, const Tensor& input, const Tensor& filter,
                       const Geometry& g) const {
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output_uninitialized(0, g.output));
    if (out->num_elements() == 0) return Status::ok();
    const Shape& is = input.shape();
    const Shape& fs = filter.shape();
    const int64_t in_h = is.dim(1), in_w = is.dim(2), channels = is.dim(3);
    const int64_t k_h = fs.dim(0), k_w = fs.dim(1), out_channels = fs.dim(3);
    const int64_t out_h = g.output.dim(1), out_w = g.output.dim(2);
    // The filter as a [k_h*k_w*channels, out_channels] matrix; it holds
    // elements (out_channels > 0 here), so `patch` is representable.
    const int64_t patch = k_h * k_w * channels;
    const int64_t rows = g.output.dim(0) * out_h;  // output rows, each out_w pixels
    // out[first .. first + n) = patches [n, patch] x filter [patch, out_channels].
    const cpu::GemmFn<T> gemm = cpu::kernels().typed<T>().gemm;
    T* const out_data = out->flat<T>().data();
    auto product = [&](const T* patches, int64_t first, int64_t n) {
      cpu::GemmArgs<T> args;
      args.a = patches;
      args.lda = patch;
      args.b = filter.flat<T>().data();
      args.ldb = out_channels;
      args.c = out_data + first * out_channels;
      args.ldc = out_channels;
      args.m = n;
      args.n = out_channels;
      args.k = patch;
      gemm(args, 0, n, 0, out_channels);
    };

    const double macs_per_row =
        static_cast<double>(out_w) * static_cast<double>(patch) * static_cast<double>(out_channels);
    const bool parallel = rows >= 2 && macs_per_row * static_cast<double>(rows) >=
                                           static_cast<double>(kParallelMinMacs);
    const int64_t grain =
        parallel
            ? static_cast<int64_t>(std::max(1.0, static_cast<double>(kChunkMacs) / macs_per_row))
            : rows;
    std::atomic<bool> stopped{false};  // relaxed: only read after parallel_for returns

    const Conv2DParams& p = params_;
    if (k_h == 1 && k_w == 1 && p.stride_h == 1 && p.stride_w == 1) {
      // A pointwise convolution: the input already is the patch matrix.
      const T* in = input.flat<T>().data();
      ctx.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
        if (ctx.is_cancelled()) {
          stopped.store(true, std::memory_order_relaxed);
          return;
        }
        const int64_t first = begin * out_w, n = (end - begin) * out_w;
        product(in + first * channels, first, n);
      });
    } else {
      const T* in = input.flat<T>().data();
      const int64_t block = std::max<int64_t>(1, kIm2colElements / patch);
      const int64_t pad_top = g.rows.pad_before, pad_left = g.cols.pad_before;
      ctx.parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
        const int64_t last = end * out_w;
        std::vector<T> cols(
            static_cast<std::size_t>(std::min(block, last - begin * out_w) * patch));
        for (int64_t first = begin * out_w; first < last; first += block) {
          if (ctx.is_cancelled()) {
            stopped.store(true, std::memory_order_relaxed);
            return;
          }
          const int64_t n = std::min(block, last - first);
          int64_t x = first % out_w;
          int64_t y = (first / out_w) % out_h;
          int64_t b = first / (out_w * out_h);
          for (int64_t j = 0; j < n; ++j) {
            gather_patch(in + b * in_h * in_w * channels, in_h, in_w, channels, k_h, k_w,
                         y * p.stride_h - pad_top, x * p.stride_w - pad_left,
                         cols.data() + j * patch);
            if (++x == out_w) {
              x = 0;
              if (++y == out_h) {
                y = 0;
                ++b;
              }
            }
          }
          product(cols.data(), first, n);
        }
      });
    }
    if (stopped.load(std::memory_order_relaxed)) return cancelled("Conv2D stopped: step cancelled");
    return Status::ok();
  }

  // Writes the k_h*k_w*channels patch whose top-left tap is at (y0, x0) of
  // one image, in the filter's (ky, kx, c) order, with zeros for taps
  // outside the image.
  template <typename T>
  void gather_patch(const T* image, int64_t in_h, int64_t in_w, int64_t channels, int64_t k_h,
                    int64_t k_w, int64_t y0, int64_t x0, T* dst) const {
    const int64_t row_len = k_w * channels;
    for (int64_t ky = 0; ky < k_h; ++ky, dst += row_len) {
      const int64_t iy = y0 + ky * params_.dilation_h;
      if (iy < 0 || iy >= in_h) {
        std::fill_n(dst, row_len, T{0});
        continue;
      }
      const T* src_row = image + iy * in_w * channels;
      T* d = dst;
      for (int64_t kx = 0; kx < k_w; ++kx, d += channels) {
        const int64_t ix = x0 + kx * params_.dilation_w;
        if (ix < 0 || ix >= in_w) {
          std::fill_n(d, channels, T{0});
        } else {
          std::copy_n(src_row + ix * channels, channels, d);
        }
      }
    }
  }

  const Conv2DParams params_;
};

}  // namespace

void register_conv2d_op(OpRegistry& r) {
  must(r.add(
      OpDef("Conv2D")
          .input("input", "T")
          .input("filter", "T")
          .output("output", "T")
          .type_attr("T", float_dtypes())
          .required_attr("strides", std::vector<int64_t>{})
          .required_attr("padding", std::string())
          .attr("use_cudnn_on_gpu", true)
          .attr("explicit_paddings", std::vector<int64_t>{})
          .attr("data_format", std::string("NHWC"))
          .attr("dilations", std::vector<int64_t>{1, 1, 1, 1})
          .shape_fn(conv2d_shape)
          .doc("2-D convolution of an NHWC input [batch, height, width, channels] with a filter "
               "[height, width, in_channels, out_channels]; strides and dilations [1, h, w, 1], "
               "padding SAME or VALID (TF's sizes and SAME split). NCHW and EXPLICIT padding are "
               "Unimplemented; use_cudnn_on_gpu is ignored. Large convolutions split their "
               "output rows across the session's threads."),
      [](OpKernelConstruction& c) -> Result<std::unique_ptr<OpKernel>> {
        GRAPHRUN_ASSIGN_OR_RETURN(Conv2DParams p, read_params(c));
        return std::make_unique<Conv2DOp>(p);
      }));
}

}  // namespace ops_internal

namespace ops {

Output Conv2D(Graph& g, Output input, Output filter, Conv2DAttrs attrs, std::string_view name) {
  return ops_internal::add_math_node(g, "Conv2D", {input, filter},
                                     {{"strides", std::move(attrs.strides)},
                                      {"padding", std::move(attrs.padding)},
                                      {"dilations", std::move(attrs.dilations)}},
                                     name);
}

}  // namespace ops
}  // namespace graphrun
