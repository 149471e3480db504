// MatMul: values for every dtype, transposes, shapes, the parallel path.
#include <graphrun/graphrun.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "ops/math/gemm.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::TensorEq;
using ::graphrun::testing::TensorNear;

Result<Tensor> run_matmul(Tensor a, Tensor b, ops::MatMulAttrs attrs = {},
                          SessionOptions options = {}) {
  Graph g;
  Output c = ops::MatMul(g, ops::Const(g, std::move(a)), ops::Const(g, std::move(b)), attrs, "c");
  if (!g.status().is_ok()) return g.status();
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(g, options));
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out, s->run({}, {c}));
  return out.at(0);
}

TEST(MatMulOpTest, Float32) {
  Graph g;
  Output c = ops::MatMul(g, ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}})),
                         ops::Const(g, Tensor::matrix<float>({{5, 6}, {7, 8}})));
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(c.node()->op(), "MatMul");
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  ASSERT_NE(c.node()->find_attr("transpose_a"), nullptr);
  EXPECT_EQ(std::get<bool>(*c.node()->find_attr("transpose_a")), false);
  EXPECT_EQ(std::get<bool>(*c.node()->find_attr("transpose_b")), false);
  EXPECT_THAT(run_one(g, c), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{19, 22}, {43, 50}}))));
}

TEST(MatMulOpTest, OtherDTypes) {
  EXPECT_THAT(run_matmul(Tensor::matrix<double>({{1, 2}, {3, 4}}),
                         Tensor::matrix<double>({{0.5, 0}, {0, 0.25}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<double>({{0.5, 0.5}, {1.5, 1.0}}))));
  EXPECT_THAT(run_matmul(Tensor::matrix<int32_t>({{1, 2}, {3, 4}}),
                         Tensor::matrix<int32_t>({{5, 6}, {7, 8}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{19, 22}, {43, 50}}))));
  EXPECT_THAT(run_matmul(Tensor::matrix<int64_t>({{1, -2, 3}}),
                         Tensor::matrix<int64_t>({{4}, {5}, {int64_t{1} << 40}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<int64_t>({{4 - 10 + 3 * (int64_t{1} << 40)}}))));
}

TEST(MatMulOpTest, IntegerOverflowWraps) {
  const int32_t max = std::numeric_limits<int32_t>::max();
  // max*max + max*max = 2 * (2^62 - 2^32 + 1) = 2 (mod 2^32).
  EXPECT_THAT(
      run_matmul(Tensor::matrix<int32_t>({{max, max}}), Tensor::matrix<int32_t>({{max}, {max}})),
      IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{2}}))));
}

TEST(MatMulOpTest, NonSquare) {
  // [2,3] x [3,1] = [2,1].
  Graph g;
  Output c = ops::MatMul(g, ops::Const(g, Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}})),
                         ops::Const(g, Tensor::matrix<float>({{1}, {0}, {-1}})));
  EXPECT_EQ(c.shape(), (Shape{2, 1}));
  EXPECT_THAT(run_one(g, c), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{-2}, {-2}}))));
}

TEST(MatMulOpTest, Transposes) {
  const Tensor a = Tensor::matrix<float>({{1, 2}, {3, 4}});
  const Tensor a_t = Tensor::matrix<float>({{1, 3}, {2, 4}});
  const Tensor b = Tensor::matrix<float>({{5, 6}, {7, 8}});
  const Tensor b_t = Tensor::matrix<float>({{5, 7}, {6, 8}});
  const Tensor expected = Tensor::matrix<float>({{19, 22}, {43, 50}});
  EXPECT_THAT(run_matmul(a_t, b, {.transpose_a = true}), IsOkAndHolds(TensorEq(expected)));
  EXPECT_THAT(run_matmul(a, b_t, {.transpose_b = true}), IsOkAndHolds(TensorEq(expected)));
  EXPECT_THAT(run_matmul(a_t, b_t, {.transpose_a = true, .transpose_b = true}),
              IsOkAndHolds(TensorEq(expected)));
  // Non-square: a^T with a [3,2] times b [3,1] -> [2,1].
  Graph g;
  Output c =
      ops::MatMul(g, ops::Const(g, Tensor::matrix<int32_t>({{1, 4}, {2, 5}, {3, 6}})),
                  ops::Const(g, Tensor::matrix<int32_t>({{1}, {1}, {1}})), {.transpose_a = true});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(c.shape(), (Shape{2, 1}));
  EXPECT_EQ(std::get<bool>(*c.node()->find_attr("transpose_a")), true);
  EXPECT_THAT(run_one(g, c), IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{6}, {15}}))));
}

