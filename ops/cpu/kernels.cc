// The inner loops of the heavy kernels, compiled once per instruction-set
// level (cmake/GraphrunCpuIsa.cmake sets GRAPHRUN_CPU_ISA_NS to baseline,
// avx2 or avx512 and the matching -m flags). Everything here is templates
// over the element type, instantiated into one constant table per level.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"

#ifndef GRAPHRUN_CPU_ISA_NS
#error "ops/cpu/kernels.cc is compiled through graphrun_add_isa_objects (GRAPHRUN_CPU_ISA_NS)"
#endif
#define GRAPHRUN_CPU_CAT2(a, b) a##b
#define GRAPHRUN_CPU_CAT(a, b) GRAPHRUN_CPU_CAT2(a, b)

namespace graphrun::cpu {
namespace GRAPHRUN_CPU_ISA_NS {
namespace {

// The type integer arithmetic runs in so that overflow wraps: the unsigned
// twin (same bits), else T.
template <typename T>
struct Wrap {
  using type = T;
};
template <>
struct Wrap<int32_t> {
  using type = uint32_t;
};
template <>
struct Wrap<int64_t> {
  using type = uint64_t;
};

template <typename S>
using RowMatrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using InMatrix = Eigen::Map<const RowMatrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename S>
using OutMatrix = Eigen::Map<RowMatrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using InArray = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using OutArray = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

// c += bias (per column), then the activation, on one block of C while it
// is in cache.
template <typename S, typename Block>
void epilogue(const S* bias, Activation activation, Block& c, int64_t col_begin, int64_t cols) {
  if (bias != nullptr) {
    c.rowwise() += Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(bias + col_begin, cols);
  }
  if constexpr (std::is_floating_point_v<S>) {
    switch (activation) {
      case Activation::kNone: break;
      case Activation::kRelu: c = c.cwiseMax(S{0}); break;
      case Activation::kSigmoid: c = c.array().logistic().matrix(); break;
      case Activation::kTanh: c = c.array().tanh().matrix(); break;
    }
  }
}

// Each thread's packing buffers for Eigen's GEMM, kept between calls. Eigen
// otherwise allocates them per product, on the heap past 128 KiB: glibc
// maps such blocks fresh (its mmap threshold) and every product paid their
// page faults, 256x256x256 running at 140 instead of 240 GFLOP/s on one
// Zen 4 core (it ran fast only after a larger product had raised glibc's
// threshold). A thread runs one product at a time, so one pair suffices.
template <typename S>
class Scratch {
 public:
  S* get(int which, std::size_t elements) {
    Buffer& b = buffers_[which];
    if (b.capacity < elements) {
      b.data.reset(static_cast<S*>(Eigen::internal::aligned_malloc(elements * sizeof(S))));
      b.capacity = elements;
    }
    return b.data.get();
  }

