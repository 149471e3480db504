// Conv2D: against a naive reference over a sweep of shapes, hand-checked
// examples, TF's fixture, partially known shapes, every error path, and the
// parallel path through a Session.
#include <graphrun/graphrun.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string message(const Status& s) { return s.message(); }

struct ConvCase {
  int64_t strides_h = 1, strides_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  bool same = false;
};

ops::Conv2DAttrs attrs_of(const ConvCase& c) {
  return {.strides = {1, c.strides_h, c.strides_w, 1},
          .padding = c.same ? "SAME" : "VALID",
          .dilations = {1, c.dilation_h, c.dilation_w, 1}};
}

// TF's output size and leading padding of one dimension, or -1 when VALID
// and the dilated filter does not fit.
struct RefWindow {
  int64_t out;
  int64_t pad;
};
RefWindow ref_window(int64_t in, int64_t k, int64_t s, int64_t d, bool same) {
  const int64_t effective = (k - 1) * d + 1;
  if (same) {
    const int64_t out = (in + s - 1) / s;
    const int64_t total = std::max<int64_t>(0, (out - 1) * s + effective - in);
    return {out, total / 2};
  }
  if (effective > in) return {-1, 0};
  return {(in - effective + s) / s, 0};
}

// The definition, seven loops deep: output[b,y,x,o] = sum over ky, kx, c.
template <typename T>
Tensor naive_conv2d(const Tensor& input, const Tensor& filter, const ConvCase& c) {
  const Shape& is = input.shape();
  const Shape& fs = filter.shape();
  const int64_t n = is.dim(0), ih = is.dim(1), iw = is.dim(2), ic = is.dim(3);
  const int64_t kh = fs.dim(0), kw = fs.dim(1), oc = fs.dim(3);
  const RefWindow rh = ref_window(ih, kh, c.strides_h, c.dilation_h, c.same);
  const RefWindow rw = ref_window(iw, kw, c.strides_w, c.dilation_w, c.same);
  Tensor out(dtype_of<T>(), Shape{n, rh.out, rw.out, oc});
  auto in = input.flat<T>();
  auto f = filter.flat<T>();
  auto o = out.flat<T>();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t y = 0; y < rh.out; ++y) {
      for (int64_t x = 0; x < rw.out; ++x) {
        for (int64_t q = 0; q < oc; ++q) {
          T acc = 0;
          for (int64_t ky = 0; ky < kh; ++ky) {
            for (int64_t kx = 0; kx < kw; ++kx) {
              for (int64_t ch = 0; ch < ic; ++ch) {
                const int64_t iy = y * c.strides_h - rh.pad + ky * c.dilation_h;
                const int64_t ix = x * c.strides_w - rw.pad + kx * c.dilation_w;
                if (iy < 0 || iy >= ih || ix < 0 || ix >= iw) continue;
                acc += in[((b * ih + iy) * iw + ix) * ic + ch] *
                       f[((ky * kw + kx) * ic + ch) * oc + q];
              }
            }
          }
          o[((b * rh.out + y) * rw.out + x) * oc + q] = acc;
        }
      }
    }
  }
  return out;
}

// Small integers, so every sum is exact in float and the kernel's result
// must equal the reference bit for bit.
template <typename T>
Tensor random_tensor(const Shape& shape, std::mt19937& gen) {
  std::uniform_int_distribution<int> dist(-3, 3);
  Tensor t(dtype_of<T>(), shape);
  for (T& v : t.flat<T>()) v = static_cast<T>(dist(gen));
  return t;
}

Result<Tensor> run_conv(const Tensor& input, const Tensor& filter, const ops::Conv2DAttrs& attrs,
                        SessionOptions options = {}) {
  Graph g;
  Output y = ops::Conv2D(g, ops::Const(g, input), ops::Const(g, filter), attrs, "conv");
  if (!g.status().is_ok()) return g.status();
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(g, options));
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out, s->run({}, {y}));
  return out.at(0);
}

