// Running one matrix product through the level's table, split across the
// session's threads when it is large enough to pay (ops/math only).
#pragma once

#include <graphrun/op_kernel.h>

#include <algorithm>
#include <cstdint>

#include "ops/cpu/kernels.h"

namespace graphrun::ops_internal {

// Multiply-adds per piece, at least: each piece re-packs one whole operand
// (A when columns are split, B when rows are), so a piece must do far more
// arithmetic than copying. 2^20 MACs take about 7 µs at AVX-512's speed on
// one Zen 4 core, 20 µs at the baseline's.
inline constexpr double kGemmMinMacsPerPiece = 1 << 20;
// Piece edges fall on multiples of these (whole vector registers of C).
inline constexpr int64_t kGemmColumnAlign = 16;
inline constexpr int64_t kGemmRowAlign = 8;
// Rows split when each piece gets at least this many (or the product is
// taller than wide): row pieces write disjoint contiguous blocks of C and
// read disjoint rows of A. Measured on the seed model's [64,256]x[256,256]
// layer on 2 threads (2-core Zen 4 VM): two row halves ran side by side in
// 37 us, two column halves in 44-49 us, the whole product alone in 49 us.
inline constexpr int64_t kGemmMinRowsPerPiece = 32;

// How a product of m x k x n splits: `pieces` ranges of `step` rows (when
// `split_rows`) or columns. One piece when the product is small or there is
// one thread.
struct GemmSplit {
  int64_t pieces = 1;
  int64_t step = 0;
  bool split_rows = false;
};

inline GemmSplit plan_gemm_split(int64_t m, int64_t n, int64_t k, int threads) {
  GemmSplit s;
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto by_work = static_cast<int64_t>(macs / kGemmMinMacsPerPiece);
  const int64_t wanted = std::min<int64_t>(threads, by_work);
  s.split_rows = m > n || (wanted > 1 && m / wanted >= kGemmMinRowsPerPiece);
  const int64_t extent = s.split_rows ? m : n;
  const int64_t align = s.split_rows ? kGemmRowAlign : kGemmColumnAlign;
  s.step = extent;
  if (wanted <= 1 || extent < 2 * align) return s;
  const int64_t per = (extent + wanted - 1) / wanted;
  s.step = (per + align - 1) / align * align;
  s.pieces = (extent + s.step - 1) / s.step;
  return s;
}

// C = op(A) op(B) (+ bias, activation) for all of C, through cpu::kernels().
template <typename T>
void parallel_gemm(const OpKernelContext& ctx, const cpu::GemmArgs<T>& g) {
  const cpu::GemmFn<T> gemm = cpu::kernels().typed<T>().gemm;
  const GemmSplit s = plan_gemm_split(g.m, g.n, g.k, ctx.num_threads());
  if (s.pieces <= 1) {
    gemm(g, 0, g.m, 0, g.n);
    return;
  }
  ctx.parallel_for(s.pieces, 1, [&](int64_t b, int64_t e) {
    if (s.split_rows) {
      gemm(g, b * s.step, std::min(g.m, e * s.step), 0, g.n);
    } else {
      gemm(g, 0, g.m, b * s.step, std::min(g.n, e * s.step));
    }
  });
}

// C = op(A) op(B) (+ bias, activation) for all of C with op(B) packed
// (`b`, from this level's pack_b), split as parallel_gemm would: row pieces
// read all of b's panels, column pieces whole column blocks of b (the
// product must have at least two). Rows are preferred, as for unpacked
// products: in a chain of layers each thread then reads the rows of A it
// wrote itself. Measured on the seed model's layers (2-core Zen 4 VM), row
// halves took 149-157 us per pass against 182-186 us for column halves,
// which pull half of A from the other core at every layer.
template <typename T>
void parallel_gemm_packed(const OpKernelContext& ctx, const cpu::GemmArgs<T>& g,
                          const cpu::PackedGemmB<T>& b) {
  const cpu::GemmPackedFn<T> gemm = cpu::kernels().typed<T>().gemm_packed;
  const int64_t blocks = b.blocks();
  const GemmSplit s = plan_gemm_split(g.m, g.n, g.k, ctx.num_threads());
  if (s.pieces > 1 && s.split_rows) {
    ctx.parallel_for(s.pieces, 1, [&](int64_t begin, int64_t end) {
      gemm(g, b, begin * s.step, std::min(g.m, end * s.step), 0, blocks);
    });
  } else if (s.pieces > 1 && blocks >= 2) {
    const int64_t pieces = std::min(s.pieces, blocks);
    ctx.parallel_for(pieces, 1, [&](int64_t begin, int64_t end) {
      gemm(g, b, 0, g.m, begin * blocks / pieces, end * blocks / pieces);
    });
  } else {
    gemm(g, b, 0, g.m, 0, blocks);
  }
}

}  // namespace graphrun::ops_internal