 private:
  struct Free {
    void operator()(S* p) const { Eigen::internal::aligned_free(p); }
  };
  struct Buffer {
    std::unique_ptr<S, Free> data;
    std::size_t capacity = 0;
  };
  Buffer buffers_[2];
};

// Eigen's blocking for one product (rows x cols x depth in the column-major
// problem Eigen solves), with the packing buffers from this thread's
// Scratch.
template <typename S>
class ScratchBlocking : public Eigen::internal::level3_blocking<S, S> {
 public:
  ScratchBlocking(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth) {
    this->m_mc = rows;
    this->m_nc = cols;
    this->m_kc = depth;
    Eigen::internal::computeProductBlockingSizes<S, S, 1>(this->m_kc, this->m_mc, this->m_nc,
                                                          Eigen::Index{1});
    thread_local Scratch<S> scratch;
    this->m_blockA = scratch.get(0, static_cast<std::size_t>(this->m_mc * this->m_kc));
    this->m_blockB = scratch.get(1, static_cast<std::size_t>(this->m_kc * this->m_nc));
  }
};

// C[rows, cols] (row-major, ldc) = lhs [rows, depth] * rhs [depth, cols],
// each operand row- or column-major with its stride, through Eigen's GEMM
// kernel with ScratchBlocking.
template <typename S, int LhsOrder, int RhsOrder>
void blocked_gemm(Eigen::Index rows, Eigen::Index cols, Eigen::Index depth, const S* lhs,
                  Eigen::Index lhs_stride, const S* rhs, Eigen::Index rhs_stride, S* c,
                  Eigen::Index ldc) {
  for (Eigen::Index r = 0; r < rows; ++r) std::fill_n(c + r * ldc, cols, S{0});
  // A row-major result is solved as its column-major transpose: Eigen's
  // blocking then sees cols as its rows.
  ScratchBlocking<S> blocking(cols, rows, depth);
  Eigen::internal::general_matrix_matrix_product<Eigen::Index, S, LhsOrder, false, S, RhsOrder,
                                                 false, Eigen::RowMajor, 1>::run(rows, cols, depth,
                                                                                 lhs, lhs_stride,
                                                                                 rhs, rhs_stride, c,
                                                                                 1, ldc, S{1},
                                                                                 blocking);
}

template <typename T>
void gemm(const GemmArgs<T>& g, int64_t row_begin, int64_t row_end, int64_t col_begin,
          int64_t col_end) {
  using S = typename Wrap<T>::type;
  const int64_t rows = row_end - row_begin;
  const int64_t cols = col_end - col_begin;
  if (rows <= 0 || cols <= 0) return;
  const S* ap = reinterpret_cast<const S*>(g.a);
  const S* bp = reinterpret_cast<const S*>(g.b);
  S* cp = reinterpret_cast<S*>(g.c) + row_begin * g.ldc + col_begin;
  // Blocked products go through blocked_gemm; smaller ones (and
  // matrix-vector shapes) through Eigen's product expression, which picks
  // its lazy and GEMV paths for them.
  if (gemm_is_blocked(rows, cols, g.k)) {
    // op(A)'s rows [row_begin, row_end): A's rows, or its columns when
    // transposed (a column-major view). op(B)'s columns likewise.
    const S* lhs = g.transpose_a ? ap + row_begin : ap + row_begin * g.lda;
    const S* rhs = g.transpose_b ? bp + col_begin * g.ldb : bp + col_begin;
    constexpr int kRow = Eigen::RowMajor;
    constexpr int kCol = Eigen::ColMajor;
    if (!g.transpose_a && !g.transpose_b) {
      blocked_gemm<S, kRow, kRow>(rows, cols, g.k, lhs, g.lda, rhs, g.ldb, cp, g.ldc);
    } else if (g.transpose_a && !g.transpose_b) {
      blocked_gemm<S, kCol, kRow>(rows, cols, g.k, lhs, g.lda, rhs, g.ldb, cp, g.ldc);
    } else if (!g.transpose_a && g.transpose_b) {
      blocked_gemm<S, kRow, kCol>(rows, cols, g.k, lhs, g.lda, rhs, g.ldb, cp, g.ldc);
    } else {
      blocked_gemm<S, kCol, kCol>(rows, cols, g.k, lhs, g.lda, rhs, g.ldb, cp, g.ldc);
    }
    if (g.bias != nullptr || g.activation != Activation::kNone) {
      OutMatrix<S> c(cp, rows, cols, Eigen::OuterStride<>(g.ldc));
      epilogue(reinterpret_cast<const S*>(g.bias), g.activation, c, col_begin, cols);
    }
    return;
  }
  const InMatrix<S> a(reinterpret_cast<const S*>(g.a), g.transpose_a ? g.k : g.m,
                      g.transpose_a ? g.m : g.k, Eigen::OuterStride<>(g.lda));
  const InMatrix<S> b(reinterpret_cast<const S*>(g.b), g.transpose_b ? g.n : g.k,
                      g.transpose_b ? g.k : g.n, Eigen::OuterStride<>(g.ldb));
  OutMatrix<S> c(reinterpret_cast<S*>(g.c) + row_begin * g.ldc + col_begin, rows, cols,
                 Eigen::OuterStride<>(g.ldc));
  if (!g.transpose_a && !g.transpose_b) {
    c.noalias() = a.middleRows(row_begin, rows) * b.middleCols(col_begin, cols);
  } else if (g.transpose_a && !g.transpose_b) {
    c.noalias() = a.middleCols(row_begin, rows).transpose() * b.middleCols(col_begin, cols);
  } else if (!g.transpose_a && g.transpose_b) {
    c.noalias() = a.middleRows(row_begin, rows) * b.middleRows(col_begin, cols).transpose();
  } else {
    c.noalias() =
        a.middleCols(row_begin, rows).transpose() * b.middleRows(col_begin, cols).transpose();
  }
  if (g.bias != nullptr || g.activation != Activation::kNone) {
    epilogue(reinterpret_cast<const S*>(g.bias), g.activation, c, col_begin, cols);
  }
}

// ---- Products with a packed B ----
//
// The row-major product C = op(A) op(B) is Eigen's column-major C^T =
// op(B)^T op(A)^T: op(B)^T is Eigen's left-hand side, which its kernel
// packs in panels of (column block of C) x (depth panel). pack_b does that
// once; gemm_packed then packs only op(A)^T, the right-hand side, per call,
// and runs Eigen's GEBP kernel over the kept panels, in the loop order of
// Eigen's own sequential GEMM.

template <typename S>
using Traits = Eigen::internal::gebp_traits<S, S>;
template <typename S, int Order>
using ConstMapper = Eigen::internal::const_blas_data_mapper<S, Eigen::Index, Order>;
template <typename S>
using ResultMapper =
    Eigen::internal::blas_data_mapper<S, Eigen::Index, Eigen::ColMajor, Eigen::Unaligned, 1>;

// Panels start on 64-byte boundaries (the packing stores whole vectors).
constexpr int64_t kPanelAlignBytes = 64;

template <typename S, int Order>
void pack_panels(PackedGemmB<S>& p, const S* b, int64_t ldb) {
  using Mapper = ConstMapper<S, Order>;
  Eigen::internal::gemm_pack_lhs<S, Eigen::Index, Mapper, Traits<S>::mr, Traits<S>::LhsProgress,
                                 typename Traits<S>::LhsPacket4Packing, Order>
      pack;
  const Mapper lhs(b, ldb);
  const int64_t align = kPanelAlignBytes / static_cast<int64_t>(sizeof(S));
  int64_t total = 0;
  for (int64_t i2 = 0; i2 < p.n; i2 += p.block) {
    for (int64_t k2 = 0; k2 < p.k; k2 += p.depth_block) {
      p.offsets.push_back(total);
      const int64_t size =
          (std::min(i2 + p.block, p.n) - i2) * (std::min(k2 + p.depth_block, p.k) - k2);
      total += (size + align - 1) / align * align;
    }
  }
  p.data.reset(static_cast<S*>(
      ::operator new[](static_cast<std::size_t>(total) * sizeof(S), std::align_val_t{64})));
  std::size_t panel = 0;
  for (int64_t i2 = 0; i2 < p.n; i2 += p.block) {
    for (int64_t k2 = 0; k2 < p.k; k2 += p.depth_block) {
      pack(p.data.get() + p.offsets[panel++], lhs.getSubMapper(i2, k2),
           std::min(k2 + p.depth_block, p.k) - k2, std::min(i2 + p.block, p.n) - i2);
    }
  }
}

template <typename T>
std::unique_ptr<PackedGemmB<T>> pack_b(const T* b, int64_t ldb, bool transpose_b, int64_t k,
                                       int64_t n, int64_t m_hint, int64_t max_block) {
  auto p = std::make_unique<PackedGemmB<T>>();
  p->isa = GRAPHRUN_CPU_ISA_LEVEL;
  p->k = k;
  p->n = n;
  Eigen::Index kc = k;
  Eigen::Index mc = n;
  Eigen::Index nc = std::max<int64_t>(m_hint, 1);
  Eigen::internal::computeProductBlockingSizes<T, T, 1>(kc, mc, nc, Eigen::Index{1});
  if (max_block > 0) mc = std::min<Eigen::Index>(mc, max_block);
  p->block = std::max<int64_t>(mc, 1);
  p->depth_block = std::max<int64_t>(kc, 1);
  // op(B)^T is [n, k]: column-major over B's rows, or row-major when B is
  // stored transposed ([n, k] itself).
  if (transpose_b) {
    pack_panels<T, Eigen::RowMajor>(*p, b, ldb);
  } else {
    pack_panels<T, Eigen::ColMajor>(*p, b, ldb);
  }
  return p;
}

template <typename S, int AOrder>
void gemm_packed_rows(const GemmArgs<S>& g, const PackedGemmB<S>& p, int64_t row_begin,
                      int64_t row_end, int64_t block_begin, int64_t block_end) {
  using Mapper = ConstMapper<S, AOrder>;
  const int64_t rows = row_end - row_begin;
  const int64_t col_begin = block_begin * p.block;
  const int64_t col_end = std::min(p.n, block_end * p.block);
  S* const c = g.c + row_begin * g.ldc;
  for (int64_t r = 0; r < rows; ++r)
    std::fill(c + r * g.ldc + col_begin, c + r * g.ldc + col_end, S{0});
  // op(A)^T's columns [row_begin, row_end): A's rows, or its columns when
  // stored transposed.
  const Mapper rhs(g.transpose_a ? g.a + row_begin : g.a + row_begin * g.lda, g.lda);
  const ResultMapper<S> res(c, g.ldc);
  Eigen::internal::gemm_pack_rhs<S, Eigen::Index, Mapper, Traits<S>::nr, AOrder> pack_rhs;
  Eigen::internal::gebp_kernel<S, S, Eigen::Index, ResultMapper<S>, Traits<S>::mr, Traits<S>::nr,
                               false, false>
      gebp;
  // Rows of C per packed slice of A: Eigen's nc for the whole product
  // (all of these rows for the products this is for, so that A is packed
  // once per depth panel and each panel of B is read once per slice).
  Eigen::Index kc = p.k;
  Eigen::Index mc = p.n;
  Eigen::Index nc = rows;
  Eigen::internal::computeProductBlockingSizes<S, S, 1>(kc, mc, nc, Eigen::Index{1});
  nc = std::max<Eigen::Index>(nc, 1);
  thread_local Scratch<S> scratch;
  S* const slice =
      scratch.get(1, static_cast<std::size_t>(p.depth_block * std::min<int64_t>(nc, rows)));
  const int64_t depth_panels = (p.k + p.depth_block - 1) / p.depth_block;
  for (int64_t j2 = 0; j2 < rows; j2 += nc) {
    const int64_t actual_nc = std::min<int64_t>(j2 + nc, rows) - j2;
    for (int64_t k2 = 0, kp = 0; k2 < p.k; k2 += p.depth_block, ++kp) {
      const int64_t actual_kc = std::min(k2 + p.depth_block, p.k) - k2;
      pack_rhs(slice, rhs.getSubMapper(k2, j2), actual_kc, actual_nc);
      for (int64_t bi = block_begin; bi < block_end; ++bi) {
        const int64_t i2 = bi * p.block;
        const int64_t actual_mc = std::min(i2 + p.block, p.n) - i2;
        const S* panel = p.data.get() + p.offsets[static_cast<std::size_t>(bi * depth_panels + kp)];
        gebp(res.getSubMapper(i2, j2), panel, slice, actual_mc, actual_kc, actual_nc, S{1});
      }
    }
  }
  if (g.bias != nullptr || g.activation != Activation::kNone) {
    OutMatrix<S> block(c + col_begin, rows, col_end - col_begin, Eigen::OuterStride<>(g.ldc));
    epilogue(g.bias, g.activation, block, col_begin, col_end - col_begin);
  }
}

template <typename T>
void gemm_packed(const GemmArgs<T>& g, const PackedGemmB<T>& b, int64_t row_begin, int64_t row_end,
                 int64_t block_begin, int64_t block_end) {
  block_end = std::min(block_end, b.blocks());
  if (row_end <= row_begin || block_end <= block_begin) return;
  if (g.transpose_a) {
    gemm_packed_rows<T, Eigen::RowMajor>(g, b, row_begin, row_end, block_begin, block_end);
  } else {
    gemm_packed_rows<T, Eigen::ColMajor>(g, b, row_begin, row_end, block_begin, block_end);
  }
}

template <typename T>
void unary(UnaryOp op, const T* x, T* y, int64_t n) {
  if constexpr (std::is_floating_point_v<T>) {
    const InArray<T> in(x, n);
    OutArray<T> out(y, n);
    switch (op) {
      case UnaryOp::kNeg: out = -in; return;
      case UnaryOp::kSquare: out = in.square(); return;
      case UnaryOp::kRelu: out = in.cwiseMax(T{0}); return;
      case UnaryOp::kSqrt:
        // std::sqrt is correctly rounded (and vectorises: no errno here);
        // Eigen's fast float path (rsqrt plus a Newton step) is off by an
        // ulp even for perfect squares.
        for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
        return;
      case UnaryOp::kExp: out = in.exp(); return;
      case UnaryOp::kLog:
        out = in.log();
        // Eigen's vector log raises subnormal inputs to the smallest normal
        // number (its scalar tail does not): those lanes get std::log.
        for (int64_t i = 0; i < n; ++i) {
          if (x[i] > T{0} && x[i] < std::numeric_limits<T>::min()) y[i] = std::log(x[i]);
        }
        return;
      case UnaryOp::kTanh: out = in.tanh(); return;
      case UnaryOp::kSigmoid: out = in.logistic(); return;  // stable for large |x|
    }
  } else {
    using U = typename Wrap<T>::type;
    switch (op) {
      case UnaryOp::kNeg:
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(U{0} - static_cast<U>(x[i]));
        return;
      case UnaryOp::kSquare:
        for (int64_t i = 0; i < n; ++i) {
          y[i] = static_cast<T>(static_cast<U>(x[i]) * static_cast<U>(x[i]));
        }
        return;
      case UnaryOp::kRelu:
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T{0} ? x[i] : T{0};
        return;
      default: {
        // The float-only functions (the ops refuse integers): through
        // double, truncated, 0 where the result is not a finite integer.
        std::vector<double> d(x, x + n);
        unary<double>(op, d.data(), d.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const bool fits = std::isfinite(d[i]) &&
                            std::abs(d[i]) < static_cast<double>(std::numeric_limits<T>::max());
          y[i] = fits ? static_cast<T>(d[i]) : T{0};
        }
        return;
      }
    }
  }
}

template <typename T, typename F>
void elementwise(Operands form, const T* x, const T* y, T* z, int64_t n, F f) {
  switch (form) {
    case Operands::kBothVectors:
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
      return;
    case Operands::kScalarX: {
      const T xs = *x;
      for (int64_t i = 0; i < n; ++i) z[i] = f(xs, y[i]);
      return;
    }
    case Operands::kScalarY: {
      const T ys = *y;
      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], ys);
      return;
    }
  }
}

template <typename T>
void binary(BinaryOp op, Operands form, const T* x, const T* y, T* z, int64_t n) {
  using U = typename Wrap<T>::type;
  switch (op) {
    case BinaryOp::kAdd:
      elementwise(form, x, y, z, n,
                  [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
      return;
    case BinaryOp::kSub:
      elementwise(form, x, y, z, n,
                  [](T a, T b) { return static_cast<T>(static_cast<U>(a) - static_cast<U>(b)); });
      return;
    case BinaryOp::kMul:
      elementwise(form, x, y, z, n,
                  [](T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); });
      return;
    case BinaryOp::kDiv:
      if constexpr (std::is_integral_v<T>) {
        elementwise(form, x, y, z, n, [](T a, T b) {
          return b == T{-1} ? static_cast<T>(U{0} - static_cast<U>(a)) : static_cast<T>(a / b);
        });
      } else {
        elementwise(form, x, y, z, n, [](T a, T b) { return a / b; });
      }
      return;
  }
}

template <typename T>
T max_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    return (std::isnan(b) || b > a) ? b : a;
  } else {
    return b > a ? b : a;
  }
}