template <typename T>
void sweep_against_reference(uint32_t seed, int cases) {
  std::mt19937 gen(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  int ran = 0;
  int too_large = 0;
  for (int i = 0; i < cases; ++i) {
    const ConvCase c{.strides_h = pick(1, 3),
                     .strides_w = pick(1, 3),
                     .dilation_h = pick(1, 2),
                     .dilation_w = pick(1, 2),
                     .same = pick(0, 1) == 1};
    const int64_t n = pick(1, 3), ih = pick(1, 9), iw = pick(1, 9), ic = pick(1, 4);
    const int64_t kh = pick(1, 4), kw = pick(1, 4), oc = pick(1, 4);
    const Tensor input = random_tensor<T>(Shape{n, ih, iw, ic}, gen);
    const Tensor filter = random_tensor<T>(Shape{kh, kw, ic, oc}, gen);
    SCOPED_TRACE(::testing::Message() << "input " << input.shape().to_string() << " filter "
                                      << filter.shape().to_string() << " strides " << c.strides_h
                                      << "," << c.strides_w << " dilations " << c.dilation_h << ","
                                      << c.dilation_w << " " << (c.same ? "SAME" : "VALID"));
    Result<Tensor> got = run_conv(input, filter, attrs_of(c));
    const bool fits =
        c.same || ((kh - 1) * c.dilation_h + 1 <= ih && (kw - 1) * c.dilation_w + 1 <= iw);
    if (!fits) {
      ++too_large;
      EXPECT_THAT(got, StatusIs(StatusCode::kInvalidArgument, "padding VALID"));
      continue;
    }
    ++ran;
    EXPECT_THAT(got, IsOkAndHolds(TensorEq(naive_conv2d<T>(input, filter, c))));
  }
  // The sweep covered both outcomes.
  EXPECT_GT(ran, cases / 2);
  EXPECT_GT(too_large, 0);
}

TEST(Conv2DOpTest, SweepMatchesNaiveReferenceFloat) { sweep_against_reference<float>(1, 400); }
TEST(Conv2DOpTest, SweepMatchesNaiveReferenceDouble) { sweep_against_reference<double>(2, 400); }

// Every stride, dilation and kernel size on every small input size, for
// both paddings (batch 1, 2 channels in, 3 out).
TEST(Conv2DOpTest, GridOfWindowsMatchesNaiveReference) {
  std::mt19937 gen(3);
  for (bool same : {false, true}) {
    for (int64_t in = 1; in <= 9; ++in) {
      for (int64_t k = 1; k <= 4; ++k) {
        for (int64_t s = 1; s <= 3; ++s) {
          for (int64_t d = 1; d <= 2; ++d) {
            if (!same && (k - 1) * d + 1 > in) continue;
            const ConvCase c{.strides_h = s,
                             .strides_w = 4 - s,
                             .dilation_h = d,
                             .dilation_w = 3 - d,
                             .same = same};
            if (!same && (k - 1) * c.dilation_w + 1 > in + 1) continue;
            const Tensor input = random_tensor<float>(Shape{1, in, in + 1, 2}, gen);
            const Tensor filter = random_tensor<float>(Shape{k, k, 2, 3}, gen);
            SCOPED_TRACE(::testing::Message() << "in " << in << " k " << k << " s " << s << " d "
                                              << d << (same ? " SAME" : " VALID"));
            EXPECT_THAT(run_conv(input, filter, attrs_of(c)),
                        IsOkAndHolds(TensorEq(naive_conv2d<float>(input, filter, c))));
          }
        }
      }
    }
  }
}

// ---- Hand-checked examples ----

Tensor image3x3() {
  return Tensor(Shape{1, 3, 3, 1}, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f});
}
Tensor ones2x2() { return Tensor::filled(Shape{2, 2, 1, 1}, 1.0f); }

TEST(Conv2DOpTest, TwoByTwoOnesValid) {
  // Each output is the sum of a 2x2 window of [[1,2,3],[4,5,6],[7,8,9]].
  Graph g;
  Output y = ops::Conv2D(g, ops::Const(g, image3x3()), ops::Const(g, ones2x2()), {}, "conv");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.node()->op(), "Conv2D");
  EXPECT_EQ(y.shape(), (Shape{1, 2, 2, 1}));
  EXPECT_THAT(run_one(g, y),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 2, 2, 1}, {12.0f, 16.0f, 24.0f, 28.0f}))));
}

