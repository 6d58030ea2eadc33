// Per-target GEMM (packed, blocked SIMD micro-kernel) and MatMul kernel; re-included per target.
#if defined(KILN_CPU_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_GEMM_INL_H_
#undef KILN_CPU_GEMM_INL_H_
#else
#define KILN_CPU_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/float_runs-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Micro-tile: kGemmMR rows x kGemmNV vectors of accumulators. Sized to the register file:
// AVX-512 has 32 registers (24 accumulators + 3 B vectors + 1 broadcast), the others 16.
#if HWY_TARGET == HWY_SCALAR
inline constexpr std::size_t kGemmMR = 4;
inline constexpr std::size_t kGemmNVWanted = 2;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kGemmMR = 8;
inline constexpr std::size_t kGemmNVWanted = 3;
#else
inline constexpr std::size_t kGemmMR = 6;
inline constexpr std::size_t kGemmNVWanted = 2;
#endif

using GemmTag = hn::ScalableTag<float>;
inline constexpr std::size_t kGemmMaxLanes = hn::MaxLanes(GemmTag());
// Wide scalable vectors get fewer of them so a tile never exceeds the workspace's slack.
inline constexpr std::size_t kGemmNV =
    std::max<std::size_t>(1, std::min(kGemmNVWanted, gemm_blocking::max_nr / kGemmMaxLanes));
static_assert(kGemmMR <= gemm_blocking::max_mr, "workspace sizing assumes a smaller tile");

/// Columns of a micro-tile (and of a packed B sliver) on this target.
HWY_INLINE std::size_t GemmNR() { return kGemmNV * hn::Lanes(GemmTag()); }

/// A strided matrix operand: element (i, j) is p[i * rs + j * cs]. A transpose is a swap of the
/// strides, so the packing routines read op(A) and op(B) in whatever order they are stored.
struct MatRef {
  const float* p = nullptr;
  std::size_t rs = 0;
  std::size_t cs = 1;
};

/// The B operand of Gemm: either a strided matrix that Gemm packs itself, or one the caller
/// already packed (convolution builds its column matrix directly in this form): NR-wide
/// slivers of the full depth, element (k, j) at packed[((j / NR) * depth + k) * NR + j % NR],
/// zero beyond column N.
struct GemmB {
  MatRef ref{};
  const float* packed = nullptr;
  std::size_t depth = 0;
};

/// Sets a micro-tile's R x C accumulator vectors to zero.
template <std::size_t R, std::size_t C, class V> HWY_INLINE void ZeroAccumulators(V (&acc)[R][C]) {
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < R; ++r) {
    HWY_UNROLL(16)
    for (std::size_t c = 0; c < C; ++c) acc[r][c] = hn::Zero(hn::DFromV<V>());
  }
}

/// Calls row_fn(r) for the first m of a tile's R rows of accumulators, in a loop of known
/// length that stops at m: a loop to m would index the accumulators at run time, and GCC would
/// then keep them all on the stack, storing and reloading each at the end of every tile.
template <std::size_t R, class F> HWY_INLINE void ForFirstRows(std::size_t m, const F& row_fn) {
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < R; ++r) {
    if (r >= m) return;
    row_fn(r);
  }
}

/// One step of a micro-tile's depth loop: acc[r][v] += a(r) * (vector v at b), the outer
/// product of one column of A with one row of B.
template <std::size_t MR, std::size_t NV, class V, class ColumnOfA>
HWY_INLINE void MultiplyAddOuter(V (&acc)[MR][NV], const ColumnOfA& a,
                                 const float* HWY_RESTRICT b) {
  const hn::DFromV<V> d;
  V bv[NV];
  HWY_UNROLL(4)
  for (std::size_t v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, b + v * hn::Lanes(d));
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) {
    const V av = hn::Set(d, a(r));
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
  }
}

/// MultiplyAddOuter with A's column at rows[r][ak].
template <std::size_t MR, std::size_t NV, class V>
HWY_INLINE void MultiplyAddRank1(V (&acc)[MR][NV], const float* const (&rows)[MR], std::size_t ak,
                                 const float* HWY_RESTRICT b) {
  MultiplyAddOuter(
      acc, [&](std::size_t r) { return rows[r][ak]; }, b);
}

/// MultiplyAddOuter with A's column as MR consecutive floats at `a`.
template <std::size_t MR, std::size_t NV, class V>
HWY_INLINE void MultiplyAddRank1(V (&acc)[MR][NV], const float* HWY_RESTRICT a,
                                 const float* HWY_RESTRICT b) {
  MultiplyAddOuter(
      acc, [a](std::size_t r) { return a[r]; }, b);
}