template <typename T>
T reduce(ReduceOp op, const T* x, int64_t n) {
  const InArray<T> in(x, n);
  if (op == ReduceOp::kMax) {
    if constexpr (std::is_floating_point_v<T>) {
      return in.template maxCoeff<Eigen::PropagateNaN>();
    } else {
      return in.maxCoeff();
    }
  }
  if constexpr (std::is_integral_v<T>) {
    using U = typename Wrap<T>::type;
    U acc = 0;  // wraps on overflow
    for (int64_t i = 0; i < n; ++i) acc += static_cast<U>(x[i]);
    return static_cast<T>(acc);
  } else {
    return in.sum();
  }
}

template <typename T>
void accumulate(ReduceOp op, const T* row, T* acc, int64_t n) {
  if (op == ReduceOp::kMax) {
    for (int64_t j = 0; j < n; ++j) acc[j] = max_of(acc[j], row[j]);
    return;
  }
  using U = typename Wrap<T>::type;
  for (int64_t j = 0; j < n; ++j) {
    acc[j] = static_cast<T>(static_cast<U>(acc[j]) + static_cast<U>(row[j]));
  }
}

double sum_to_double(const float* x, int64_t n) {
  // Eigen converts a packet of floats to doubles at a time and keeps
  // several partial sums.
  return InArray<float>(x, n).template cast<double>().sum();
}