TEST(Conv2DOpTest, TwoByTwoOnesSamePadsAfter) {
  // SAME with a 2x2 window pads one row and column, all after (TF's split).
  EXPECT_THAT(run_conv(image3x3(), ones2x2(), {.padding = "SAME"}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 3, 3, 1}, {12.0f, 16.0f, 9.0f, 24.0f, 28.0f,
                                                               15.0f, 15.0f, 17.0f, 9.0f}))));
  // Stride 2: rows and columns 0 and 2 of the above.
  EXPECT_THAT(run_conv(image3x3(), ones2x2(), {.strides = {1, 2, 2, 1}, .padding = "SAME"}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 2, 2, 1}, {12.0f, 9.0f, 15.0f, 9.0f}))));
  // 3 taps on 4 elements: total padding 2, one before and one after.
  EXPECT_THAT(run_conv(Tensor(Shape{1, 1, 4, 1}, {1.0, 2.0, 3.0, 4.0}),
                       Tensor::filled(Shape{1, 3, 1, 1}, 1.0), {.padding = "SAME"}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 1, 4, 1}, {3.0, 6.0, 9.0, 7.0}))));
}

TEST(Conv2DOpTest, DilatedWindowSkipsTaps) {
  // A 2x2 filter dilated by 2 reads the four corners of the 3x3 image.
  EXPECT_THAT(run_conv(image3x3(), ones2x2(), {.dilations = {1, 2, 2, 1}}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 1, 1, 1}, {20.0f}))));
  // Different weights per tap: 1*1 + 10*3 + 100*7 + 1000*9.
  EXPECT_THAT(run_conv(image3x3(), Tensor(Shape{2, 2, 1, 1}, {1.0f, 10.0f, 100.0f, 1000.0f}),
                       {.dilations = {1, 2, 2, 1}}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 1, 1, 1}, {9731.0f}))));
}

TEST(Conv2DOpTest, ChannelsMixThroughTheFilter) {
  // One pixel with channels [1, 2]; filter [[1,2,3],[4,5,6]] (in x out).
  EXPECT_THAT(run_conv(Tensor(Shape{1, 1, 1, 2}, {1.0, 2.0}),
                       Tensor(Shape{1, 1, 2, 3}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}), {}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 1, 1, 3}, {9.0, 12.0, 15.0}))));
}

TEST(Conv2DOpTest, NodeCarriesTensorFlowAttrs) {
  Graph g;
  Output y = ops::Conv2D(g, ops::Const(g, image3x3()), ops::Const(g, ones2x2()),
                         {.strides = {1, 2, 1, 1}, .padding = "SAME"}, "conv");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  const Node& n = *y.node();
  EXPECT_EQ(std::get<std::vector<int64_t>>(*n.find_attr("strides")),
            (std::vector<int64_t>{1, 2, 1, 1}));
  EXPECT_EQ(std::get<std::string>(*n.find_attr("padding")), "SAME");
  EXPECT_EQ(std::get<std::vector<int64_t>>(*n.find_attr("dilations")),
            (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(std::get<std::string>(*n.find_attr("data_format")), "NHWC");
  EXPECT_EQ(std::get<bool>(*n.find_attr("use_cudnn_on_gpu")), true);
  EXPECT_TRUE(std::get<std::vector<int64_t>>(*n.find_attr("explicit_paddings")).empty());
  EXPECT_EQ(std::get<DType>(*n.find_attr("T")), DType::kFloat32);
  EXPECT_EQ(y.shape(), (Shape{1, 2, 3, 1}));
}

// The case of TF's conv fixture: two SAME stride-2 layers on zeros.
TEST(Conv2DOpTest, TensorFlowFixtureTwoSameStride2Layers) {
  std::mt19937 gen(4);
  Graph g;
  Output x = ops::Const(g, Tensor(DType::kFloat32, Shape{2, 6, 6, 3}), "x");
  Output h = ops::Conv2D(g, x, ops::Const(g, random_tensor<float>(Shape{3, 3, 3, 6}, gen)),
                         {.strides = {1, 2, 2, 1}, .padding = "SAME"}, "conv1");
  Output y = ops::Conv2D(g, h, ops::Const(g, random_tensor<float>(Shape{2, 2, 6, 12}, gen)),
                         {.strides = {1, 2, 2, 1}, .padding = "SAME"}, "conv2");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(h.shape(), (Shape{2, 3, 3, 6}));
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2, 12}));
  Result<std::vector<Tensor>> out = testing::run_all(g, {h, y});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_THAT((*out)[0], TensorEq(Tensor(DType::kFloat32, Shape{2, 3, 3, 6})));
  EXPECT_THAT((*out)[1], TensorEq(Tensor(DType::kFloat32, Shape{2, 2, 2, 12})));
}