/// c[0:m, 0:n] (+)= A_sliver · B_sliver over depth kc; B holds NR values per k. A is either
/// packed (MR values per k) or, when kDirectA, read in place from m rows of stride lda, each
/// contiguous in k; rows past m repeat the last one, so edge tiles never read outside A. Full
/// tiles go straight to C; edge tiles go through a stack buffer so that the padding columns
/// never reach memory outside C.
template <std::size_t MR, std::size_t NV, bool kDirectA>
HWY_INLINE void MicroKernel(std::size_t kc, const float* HWY_RESTRICT a, std::size_t lda,
                            const float* HWY_RESTRICT b, float* HWY_RESTRICT c, std::size_t ldc,
                            std::size_t m, std::size_t n, bool accumulate) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  const std::size_t nr = NV * lanes;
  const float* rows[MR];
  HWY_UNROLL(8)
  for (std::size_t r = 0; r < MR; ++r) rows[r] = a + (kDirectA ? std::min(r, m - 1) * lda : r);
  const std::size_t a_step = kDirectA ? 1 : MR;
  V acc[MR][NV];
  ZeroAccumulators(acc);
  for (std::size_t k = 0, ak = 0; k < kc; ++k, ak += a_step) {
    MultiplyAddRank1(acc, rows, ak, b);
    b += nr;
  }
  if (m == MR && n == nr) {
    HWY_UNROLL(8)
    for (std::size_t r = 0; r < MR; ++r) {
      HWY_UNROLL(4)
      for (std::size_t v = 0; v < NV; ++v) {
        float* p = c + r * ldc + v * lanes;
        const V sum = accumulate ? hn::Add(acc[r][v], hn::LoadU(d, p)) : acc[r][v];
        hn::StoreU(sum, d, p);
      }
    }
    return;
  }
  alignas(64) float tile[MR * NV * kGemmMaxLanes];
  for (std::size_t r = 0; r < MR; ++r) {
    for (std::size_t v = 0; v < NV; ++v) hn::Store(acc[r][v], d, tile + r * nr + v * lanes);
  }
  for (std::size_t r = 0; r < m; ++r) {
    float* row = c + r * ldc;
    const float* t = tile + r * nr;
    if (accumulate) {
      for (std::size_t j = 0; j < n; ++j) row[j] += t[j];
    } else {
      for (std::size_t j = 0; j < n; ++j) row[j] = t[j];
    }
  }
}

/// Packs rows [i0, i0 + mc) x depth [k0, k0 + kc) of op(A) into MR-row slivers (k-major, MR
/// values per k), zero-padding the last sliver's missing rows. Only used when op(A) is not
/// contiguous in k (a transposed A); otherwise the micro-kernel reads A in place.
inline void PackA(const MatRef& a, std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc,
                  float* HWY_RESTRICT dst) {
  constexpr std::size_t mr = kGemmMR;
  for (std::size_t s = 0; s < mc; s += mr, dst += kc * mr) {
    const std::size_t rows = std::min(mr, mc - s);
    for (std::size_t k = 0; k < kc; ++k) {
      const float* src = a.p + (i0 + s) * a.rs + (k0 + k) * a.cs;
      float* out = dst + k * mr;
      for (std::size_t r = 0; r < rows; ++r) out[r] = src[r * a.rs];
      for (std::size_t r = rows; r < mr; ++r) out[r] = 0.0f;
    }
  }
}