void accumulate_to_double(const float* row, double* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(row[j]);
}

template <typename T>
constexpr TypedKernels<T> typed_kernels() {
  if constexpr (std::is_same_v<T, float>) {
    return TypedKernels<T>{&gemm<T>,        &unary<T>,      &binary<T>,
                           &reduce<T>,      &accumulate<T>, &pack_b<T>,
                           &gemm_packed<T>, &sum_to_double, &accumulate_to_double};
  } else if constexpr (std::is_floating_point_v<T>) {
    return TypedKernels<T>{&gemm<T>,       &unary<T>,  &binary<T>,     &reduce<T>,
                           &accumulate<T>, &pack_b<T>, &gemm_packed<T>};
  } else {
    return TypedKernels<T>{&gemm<T>, &unary<T>, &binary<T>, &reduce<T>, &accumulate<T>};
  }
}

constexpr KernelTable kTable{GRAPHRUN_CPU_ISA_LEVEL, typed_kernels<float>(),
                             typed_kernels<double>(), typed_kernels<int32_t>(),
                             typed_kernels<int64_t>()};

}  // namespace
}  // namespace GRAPHRUN_CPU_ISA_NS

const KernelTable& GRAPHRUN_CPU_CAT(kernel_table_, GRAPHRUN_CPU_ISA_NS)() {
  return GRAPHRUN_CPU_ISA_NS::kTable;
}

}  // namespace graphrun::cpu