TEST(Conv2DOpTest, EmptyBatchAndZeroOutChannels) {
  EXPECT_THAT(run_conv(Tensor(DType::kFloat32, Shape{0, 3, 3, 1}), ones2x2(), {}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0, 2, 2, 1}))));
  EXPECT_THAT(run_conv(image3x3(), Tensor(DType::kFloat32, Shape{2, 2, 1, 0}), {}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{1, 2, 2, 0}))));
}

TEST(Conv2DOpTest, PartiallyKnownShapes) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 5, -1, 3}, "x");
  Output f = ops::Placeholder(g, DType::kFloat32, Shape{2, 2, 3, 4}, "f");
  Output valid = ops::Conv2D(g, x, f, {}, "valid");
  Output same = ops::Conv2D(g, x, f, {.strides = {1, 2, 2, 1}, .padding = "SAME"}, "same");
  // SAME sizes depend on the input only: known with an unknown filter.
  Output unknown_filter = ops::Conv2D(g, x, ops::Placeholder(g, DType::kFloat32, Shape::unknown()),
                                      {.strides = {1, 2, 1, 1}, .padding = "SAME"});
  Output unknown_input =
      ops::Conv2D(g, ops::Placeholder(g, DType::kFloat32, Shape::unknown()), f, {});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(valid.shape(), (Shape{-1, 4, -1, 4}));
  EXPECT_EQ(same.shape(), (Shape{-1, 3, -1, 4}));
  EXPECT_EQ(unknown_filter.shape(), (Shape{-1, 3, -1, -1}));
  EXPECT_EQ(unknown_input.shape(), (Shape{-1, -1, -1, 4}));
  std::mt19937 gen(5);
  const Tensor xv = random_tensor<float>(Shape{2, 5, 4, 3}, gen);
  const Tensor fv = random_tensor<float>(Shape{2, 2, 3, 4}, gen);
  EXPECT_THAT(run_one(g, valid, {{x, xv}, {f, fv}}),
              IsOkAndHolds(TensorEq(naive_conv2d<float>(xv, fv, {}))));
}

// ---- The parallel path ----

TEST(Conv2DOpTest, LargeConvolutionsThroughSessionMatchReference) {
  std::mt19937 gen(6);
  struct Big {
    Shape input;
    Shape filter;
    ConvCase c;
  };
  const std::vector<Big> cases = {
      {Shape{3, 32, 32, 8}, Shape{3, 3, 8, 16}, {.same = true}},
      {Shape{2, 40, 33, 4}, Shape{3, 4, 4, 32}, {.strides_h = 2, .dilation_w = 2}},
      {Shape{2, 30, 30, 16},
       Shape{5, 5, 16, 8},
       {.strides_h = 1, .strides_w = 2, .dilation_h = 2, .same = true}},
      {Shape{4, 32, 32, 64}, Shape{1, 1, 64, 32}, {}},  // pointwise
      // 576-element patches: im2col blocks of 455 pixels end mid-row.
      {Shape{1, 30, 30, 64}, Shape{3, 3, 64, 2}, {.same = true}},
      {Shape{2, 24, 24, 64}, Shape{3, 3, 64, 4}, {.strides_w = 2, .same = true}},
  };
  for (const Big& b : cases) {
    const Tensor input = random_tensor<float>(b.input, gen);
    const Tensor filter = random_tensor<float>(b.filter, gen);
    const Tensor expected = naive_conv2d<float>(input, filter, b.c);
    for (int threads : {1, 4}) {
      SCOPED_TRACE(::testing::Message() << b.input.to_string() << " * " << b.filter.to_string()
                                        << " threads " << threads);
      EXPECT_THAT(
          run_conv(input, filter, attrs_of(b.c), SessionOptions{.inter_op_threads = threads}),
          IsOkAndHolds(TensorEq(expected)));
    }
  }
}