/// Packs `cols` columns of B that are each contiguous in k (column j starts at src + j * cs)
/// into the rows of a packed sliver (row k at dst + k * nr), transposing 4 x 4 blocks in
/// 128-bit registers where the target has them. Each column holds `depth` >= kc floats from
/// src on; the ones past kc are the next panel's, prefetched while this one is packed.
inline void PackColumnsOfB(const float* HWY_RESTRICT src, std::size_t cs, std::size_t kc,
                           [[maybe_unused]] std::size_t depth, std::size_t cols,
                           float* HWY_RESTRICT dst, std::size_t nr) {
  std::size_t k = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d4;
  // 16 k = one cache line of each column, used up before moving to the next line.
  for (; k + 16 <= kc; k += 16) {
    std::size_t j = 0;
    for (; j + 4 <= cols; j += 4) {
      // Many columns are read side by side, more streams than the hardware prefetcher follows.
      if (k + 64 < depth) {
        for (std::size_t q = 0; q < 4; ++q) hwy::Prefetch(src + (j + q) * cs + k + 64);
      }
      for (std::size_t kk = k; kk < k + 16; kk += 4) {
        const float* col = src + j * cs + kk;
        const auto c0 = hn::LoadU(d4, col), c1 = hn::LoadU(d4, col + cs);
        const auto c2 = hn::LoadU(d4, col + 2 * cs), c3 = hn::LoadU(d4, col + 3 * cs);
        const auto lo01 = hn::InterleaveLower(d4, c0, c1), lo23 = hn::InterleaveLower(d4, c2, c3);
        const auto hi01 = hn::InterleaveUpper(d4, c0, c1), hi23 = hn::InterleaveUpper(d4, c2, c3);
        float* out = dst + kk * nr + j;
        hn::StoreU(hn::ConcatLowerLower(d4, lo23, lo01), d4, out);
        hn::StoreU(hn::ConcatUpperUpper(d4, lo23, lo01), d4, out + nr);
        hn::StoreU(hn::ConcatLowerLower(d4, hi23, hi01), d4, out + 2 * nr);
        hn::StoreU(hn::ConcatUpperUpper(d4, hi23, hi01), d4, out + 3 * nr);
      }
    }
    for (; j < cols; ++j) {
      for (std::size_t i = k; i < k + 16; ++i) dst[i * nr + j] = src[j * cs + i];
    }
  }
#endif
  for (; k < kc; ++k) {
    for (std::size_t j = 0; j < cols; ++j) dst[k * nr + j] = src[j * cs + k];
  }
}

/// Packs depth [k0, k0 + kc) x columns [j0, j0 + nc) of op(B), `depth` deep, into NR-column
/// slivers (NR values per k), zero-padding the last sliver's missing columns.
inline void PackB(const MatRef& b, std::size_t depth, std::size_t k0, std::size_t kc,
                  std::size_t j0, std::size_t nc, float* HWY_RESTRICT dst) {
  const GemmTag d;
  const std::size_t lanes = hn::Lanes(d);
  const std::size_t nr = GemmNR();
  for (std::size_t s = 0; s < nc; s += nr, dst += kc * nr) {
    const std::size_t cols = std::min(nr, nc - s);
    if (b.cs == 1) {
      for (std::size_t k = 0; k < kc; ++k) {
        const float* src = b.p + (k0 + k) * b.rs + j0 + s;
        float* out = dst + k * nr;
        if (cols == nr) {
          for (std::size_t v = 0; v < nr; v += lanes) hn::StoreU(hn::LoadU(d, src + v), d, out + v);
        } else {
          for (std::size_t j = 0; j < cols; ++j) out[j] = src[j];
        }
      }
    } else if (b.rs == 1) {
      PackColumnsOfB(b.p + k0 + (j0 + s) * b.cs, b.cs, kc, depth - k0, cols, dst, nr);
    } else {
      for (std::size_t k = 0; k < kc; ++k) {
        for (std::size_t j = 0; j < cols; ++j)
          dst[k * nr + j] = b.p[(k0 + k) * b.rs + (j0 + s + j) * b.cs];
      }
    }
    if (cols < nr) {
      for (std::size_t k = 0; k < kc; ++k) std::fill(dst + k * nr + cols, dst + (k + 1) * nr, 0.0f);
    }
  }
}

/// Whether a GEMM has no products to add (m, n or k is 0); its result, zeros where it does
/// not accumulate, is then already in C.
inline bool EmptyGemm(std::size_t m, std::size_t n, std::size_t k, float* HWY_RESTRICT c,
                      std::size_t ldc, bool accumulate) {
  if (m != 0 && n != 0 && k != 0) return false;
  if (!accumulate) {
    for (std::size_t i = 0; i < m && n != 0; ++i) std::fill_n(c + i * ldc, n, 0.0f);
  }
  return true;
}