TEST(MatMulOpTest, PartiallyKnownShapes) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{-1, 3}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{3, 4}, "b");
  Output c = ops::MatMul(g, a, b);
  Output d = ops::MatMul(g, b, a, {.transpose_a = true, .transpose_b = true});
  Output e = ops::MatMul(g, a, ops::Placeholder(g, DType::kFloat32, Shape::unknown()));
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(c.shape(), (Shape{-1, 4}));
  EXPECT_EQ(d.shape(), (Shape{4, -1}));
  EXPECT_EQ(e.shape(), (Shape{-1, -1}));
  Tensor av = Tensor::matrix<float>({{1, 0, 0}});
  Tensor bv = Tensor::matrix<float>({{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}});
  EXPECT_THAT(run_one(g, c, {{a, av}, {b, bv}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2, 3, 4}}))));
}

TEST(MatMulOpTest, EmptyInnerDimensionGivesZeros) {
  EXPECT_THAT(
      run_matmul(Tensor(DType::kFloat32, Shape{2, 0}), Tensor(DType::kFloat32, Shape{0, 3})),
      IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{2, 3}))));
  EXPECT_THAT(run_matmul(Tensor(DType::kInt32, Shape{0, 4}), Tensor(DType::kInt32, Shape{4, 3})),
              IsOkAndHolds(TensorEq(Tensor(DType::kInt32, Shape{0, 3}))));
}

// A naive triple loop: c = op(a) * op(b). Raw pointers, not spans: test
// sources build at -O0 under the sanitizers, where each span index is a call.
template <typename T>
Tensor naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t m = a.shape().dim(ta ? 1 : 0), k = a.shape().dim(ta ? 0 : 1);
  const int64_t n = b.shape().dim(tb ? 0 : 1);
  const T* av = a.flat<T>().data();
  const T* bv = b.flat<T>().data();
  const int64_t a_cols = a.shape().dim(1), b_cols = b.shape().dim(1);
  Tensor c(dtype_of<T>(), Shape{m, n});
  T* cv = c.flat<T>().data();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const T x = ta ? av[p * a_cols + i] : av[i * a_cols + p];
        const T y = tb ? bv[j * b_cols + p] : bv[p * b_cols + j];
        acc += x * y;
      }
      cv[i * n + j] = acc;
    }
  }
  return c;
}

template <typename T>
Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-5, 5);
  Tensor t(dtype_of<T>(), Shape{rows, cols});
  for (T& v : t.flat<T>()) v = static_cast<T>(dist(gen));
  return t;
}

TEST(MatMulOpTest, LargeProductTakesParallelPathAndMatchesNaiveLoop) {
  // 300x200 * 200x100: 6M multiply-adds, well past the parallel threshold.
  const Tensor a = random_matrix<float>(300, 200, 1);
  const Tensor b = random_matrix<float>(200, 100, 2);
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    Result<Tensor> c = run_matmul(a, b, {}, SessionOptions{.inter_op_threads = threads});
    // Small integers: every partial sum is exact in float.
    EXPECT_THAT(c, IsOkAndHolds(TensorEq(naive_matmul<float>(a, b, false, false))));
  }
  const Tensor ai = random_matrix<int32_t>(300, 200, 3);
  const Tensor bi = random_matrix<int32_t>(200, 100, 4);
  EXPECT_THAT(run_matmul(ai, bi, {}, SessionOptions{.inter_op_threads = 4}),
              IsOkAndHolds(TensorEq(naive_matmul<int32_t>(ai, bi, false, false))));
}