std::atomic<int> g_parallel_calls{0};
std::atomic<int> g_chunks{0};
std::atomic<int64_t> g_rows_covered{0};

void recording_parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  g_parallel_calls.fetch_add(1);
  for (int64_t b = 0; b < n; b += grain) {
    const int64_t e = std::min(n, b + grain);
    g_chunks.fetch_add(1);
    g_rows_covered.fetch_add(e - b);
    fn(b, e);
  }
}

// Runs `node`'s kernel once on `inputs` with the recording runtime.
Result<Tensor> run_kernel(const Node& node, std::vector<Tensor> inputs) {
  ResourceManager resources;
  OpKernelConstruction construction(node, resources);
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> kernel,
                            node.registration().factory(construction));
  EXPECT_FALSE(kernel->is_cheap());
  std::vector<int32_t> slots;
  for (std::size_t i = 0; i < inputs.size(); ++i) slots.push_back(static_cast<int32_t>(i));
  std::vector<Tensor> outputs(static_cast<std::size_t>(node.num_outputs()));
  KernelRuntime runtime{.parallel_for = &recording_parallel_for};
  OpKernelContext ctx(node, inputs.data(), slots, outputs.data(), runtime, nullptr, 1);
  GRAPHRUN_RETURN_IF_ERROR(kernel->compute(ctx));
  return outputs[0];
}

TEST(Conv2DOpTest, KernelSplitsBatchTimesOutputRowsIntoChunks) {
  Graph g;
  Output y =
      ops::Conv2D(g, ops::Placeholder(g, DType::kFloat32, Shape{3, 32, 32, 8}),
                  ops::Placeholder(g, DType::kFloat32, Shape{3, 3, 8, 16}), {.padding = "SAME"});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  std::mt19937 gen(7);
  const Tensor input = random_tensor<float>(Shape{3, 32, 32, 8}, gen);
  const Tensor filter = random_tensor<float>(Shape{3, 3, 8, 16}, gen);
  g_parallel_calls = 0;
  g_chunks = 0;
  g_rows_covered = 0;
  EXPECT_THAT(run_kernel(*y.node(), {input, filter}),
              IsOkAndHolds(TensorEq(naive_conv2d<float>(input, filter, {.same = true}))));
  EXPECT_EQ(g_parallel_calls.load(), 1);
  EXPECT_GT(g_chunks.load(), 1);
  EXPECT_EQ(g_rows_covered.load(), 3 * 32);  // batch x output rows

  // A small convolution stays one chunk.
  Graph small;
  Output s = ops::Conv2D(small, ops::Placeholder(small, DType::kFloat32, Shape{1, 3, 3, 1}),
                         ops::Placeholder(small, DType::kFloat32, Shape{2, 2, 1, 1}));
  g_parallel_calls = 0;
  EXPECT_THAT(run_kernel(*s.node(), {image3x3(), ones2x2()}),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 2, 2, 1}, {12.0f, 16.0f, 24.0f, 28.0f}))));
  EXPECT_EQ(g_parallel_calls.load(), 0);
}

// ---- Errors at build time (known shapes and attrs) ----