/// Single-threaded C[0:m, 0:n] = op(A) · op(B) (+ C when `accumulate`), C row-major with row
/// stride ldc. Scratch, 64-byte aligned: pack_a, gemm_packed_a_floats(m, k) floats, only when
/// op(A) is not contiguous in k (a.cs != 1), and pack_b, gemm_packed_b_floats(n, k) floats,
/// only when B is not pre-packed; either may be null when unused. Never allocates.
inline void Gemm(std::size_t m, std::size_t n, std::size_t k, const MatRef& a, const GemmB& b,
                 float* HWY_RESTRICT c, std::size_t ldc, bool accumulate,
                 float* HWY_RESTRICT pack_a, float* HWY_RESTRICT pack_b) {
  if (EmptyGemm(m, n, k, c, ldc, accumulate)) return;
  constexpr std::size_t mr = kGemmMR;
  const std::size_t nr = GemmNR();
  // Rows contiguous in k are read in place; anything else is packed mc rows at a time.
  const bool direct_a = a.cs == 1;
  const std::size_t mc_block = direct_a ? m : std::max(mr, gemm_blocking::mc / mr * mr);
  const std::size_t nc_block = std::max(nr, gemm_blocking::nc / nr * nr);
  for (std::size_t pc = 0; pc < k; pc += gemm_blocking::kc) {
    const std::size_t kc = std::min(gemm_blocking::kc, k - pc);
    // Later depth blocks add onto the partial sums of the earlier ones.
    const bool acc = accumulate || pc > 0;
    for (std::size_t ic = 0; ic < m; ic += mc_block) {
      const std::size_t mc = std::min(mc_block, m - ic);
      if (!direct_a) PackA(a, ic, mc, pc, kc, pack_a);
      for (std::size_t jc = 0; jc < n; jc += nc_block) {
        const std::size_t nc = std::min(nc_block, n - jc);
        const float* panel = nullptr;
        std::size_t sliver_stride = 0;
        if (b.packed != nullptr) {
          panel = b.packed + ((jc / nr) * b.depth + pc) * nr;
          sliver_stride = b.depth * nr;
        } else {
          PackB(b.ref, k, pc, kc, jc, nc, pack_b);
          panel = pack_b;
          sliver_stride = kc * nr;
        }
        // The A sliver (MR x kc) stays in L1 while the B panel streams from L2.
        for (std::size_t ir = 0; ir < mc; ir += mr) {
          float* c_row = c + (ic + ir) * ldc + jc;
          const std::size_t rows = std::min(mr, mc - ir);
          for (std::size_t jr = 0; jr < nc; jr += nr) {
            const float* b_sliver = panel + (jr / nr) * sliver_stride;
            const std::size_t cols = std::min(nr, nc - jr);
            if (direct_a) {
              MicroKernel<kGemmMR, kGemmNV, true>(kc, a.p + (ic + ir) * a.rs + pc, a.rs, b_sliver,
                                                  c_row + jr, ldc, rows, cols, acc);
            } else {
              MicroKernel<kGemmMR, kGemmNV, false>(kc, pack_a + (ir / mr) * kc * mr, 0, b_sliver,
                                                   c_row + jr, ldc, rows, cols, acc);
            }
          }
        }
      }
    }
  }
}

/// Largest MatMul output (in floats, 256 KiB) whose epilogue runs after all tiles.
inline constexpr std::size_t kEpilogueAfterFloats = std::size_t{1} << 16;

/// MatMulTiles for a small output over a long depth: the depth cut into one run per worker
/// slot, each run's products summed by one GEMM into that slot's partial result (whichever
/// thread runs it), the partials then added in slot order and the epilogue run over each block
/// of the sum. The result depends on the thread count only, as the weight gradients' do.
template <class TileGemm>
void MatMulDepthRuns(const KernelArgs& args, const MatMulLayout& layout, const MatRef& a,
                     const MatRef& b, std::size_t runs, const EpilogueRunner& epilogue,
                     const TileGemm& gemm) {
  const MatMulDims dims = matmul_dims(args);
  const std::size_t m = dims.m, n = dims.n, k = dims.k;
  const auto partial = [&](std::size_t run) {
    return reinterpret_cast<float*>(args.workspace) +
           run * (args.workspace_per_worker / sizeof(float)) + layout.partial;
  };
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, runs, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t run = r.begin(); run < r.end(); ++run) {
          const std::size_t k0 = k * run / runs, k1 = k * (run + 1) / runs;
          gemm(m, n, k1 - k0, MatRef{a.p + k0 * a.cs, a.rs, a.cs},
               MatRef{b.p + k0 * b.rs, b.rs, b.cs}, partial(run), n, ThreadScratch(args));
        }
      },
      tbb::simple_partitioner());
  float* c = args.out.f32();
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, m * n, 4096),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      const std::size_t count = r.end() - r.begin();
                      CopyFloats(c + r.begin(), partial(0) + r.begin(), count);
                      for (std::size_t run = 1; run < runs; ++run)
                        AddFloats(c + r.begin(), partial(run) + r.begin(), count);
                      if (epilogue.active())
                        epilogue(r.begin(), r.end(), ThreadScratch(args) + layout.total);
                    });
}