TEST(MatMulOpTest, LargeTransposedProductsMatchNaiveLoop) {
  const Tensor a = random_matrix<double>(200, 300, 5);  // used transposed: [300,200]
  const Tensor b = random_matrix<double>(100, 200, 6);  // used transposed: [200,100]
  EXPECT_THAT(run_matmul(a, b, {.transpose_a = true, .transpose_b = true}),
              IsOkAndHolds(TensorNear(naive_matmul<double>(a, b, true, true))));
  const Tensor c = random_matrix<double>(300, 200, 7);
  EXPECT_THAT(run_matmul(c, b, {.transpose_b = true}),
              IsOkAndHolds(TensorNear(naive_matmul<double>(c, b, false, true))));
  const Tensor d = random_matrix<int64_t>(200, 300, 8);
  const Tensor e = random_matrix<int64_t>(200, 100, 9);
  EXPECT_THAT(run_matmul(d, e, {.transpose_a = true}),
              IsOkAndHolds(TensorEq(naive_matmul<int64_t>(d, e, true, false))));
}

// ---- The kernel against a recording runtime (no scheduler) ----

std::atomic<int> g_parallel_calls{0};
std::atomic<int64_t> g_pieces{0};

void recording_parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  g_parallel_calls.fetch_add(1);
  g_pieces.fetch_add(n);
  for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
}

// Runs `node`'s kernel once on `inputs` with the recording runtime and
// `threads` threads.
Result<Tensor> run_kernel(const Node& node, std::vector<Tensor> inputs, int threads) {
  ResourceManager resources;
  OpKernelConstruction construction(node, resources);
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> kernel,
                            node.registration().factory(construction));
  std::vector<int32_t> slots;
  for (std::size_t i = 0; i < inputs.size(); ++i) slots.push_back(static_cast<int32_t>(i));
  std::vector<Tensor> outputs(static_cast<std::size_t>(node.num_outputs()));
  KernelRuntime runtime{.parallel_for = &recording_parallel_for, .threads = threads};
  OpKernelContext ctx(node, inputs.data(), slots, outputs.data(), runtime, nullptr, 1);
  GRAPHRUN_RETURN_IF_ERROR(kernel->compute(ctx));
  return outputs[0];
}

// Runs an [m, k] x [k, n] float MatMul on `threads`; returns the pieces it
// was split into (0: one call, no parallel_for), after checking the result.
int64_t pieces_of(int64_t m, int64_t k, int64_t n, int threads) {
  Graph g;
  Output c = ops::MatMul(g, ops::Placeholder(g, DType::kFloat32, Shape{m, k}),
                         ops::Placeholder(g, DType::kFloat32, Shape{k, n}));
  EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
  const Tensor a = random_matrix<float>(m, k, 11);
  const Tensor b = random_matrix<float>(k, n, 12);
  g_parallel_calls = 0;
  g_pieces = 0;
  EXPECT_THAT(run_kernel(*c.node(), {a, b}, threads),
              IsOkAndHolds(TensorNear(naive_matmul<float>(a, b, false, false))))
      << m << "x" << k << "x" << n << " on " << threads << " threads";
  EXPECT_LE(g_parallel_calls.load(), 1);
  return g_pieces.load();
}

TEST(MatMulOpTest, MediumProductsSplitIntoOnePiecePerThread) {
  // The seed model's layer: 4.2M multiply-adds, rows in two halves of 32.
  EXPECT_EQ(pieces_of(64, 256, 256, 2), 2);
  EXPECT_TRUE(ops_internal::plan_gemm_split(64, 256, 256, 2).split_rows);
  // Too few rows for 32 per piece: columns.
  EXPECT_EQ(pieces_of(48, 512, 256, 2), 2);
  EXPECT_FALSE(ops_internal::plan_gemm_split(48, 256, 512, 2).split_rows);
  EXPECT_EQ(pieces_of(64, 256, 256, 1), 0);
  // Taller than wide: rows split.
  EXPECT_EQ(pieces_of(300, 200, 100, 2), 2);
  // Never more pieces than threads, nor pieces under 2^20 multiply-adds.
  EXPECT_EQ(pieces_of(256, 256, 256, 4), 4);
  EXPECT_EQ(pieces_of(64, 128, 256, 8), 2);
  // Small products stay one call.
  EXPECT_EQ(pieces_of(64, 64, 64, 2), 0);
  EXPECT_EQ(pieces_of(2, 2, 2, 2), 0);
  // Odd sizes: pieces end on the last column.
  EXPECT_EQ(pieces_of(33, 517, 261, 2), 2);
}