// Adds a Conv2D named "conv" with `overrides` on top of strides [1,1,1,1]
// and padding VALID; returns the graph's status.
Status build_conv(const Shape& input, const Shape& filter, AttrMap overrides,
                  DType input_dtype = DType::kFloat32, DType filter_dtype = DType::kFloat32) {
  Graph g;
  AttrMap attrs{{"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("VALID")}};
  for (auto& [k, v] : overrides) attrs.insert_or_assign(k, v);
  Result<Node*> n = g.add_node(NodeSpec{.op = "Conv2D",
                                        .name = "conv",
                                        .inputs = {ops::Placeholder(g, input_dtype, input),
                                                   ops::Placeholder(g, filter_dtype, filter)},
                                        .attrs = std::move(attrs)});
  if (n.is_ok()) {
    EXPECT_TRUE(g.status().is_ok());
  }
  return g.status();
}

const Shape kIn{1, 5, 5, 2};
const Shape kFilter{3, 3, 2, 4};

TEST(Conv2DErrorTest, Ranks) {
  Status s = build_conv(Shape{5, 5, 2}, kFilter, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), AllOf(HasSubstr("rank-4"), HasSubstr("input [5,5,2]")));
  s = build_conv(kIn, Shape{3, 3, 2}, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("filter [3,3,2]"));
}

TEST(Conv2DErrorTest, ChannelMismatch) {
  Status s = build_conv(kIn, Shape{3, 3, 3, 4}, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), AllOf(HasSubstr("input has 2 channels but the filter expects 3"),
                                HasSubstr("[1,5,5,2]"), HasSubstr("[3,3,3,4]")));
}

TEST(Conv2DErrorTest, StridesAndDilations) {
  struct Bad {
    const char* attr;
    std::vector<int64_t> value;
    const char* expected;
  };
  const std::vector<Bad> bad = {
      {"strides", {1, 1, 1}, "strides must have 4 entries [1, height, width, 1], got [1,1,1]"},
      {"strides",
       {2, 1, 1, 1},
       "strides on the batch and channel dimensions must be 1, got [2,1,1,1]"},
      {"strides", {1, 1, 1, 3}, "strides on the batch and channel dimensions must be 1"},
      {"strides", {1, 0, 1, 1}, "strides must be positive, got [1,0,1,1]"},
      {"strides", {1, 1, -2, 1}, "strides must be positive"},
      {"dilations", {1, 1}, "dilations must have 4 entries"},
      {"dilations", {2, 1, 1, 1}, "dilations on the batch and channel dimensions must be 1"},
      {"dilations", {1, 1, 1, 2}, "dilations on the batch and channel dimensions must be 1"},
      {"dilations", {1, 0, 1, 1}, "dilations must be positive, got [1,0,1,1]"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.expected);
    Status s = build_conv(kIn, kFilter, {{b.attr, b.value}});
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
    EXPECT_THAT(message(s), HasSubstr(b.expected));
  }
}