/// Op::MatMul's work over any GEMM: splits C into tiles, one
/// gemm(rows, cols, depth, a_tile, b_tile, c_tile, ldc, scratch) per tile on the running
/// thread's workspace slice; tiles are square-ish because each one packs its own columns of B
/// (and rows of A, where the GEMM packs them). The epilogue, if any, runs over each tile right
/// after its GEMM, or over the whole output after the last tile when it fits in L2. A small
/// output over a long depth (matmul_splits_depth) is instead summed in runs of depths.
template <class TileGemm>
void MatMulTiles(const KernelArgs& args, const MatMulLayout& layout, const TileGemm& gemm) {
  const MatMulDims dims = matmul_dims(args);
  const std::size_t m = dims.m, n = dims.n, k = dims.k;
  if (m == 0 || n == 0) return;
  const MatRef a =
      dims.transpose_a ? MatRef{args.in[0].f32(), 1, m} : MatRef{args.in[0].f32(), k, 1};
  const MatRef b =
      dims.transpose_b ? MatRef{args.in[1].f32(), 1, k} : MatRef{args.in[1].f32(), n, 1};
  float* c = args.out.f32();
  const EpilogueRunner epilogue(args);

  constexpr std::size_t mr = kGemmMR;
  const std::size_t nr = GemmNR();
  const auto tile_of = [](std::size_t len, std::size_t parts, std::size_t unit) {
    const std::size_t t = (len + parts - 1) / parts;
    return (t + unit - 1) / unit * unit;
  };
  const auto threads = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  // A few tiles per thread let work stealing even out the ragged edge tiles; a product of a
  // few microseconds is not worth waking other threads for.
  const bool tiny = m * n * k < (std::size_t{1} << 19);
  if (threads > 1 && !tiny && matmul_splits_depth(dims)) {
    MatMulDepthRuns(args, layout, a, b, threads, epilogue, gemm);
    return;
  }
  const std::size_t wanted = threads <= 1 || tiny ? 1 : 4 * threads;
  std::size_t gm = 1, gn = 1;
  while (gm * gn < wanted) {
    const std::size_t tm = tile_of(m, gm, mr), tn = tile_of(n, gn, nr);
    const bool split_m = tm >= 4 * mr, split_n = tn >= 2 * nr;
    if (split_m && (!split_n || tm >= tn)) {
      gm *= 2;
    } else if (split_n) {
      gn *= 2;
    } else {
      break;
    }
  }
  const std::size_t tm = tile_of(m, gm, mr), tn = tile_of(n, gn, nr);
  const std::size_t tiles_m = (m + tm - 1) / tm, tiles_n = (n + tn - 1) / tn;
  // An output that fits in L2 is still there when every tile is done; the epilogue then runs
  // over long contiguous ranges, not one short call per row of each tile (a layer's weight
  // gradient with the SGD update: 120 x 400 took 3x the unfused time in per-row calls).
  const bool epilogue_after = epilogue.active() && tiles_n > 1 && m * n <= kEpilogueAfterFloats;
  tbb::parallel_for(std::size_t{0}, tiles_m * tiles_n, [&](std::size_t t) {
    const std::size_t i0 = t / tiles_n * tm, j0 = t % tiles_n * tn;
    float* scratch = ThreadScratch(args);
    const MatRef a_tile{a.p + i0 * a.rs, a.rs, a.cs};
    const MatRef b_tile{b.p + j0 * b.cs, b.rs, b.cs};
    const std::size_t rows = std::min(tm, m - i0), cols = std::min(tn, n - j0);
    gemm(rows, cols, k, a_tile, b_tile, c + i0 * n + j0, n, scratch);
    if (!epilogue.active() || epilogue_after) return;
    if (cols == n) { // whole rows: one contiguous range
      epilogue(i0 * n, (i0 + rows) * n, scratch + layout.total);
      return;
    }
    for (std::size_t i = i0; i < i0 + rows; ++i)
      epilogue(i * n + j0, i * n + j0 + cols, scratch + layout.total);
  });
  if (epilogue_after) {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, m * n, 16384),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        epilogue(r.begin(), r.end(), ThreadScratch(args) + layout.total);
                      });
  }
}

/// Op::MatMul: out[M,N] = op(A) · op(B), MatMulTiles over the FP32 Gemm.
inline void MatMulKernel(const KernelArgs& args) {
  const MatMulDims dims = matmul_dims(args);
  const MatMulLayout layout = matmul_layout(dims);
  MatMulTiles(args, layout,
              [&](std::size_t m, std::size_t n, std::size_t k, const MatRef& a, const MatRef& b,
                  float* c, std::size_t ldc, float* scratch) {
                Gemm(m, n, k, a, GemmB{b}, c, ldc, false,
                     dims.transpose_a ? scratch + layout.pack_a : nullptr, scratch + layout.pack_b);
              });
}

inline void RegisterGemmKernels(KernelTable& table) {
  table.add(Op::MatMul, {"matmul", &MatMulKernel, nullptr, &matmul_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