TEST(MatMulOpTest, SplitPlanCoversEveryColumnOrRowOnce) {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t extent : {1, 15, 16, 17, 100, 255, 256, 1000}) {
      for (bool tall : {false, true}) {
        const int64_t m = tall ? extent * 4 : extent;
        const int64_t n = tall ? extent : extent * 4;
        const ops_internal::GemmSplit s = ops_internal::plan_gemm_split(m, n, 4096, threads);
        const int64_t covered = s.split_rows ? m : n;
        EXPECT_LE(s.pieces, threads);
        EXPECT_GE(s.pieces, 1);
        EXPECT_GE(s.step * s.pieces, covered);
        EXPECT_LT(s.step * (s.pieces - 1), covered) << "an empty last piece";
      }
    }
  }
}

// ---- A Const operand: its packed form, kept by the kernel ----

// a (fed, [?, k] or [k, ?] transposed) x Const(w), with a bias and Relu
// when `fused` (the plan fuses them into the MatMul).
struct ConstProduct {
  Graph g;
  Output a, w, c;
  ConstProduct(const Tensor& value, ops::MatMulAttrs attrs, bool fused) {
    a = ops::Placeholder(g, value.dtype(), Shape::unknown(), "a");
    w = ops::Const(g, value, "w");
    c = ops::MatMul(g, a, w, attrs, "c");
    if (fused) {
      const int64_t n = value.shape().dim(attrs.transpose_b ? 0 : 1);
      Tensor bias(value.dtype(), Shape{n});  // zeros: Relu then clips the negatives
      c = ops::Relu(g, ops::Add(g, c, ops::Const(g, bias)));
    }
    EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
  }
};

template <typename T>
Tensor relu_of(Tensor t) {
  for (T& v : t.flat<T>()) v = std::max(v, T{0});
  return t;
}

template <typename T>
void check_const_products(int threads) {
  struct Case {
    int64_t m, k, n;
  };
  // Row halves like the seed model's layers, odd sizes, a short wide product
  // (column pieces) and a tall narrow one.
  for (const Case& cs :
       {Case{64, 256, 128}, Case{33, 300, 70}, Case{8, 256, 600}, Case{300, 64, 40}}) {
    for (int transposes = 0; transposes < 4; ++transposes) {
      for (bool fused : {false, true}) {
        const ops::MatMulAttrs attrs{.transpose_a = (transposes & 1) != 0,
                                     .transpose_b = (transposes & 2) != 0};
        SCOPED_TRACE(::testing::Message()
                     << cs.m << "x" << cs.k << "x" << cs.n << " ta=" << attrs.transpose_a << " tb="
                     << attrs.transpose_b << " fused=" << fused << " threads=" << threads);
        const Tensor w =
            attrs.transpose_b ? random_matrix<T>(cs.n, cs.k, 21) : random_matrix<T>(cs.k, cs.n, 21);
        ConstProduct p(w, attrs, fused);
        auto session = std::move(Session::create(p.g, {.inter_op_threads = threads}).value());
        auto expected = [&](const Tensor& a, const Tensor& b) {
          const Tensor c = naive_matmul<T>(a, b, attrs.transpose_a, attrs.transpose_b);
          return fused ? relu_of<T>(c) : c;
        };
        auto a_of = [&](int64_t m, uint32_t seed) {
          return attrs.transpose_a ? random_matrix<T>(cs.k, m, seed)
                                   : random_matrix<T>(m, cs.k, seed);
        };
        // Small integers: every sum is exact, so packed or not the results
        // are equal. Rows: the first run's, then fewer (down to the
        // unblocked sizes), then more.
        for (int64_t m : {cs.m, int64_t{9}, int64_t{1}, cs.m * 2 + 3}) {
          const Tensor a = a_of(m, static_cast<uint32_t>(m));
          EXPECT_THAT(session->run({{p.a, a}}, {p.c}),
                      IsOkAndHolds(::testing::ElementsAre(TensorEq(expected(a, w)))))
              << "m=" << m;
        }
        // The Const's output fed with another matrix: that one is used, not
        // the packed Const; unfed again, the Const is back.
        const Tensor a = a_of(cs.m, 5);
        const Tensor other =
            attrs.transpose_b ? random_matrix<T>(cs.n, cs.k, 22) : random_matrix<T>(cs.k, cs.n, 22);
        EXPECT_THAT(session->run({{p.a, a}, {p.w, other}}, {p.c}),
                    IsOkAndHolds(::testing::ElementsAre(TensorEq(expected(a, other)))));
        // A copy of the Const's value in another buffer (equal elements).
        EXPECT_THAT(session->run({{p.a, a}, {p.w, w.deep_copy()}}, {p.c}),
                    IsOkAndHolds(::testing::ElementsAre(TensorEq(expected(a, w)))));
        EXPECT_THAT(session->run({{p.a, a}}, {p.c}),
                    IsOkAndHolds(::testing::ElementsAre(TensorEq(expected(a, w)))));
      }
    }
  }
}