TEST(Conv2DErrorTest, ValidFilterLargerThanInput) {
  Status s = build_conv(Shape{1, 2, 5, 2}, kFilter, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s),
              HasSubstr("filter height 3 is larger than the input height 2 with padding VALID"));
  s = build_conv(Shape{1, 5, 4, 2}, kFilter, {{"dilations", std::vector<int64_t>{1, 1, 2, 1}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("filter width 3 dilated by 2 spans 5, larger than the input "
                                    "width 4 with padding VALID"));
  // SAME accepts any filter size.
  EXPECT_THAT(build_conv(Shape{1, 2, 2, 2}, kFilter, {{"padding", std::string("SAME")}}),
              testing::IsOk());
}

TEST(Conv2DErrorTest, EmptyFilterWindowOrChannels) {
  Status s = build_conv(kIn, Shape{0, 3, 2, 4}, {{"padding", std::string("SAME")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("filter height must be positive"));
  s = build_conv(Shape{1, 5, 5, 0}, Shape{3, 3, 0, 4}, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("filter in_channels must be positive"));
}

TEST(Conv2DErrorTest, Padding) {
  Status s = build_conv(kIn, kFilter, {{"padding", std::string("EXPLICIT")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kUnimplemented, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("padding \"EXPLICIT\" is not supported"));
  s = build_conv(kIn, kFilter, {{"padding", std::string("same")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("padding must be \"SAME\" or \"VALID\", got \"same\""));
  s = build_conv(kIn, kFilter,
                 {{"explicit_paddings", std::vector<int64_t>{0, 0, 1, 1, 1, 1, 0, 0}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("explicit_paddings must be empty"));
}

TEST(Conv2DErrorTest, DataFormat) {
  Status s = build_conv(kIn, kFilter, {{"data_format", std::string("NCHW")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kUnimplemented, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("data_format \"NCHW\" is not supported"));
  s = build_conv(kIn, kFilter, {{"data_format", std::string("HWCN")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("got \"HWCN\""));
}

TEST(Conv2DErrorTest, AttrKindsAndRequiredAttrs) {
  Graph g;
  Result<Node*> n = g.add_node(NodeSpec{.op = "Conv2D",
                                        .name = "conv",
                                        .inputs = {ops::Placeholder(g, DType::kFloat32, kIn),
                                                   ops::Placeholder(g, DType::kFloat32, kFilter)},
                                        .attrs = {{"padding", std::string("SAME")}}});
  EXPECT_FALSE(n.is_ok());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(g.status()), HasSubstr("required attribute 'strides'"));
  Status s = build_conv(kIn, kFilter, {{"strides", int64_t{1}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("'strides' must be a list(int)"));
}

TEST(Conv2DErrorTest, DTypes) {
  Status s = build_conv(kIn, kFilter, {}, DType::kInt32, DType::kInt32);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("int32"));
  s = build_conv(kIn, kFilter, {}, DType::kFloat32, DType::kFloat64);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), AllOf(HasSubstr("float32"), HasSubstr("float64")));
}

TEST(Conv2DErrorTest, SizesThatOverflow) {
  // A dilated extent past int64.
  Status s = build_conv(kIn, kFilter,
                        {{"dilations", std::vector<int64_t>{1, int64_t{1} << 62, 1, 1}},
                         {"padding", std::string("SAME")}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("overflows int64"));
  // An output with more elements than int64 counts: 2^60 pixels x 2^10.
  s = build_conv(Shape{1, int64_t{1} << 30, int64_t{1} << 30, 1}, Shape{1, 1, 1, int64_t{1} << 10},
                 {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(s), HasSubstr("more elements than int64 can count"));
}

// ---- Errors at run time (shapes known only when fed) ----

class Conv2DRunErrorTest : public ::testing::Test {
 protected:
  Result<Tensor> run(const Tensor& input, const Tensor& filter, ops::Conv2DAttrs attrs = {}) {
    Graph g;
    Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
    Output f = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "f");
    Output y = ops::Conv2D(g, x, f, std::move(attrs), "conv");
    EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
    return run_one(g, y, {{x, input}, {f, filter}});
  }
};

TEST_F(Conv2DRunErrorTest, Rank) {
  Result<Tensor> r = run(Tensor::matrix<float>({{1, 2}}), ones2x2());
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(r.status()), AllOf(HasSubstr("rank-4"), HasSubstr("input [1,2]")));
}

TEST_F(Conv2DRunErrorTest, ChannelMismatch) {
  Result<Tensor> r = run(image3x3(), Tensor(DType::kFloat32, Shape{2, 2, 3, 1}));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(r.status()), HasSubstr("input has 1 channels but the filter expects 3"));
}

TEST_F(Conv2DRunErrorTest, ValidFilterLargerThanInput) {
  Result<Tensor> r = run(image3x3(), Tensor(DType::kFloat32, Shape{4, 1, 1, 1}));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(r.status()),
              HasSubstr("filter height 4 is larger than the input height 3 with padding VALID"));
  r = run(image3x3(), Tensor(DType::kFloat32, Shape{0, 1, 1, 1}), {.padding = "SAME"});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'conv' (Conv2D)"));
  EXPECT_THAT(message(r.status()), HasSubstr("filter height must be positive"));
}

}  // namespace
}  // namespace graphrun
