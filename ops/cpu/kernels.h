// The instruction-set-dependent inner loops of the built-in heavy kernels,
// behind a table of function pointers (ops only, not installed).
//
// ops/cpu/kernels.cc is compiled once per level (AVX-512, AVX2+FMA, the
// baseline), each time into its own namespace and, after a partial link,
// with every symbol it defines renamed for that level (cmake/
// GraphrunCpuIsa.cmake), so no Eigen template instantiated for one level
// can stand in for another's. The op kernels in ops/math keep shape checks,
// dtypes and parallel_for, are compiled once, and call kernels().
//
// Thread safety: the tables are immutable; every function is reentrant.
#pragma once

#include <graphrun/op_kernel.h>

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace graphrun::cpu {

enum class Activation : uint8_t { kNone, kRelu, kSigmoid, kTanh };

// One block of C = op(A) op(B) (+ bias, then activation): the rows
// [row_begin, row_end) and columns [col_begin, col_end) of C. Matrices are
// row-major with leading dimensions (elements between rows); op(X) is X's
// transpose when its flag is set. k = 0 gives zeros (then the epilogue).
// Integer products wrap.
template <typename T>
struct GemmArgs {
  const T* a = nullptr;  // [m, k], or [k, m] when transpose_a
  int64_t lda = 0;
  bool transpose_a = false;
  const T* b = nullptr;  // [k, n], or [n, k] when transpose_b
  int64_t ldb = 0;
  bool transpose_b = false;
  T* c = nullptr;  // [m, n]
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;
  const T* bias = nullptr;                    // n values added to every row, or null
  Activation activation = Activation::kNone;  // floats only
};
template <typename T>
using GemmFn = void (*)(const GemmArgs<T>& g, int64_t row_begin, int64_t row_end, int64_t col_begin,
                        int64_t col_end);

// Integer Neg and Square wrap; Sqrt..Sigmoid are for floats (integers go
// through double).
enum class UnaryOp : uint8_t { kNeg, kSquare, kRelu, kSqrt, kExp, kLog, kTanh, kSigmoid };
template <typename T>
using UnaryFn = void (*)(UnaryOp op, const T* x, T* y, int64_t n);

// Integer Add/Sub/Mul wrap; integer Div truncates, x / -1 wraps, and the
// caller has ruled out zero divisors.
enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };
// Which operand is a single value broadcast over the other's n.
enum class Operands : uint8_t { kBothVectors, kScalarX, kScalarY };
template <typename T>
using BinaryFn = void (*)(BinaryOp op, Operands form, const T* x, const T* y, T* z, int64_t n);

// Max propagates NaN; integer Sum wraps.
enum class ReduceOp : uint8_t { kSum, kMax };
// The reduction of x[0, n), n >= 1.
template <typename T>
using ReduceFn = T (*)(ReduceOp op, const T* x, int64_t n);
// acc[j] = combine(acc[j], row[j]) for j in [0, n).
template <typename T>
using AccumulateFn = void (*)(ReduceOp op, const T* row, T* acc, int64_t n);
// float32 sums in double (a float running total stops growing once it is
// 2^24 times its addends): the sum of x[0, n), n >= 1; and acc[j] += row[j]
// for j in [0, n).
using SumToDoubleFn = double (*)(const float* x, int64_t n);
using AccumulateToDoubleFn = void (*)(const float* row, double* acc, int64_t n);

// Products at least this large (every edge >= kGemmBlockedMinEdge and
// m*n*k >= kGemmBlockedMinMacs) run through the blocked GEMM kernel, which
// packs its operands; smaller ones through Eigen's lazy and GEMV paths.
inline constexpr int64_t kGemmBlockedMinEdge = 8;
inline constexpr double kGemmBlockedMinMacs = 32 * 32 * 32;
inline bool gemm_is_blocked(int64_t m, int64_t n, int64_t k) {
  return m >= kGemmBlockedMinEdge && n >= kGemmBlockedMinEdge &&
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >=
             kGemmBlockedMinMacs;
}

// op(B) of products whose B does not change (a Const's value), packed once
// in the layout the blocked kernel of one level reads, so that a product
// packs only its A. C's columns fall into `blocks()` blocks of `block`
// columns (the last may be narrower), which callers may compute apart.
// Made by TypedKernels::pack_b; read-only afterwards, so one PackedGemmB
// serves concurrent products.
template <typename T>
struct PackedGemmB {
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  CpuIsa isa = CpuIsa::kBaseline;  // the level whose kernel packed it (and may read it)
  int64_t k = 0, n = 0;
  int64_t block = 0;             // columns of C per block
  int64_t depth_block = 0;       // k per packed panel
  std::vector<int64_t> offsets;  // of each (column block, depth panel), in elements
  std::unique_ptr<T[], Free> data;

  int64_t blocks() const { return block == 0 ? 0 : (n + block - 1) / block; }
};
// op(B) ([k, n]: B, or B's transpose when transpose_b) packed, with blocks
// of at most `max_block` columns (0: the kernel's choice for this cache) and
// panels sized for products of about `m_hint` rows. k, n >= 1.
template <typename T>
using PackBFn = std::unique_ptr<PackedGemmB<T>> (*)(const T* b, int64_t ldb, bool transpose_b,
                                                    int64_t k, int64_t n, int64_t m_hint,
                                                    int64_t max_block);
// Rows [row_begin, row_end) of C = op(A) op(B) (+ bias, activation) in the
// column blocks [block_begin, block_end) of `b`, which g.b/g.ldb/g.transpose_b
// are ignored for. g.k and g.n must be b's; `b` must come from the same
// level's pack_b.
template <typename T>
using GemmPackedFn = void (*)(const GemmArgs<T>& g, const PackedGemmB<T>& b, int64_t row_begin,
                              int64_t row_end, int64_t block_begin, int64_t block_end);

template <typename T>
struct TypedKernels {
  GemmFn<T> gemm = nullptr;
  UnaryFn<T> unary = nullptr;
  BinaryFn<T> binary = nullptr;
  ReduceFn<T> reduce = nullptr;
  AccumulateFn<T> accumulate = nullptr;
  PackBFn<T> pack_b = nullptr;                          // floats only (null for integers)
  GemmPackedFn<T> gemm_packed = nullptr;                // floats only
  SumToDoubleFn sum_to_double = nullptr;                // float32 only
  AccumulateToDoubleFn accumulate_to_double = nullptr;  // float32 only
};

struct KernelTable {
  CpuIsa isa = CpuIsa::kBaseline;
  TypedKernels<float> f32;
  TypedKernels<double> f64;
  TypedKernels<int32_t> i32;
  TypedKernels<int64_t> i64;

  template <typename T>
  const TypedKernels<T>& typed() const {
    if constexpr (std::is_same_v<T, float>) {
      return f32;
    } else if constexpr (std::is_same_v<T, double>) {
      return f64;
    } else if constexpr (std::is_same_v<T, int32_t>) {
      return i32;
    } else {
      static_assert(std::is_same_v<T, int64_t>);
      return i64;
    }
  }
};

// The table of cpu_isa()'s level.
const KernelTable& kernels();
// The table of one level, for tests and benches; null when the binary was
// built without it (a non-x86 target). Calling a level the CPU lacks
// crashes with SIGILL: check cpu_isa_supported() first.
const KernelTable* kernels_for(CpuIsa isa);

// Each level's table (ops/cpu/kernels.cc, one definition per level).
const KernelTable& kernel_table_baseline();
const KernelTable& kernel_table_avx2();
const KernelTable& kernel_table_avx512();

}  // namespace graphrun::cpu