TEST(MatMulOpTest, ConstOperandsGiveTheProductsOfTheirValues) {
  check_const_products<float>(1);
  check_const_products<float>(2);
  check_const_products<double>(2);
}

TEST(MatMulOpTest, MatMulsOfOneConstShareItsPackedForm) {
  // One session resource per (Const, transpose_b); none for a fed operand,
  // an integer Const or one past 16 MiB.
  Graph g;
  const Output a = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "a");
  const Output w = ops::Const(g, random_matrix<float>(256, 256, 1), "w");
  const Output fed = ops::Placeholder(g, DType::kFloat32, Shape{256, 256}, "fed");
  const Output big = ops::Const(g, Tensor(DType::kFloat32, Shape{2049, 2048}), "big");
  const Output ai = ops::Placeholder(g, DType::kInt32, Shape{64, 256}, "ai");
  const Output wi = ops::Const(g, random_matrix<int32_t>(256, 256, 2), "wi");
  const Output products[] = {
      ops::MatMul(g, a, w),
      ops::MatMul(g, a, w),
      ops::MatMul(g, a, w, {.transpose_b = true}),
      ops::MatMul(g, a, fed),
      ops::MatMul(g, ops::Placeholder(g, DType::kFloat32, Shape{1, 2049}), big),
      ops::MatMul(g, ai, wi)};
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  ResourceManager resources;
  std::vector<std::unique_ptr<OpKernel>> kernels;
  for (const Output& p : products) {
    OpKernelConstruction construction(*p.node(), resources);
    Result<std::unique_ptr<OpKernel>> k = p.node()->registration().factory(construction);
    ASSERT_TRUE(k.is_ok()) << k.status().to_string();
    kernels.push_back(*std::move(k));
  }
  EXPECT_EQ(resources.size(), 2u) << "w as B, and w as B^T";
}

TEST(MatMulOpTest, FirstProductsOfAConstOperandFromManyThreadsAgree) {
  // The operand is packed by whichever call comes first; the others wait
  // for it (and TSan watches them).
  const Tensor w = random_matrix<float>(256, 256, 31);
  ConstProduct p(w, {}, /*fused=*/true);
  auto session = std::move(Session::create(p.g, {.inter_op_threads = 2}).value());
  constexpr int kCallers = 4;
  std::vector<Tensor> inputs;
  for (int i = 0; i < kCallers; ++i) inputs.push_back(random_matrix<float>(64, 256, 40 + i));
  std::vector<std::optional<Result<std::vector<Tensor>>>> results(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { results[i] = session->run({{p.a, inputs[i]}}, {p.c}); });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) {
    ASSERT_TRUE(results[i].has_value());
    EXPECT_THAT(*results[i], IsOkAndHolds(::testing::ElementsAre(TensorEq(
                                 relu_of<float>(naive_matmul<float>(inputs[i], w, false, false))))))
        << "caller " << i;
  }
}

}  // namespace
}  // namespace graphrun
