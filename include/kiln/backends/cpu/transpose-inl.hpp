// Per-target transpose kernel; re-included once per Highway target by implementation.hpp.
//
// Every transpose is first reduced to its essential form: size-1 axes dropped and input axes
// that stay neighbours in the output merged, so NCHW -> NHWC becomes [N, C, HW] -> [N, HW, C]
// and an OIHW weight repack [O, I, KH*KW] -> [KH*KW, I, O]. What remains is either a copy of
// contiguous runs (the innermost axis stays innermost) or a batch of 2-D matrix transposes,
// done in cache blocks of 4 x 4 register transposes.
#if defined(KILN_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_TRANSPOSE_INL_H_
#undef KILN_CPU_TRANSPOSE_INL_H_
#else
#define KILN_CPU_TRANSPOSE_INL_H_
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <variant>

#include <hwy/highway.h>

#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/backends/essential_transpose.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace transpose_detail {

/// Elements are moved as 32-bit words: every kiln dtype is 4 bytes.
using Word = std::uint32_t;

/// Elements a parallel task should at least move to pay for its scheduling.
inline constexpr std::int64_t kMinTaskElements = 32768;
/// A 2-D transpose is split into tasks along its longer side in pieces of this many.
inline constexpr std::int64_t kChunk = 256;
/// Cache block of a 2-D transpose: source rows x source columns, 8 KiB of source and of
/// destination, so both stay in L1 while the block's 4 x 4 register transposes fill whole
/// cache lines. (Measured on AVX-512: 64 x 32 moves ~23 GB/s on one core, memcpy ~29; an
/// 8 x 8 transpose in 256-bit registers was slower.)
inline constexpr std::int64_t kBlockRows = 64, kBlockCols = 32;

/// Up to max_rank - 2 outer axes walked in row-major order, carrying a source and a
/// destination offset.
struct Odometer {
  int rank = 0;
  std::array<std::int64_t, Shape::max_rank> dims{}, src{}, dst{}, idx{};
  std::int64_t src_at = 0, dst_at = 0;

  /// Positions the walk at flat index `flat`.
  void Seek(std::int64_t flat) {
    src_at = dst_at = 0;
    for (int i = rank - 1; i >= 0; --i) {
      const auto u = static_cast<std::size_t>(i);
      idx[u] = flat % dims[u];
      flat /= dims[u];
      src_at += idx[u] * src[u];
      dst_at += idx[u] * dst[u];
    }
  }
  void Next() {
    for (int i = rank - 1; i >= 0; --i) {
      const auto u = static_cast<std::size_t>(i);
      src_at += src[u];
      dst_at += dst[u];
      if (++idx[u] < dims[u]) return;
      src_at -= idx[u] * src[u];
      dst_at -= idx[u] * dst[u];
      idx[u] = 0;
    }
  }
};

/// dst[j * ds + i] = src[i * ss + j] for a 4 x 4 block, in 128-bit registers. The 2-D
/// helpers take any 4-byte element type T, so a kernel that reorders its own float scratch
/// reads it as floats.
#if HWY_TARGET != HWY_SCALAR
template <class T>
HWY_INLINE void Transpose4x4(const T* HWY_RESTRICT src, std::int64_t ss, T* HWY_RESTRICT dst,
                             std::int64_t ds) {
  const hn::Full128<T> d4;
  const auto r0 = hn::LoadU(d4, src), r1 = hn::LoadU(d4, src + ss);
  const auto r2 = hn::LoadU(d4, src + 2 * ss), r3 = hn::LoadU(d4, src + 3 * ss);
  const auto lo01 = hn::InterleaveLower(d4, r0, r1), lo23 = hn::InterleaveLower(d4, r2, r3);
  const auto hi01 = hn::InterleaveUpper(d4, r0, r1), hi23 = hn::InterleaveUpper(d4, r2, r3);
  hn::StoreU(hn::ConcatLowerLower(d4, lo23, lo01), d4, dst);
  hn::StoreU(hn::ConcatUpperUpper(d4, lo23, lo01), d4, dst + ds);
  hn::StoreU(hn::ConcatLowerLower(d4, hi23, hi01), d4, dst + 2 * ds);
  hn::StoreU(hn::ConcatUpperUpper(d4, hi23, hi01), d4, dst + 3 * ds);
}
#endif

/// Few source rows written as interleaved destination rows: rows in {2, 3, 4}, ds == rows
/// (e.g. NCHW -> NHWC of a 3-channel image). Returns the first column not done.
template <int kRows, class T>
HWY_INLINE std::int64_t InterleaveRows(const T* HWY_RESTRICT src, std::int64_t ss,
                                       T* HWY_RESTRICT dst, std::int64_t cols) {
  const hn::ScalableTag<T> d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t j = 0;
  for (; j + N <= cols; j += N) {
    const auto v0 = hn::LoadU(d, src + j), v1 = hn::LoadU(d, src + ss + j);
    if constexpr (kRows == 2) {
      hn::StoreInterleaved2(v0, v1, d, dst + j * 2);
    } else if constexpr (kRows == 3) {
      hn::StoreInterleaved3(v0, v1, hn::LoadU(d, src + 2 * ss + j), d, dst + j * 3);
    } else {
      hn::StoreInterleaved4(v0, v1, hn::LoadU(d, src + 2 * ss + j), hn::LoadU(d, src + 3 * ss + j),
                            d, dst + j * 4);
    }
  }
  return j;
}

/// Interleaved source rows split into few destination rows: cols in {2, 3, 4}, ss == cols
/// (e.g. NHWC -> NCHW of a 3-channel image). Returns the first row not done.
template <int kCols, class T>
HWY_INLINE std::int64_t DeinterleaveCols(const T* HWY_RESTRICT src, T* HWY_RESTRICT dst,
                                         std::int64_t ds, std::int64_t rows) {
  const hn::ScalableTag<T> d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= rows; i += N) {
    hn::Vec<decltype(d)> v0, v1;
    if constexpr (kCols == 2) {
      hn::LoadInterleaved2(d, src + i * 2, v0, v1);
    } else if constexpr (kCols == 3) {
      hn::Vec<decltype(d)> v2;
      hn::LoadInterleaved3(d, src + i * 3, v0, v1, v2);
      hn::StoreU(v2, d, dst + 2 * ds + i);
    } else {
      hn::Vec<decltype(d)> v2, v3;
      hn::LoadInterleaved4(d, src + i * 4, v0, v1, v2, v3);
      hn::StoreU(v2, d, dst + 2 * ds + i);
      hn::StoreU(v3, d, dst + 3 * ds + i);
    }
    hn::StoreU(v0, d, dst + i);
    hn::StoreU(v1, d, dst + ds + i);
  }
  return i;
}

/// The 2-D transpose dst[j * ds + i] = src[i * ss + j], i < rows, j < cols.
template <class T>
inline void Transpose2D(const T* HWY_RESTRICT src, std::int64_t ss, T* HWY_RESTRICT dst,
                        std::int64_t ds, std::int64_t rows, std::int64_t cols) {
  // Vector-done region: rows [0, rows_done) x cols [0, cols_done); the rest is scalar.
  std::int64_t rows_done = 0, cols_done = 0;
  if (rows <= 4 && ds == rows && rows >= 2) {
    rows_done = rows;
    cols_done = rows == 2   ? InterleaveRows<2>(src, ss, dst, cols)
                : rows == 3 ? InterleaveRows<3>(src, ss, dst, cols)
                            : InterleaveRows<4>(src, ss, dst, cols);
  } else if (cols <= 4 && ss == cols && cols >= 2) {
    cols_done = cols;
    rows_done = cols == 2   ? DeinterleaveCols<2>(src, dst, ds, rows)
                : cols == 3 ? DeinterleaveCols<3>(src, dst, ds, rows)
                            : DeinterleaveCols<4>(src, dst, ds, rows);
  } else {
#if HWY_TARGET != HWY_SCALAR
    rows_done = rows & ~std::int64_t{3};
    cols_done = cols & ~std::int64_t{3};
    for (std::int64_t i0 = 0; i0 < rows_done; i0 += kBlockRows) {
      const std::int64_t i1 = std::min(i0 + kBlockRows, rows_done);
      for (std::int64_t j0 = 0; j0 < cols_done; j0 += kBlockCols) {
        const std::int64_t j1 = std::min(j0 + kBlockCols, cols_done);
        for (std::int64_t i = i0; i < i1; i += 4)
          for (std::int64_t j = j0; j < j1; j += 4)
            Transpose4x4(src + i * ss + j, ss, dst + j * ds + i, ds);
      }
    }
    // Rows or columns past the last multiple of 4 take one more block of 4 that overlaps the
    // one before: those elements are written twice, with the same values, but in vectors (a
    // 6-channel image has a third of its elements there).
    const auto block = [&](std::int64_t i, std::int64_t j)
                           HWY_ATTR { Transpose4x4(src + i * ss + j, ss, dst + j * ds + i, ds); };
    if (rows >= 4 && cols >= 4) {
      if (rows_done < rows)
        for (std::int64_t j = 0; j < cols_done; j += 4) block(rows - 4, j);
      if (cols_done < cols) {
        for (std::int64_t i = 0; i < rows_done; i += 4) block(i, cols - 4);
        if (rows_done < rows) block(rows - 4, cols - 4);
      }
      rows_done = rows;
      cols_done = cols;
    }
#endif
  }
  // Leftover columns of the vector rows, then the leftover rows in full.
  for (std::int64_t j = cols_done; j < cols; ++j)
    for (std::int64_t i = 0; i < rows_done; ++i) dst[j * ds + i] = src[i * ss + j];
  for (std::int64_t i = rows_done; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) dst[j * ds + i] = src[i * ss + j];
}

/// dst = src of shape `in` with its axes permuted; src and dst do not overlap.
inline void Transpose(const Word* src, Word* dst, const Shape& in, std::span<const int> perm) {
  const std::int64_t total = in.numel();
  if (total == 0) return;
  const EssentialTranspose e = essential_transpose(in, perm);
  const int k = e.rank;
  if (k <= 1) { // nothing moves
    std::memcpy(dst, src, static_cast<std::size_t>(total) * sizeof(Word));
    return;
  }
  std::array<std::int64_t, Shape::max_rank> in_stride{}, out_stride{};
  e.strides(in_stride, out_stride);
  const auto src_stride_of_output_axis = [&](int i) {
    return in_stride[static_cast<std::size_t>(e.perm[static_cast<std::size_t>(i)])];
  };

  if (e.perm[static_cast<std::size_t>(k - 1)] == k - 1) {
    // The innermost axis stays innermost: copy runs of it, walking the other output axes.
    const std::int64_t run = e.dims[static_cast<std::size_t>(k - 1)];
    Odometer walk;
    walk.rank = k - 1;
    for (int i = 0; i < k - 1; ++i) {
      const auto u = static_cast<std::size_t>(i);
      walk.dims[u] = e.dims[static_cast<std::size_t>(e.perm[u])];
      walk.src[u] = src_stride_of_output_axis(i);
      walk.dst[u] = out_stride[u];
    }
    const std::int64_t runs = total / run;
    const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / run);
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, runs, grain),
                      [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                        Odometer w = walk;
                        w.Seek(r.begin());
                        for (std::int64_t q = r.begin(); q != r.end(); ++q, w.Next())
                          std::memcpy(dst + w.dst_at, src + w.src_at,
                                      static_cast<std::size_t>(run) * sizeof(Word));
                      });
    return;
  }

  // A batch of 2-D transposes: source rows run along input axis a (the output's innermost),
  // source columns along the input's innermost axis, found at output position j.
  const int a = e.perm[static_cast<std::size_t>(k - 1)];
  int j = 0;
  while (e.perm[static_cast<std::size_t>(j)] != k - 1) ++j;
  const std::int64_t rows = e.dims[static_cast<std::size_t>(a)];
  const std::int64_t cols = e.dims[static_cast<std::size_t>(k - 1)];
  const std::int64_t ss = in_stride[static_cast<std::size_t>(a)];
  const std::int64_t ds = out_stride[static_cast<std::size_t>(j)];
  Odometer batch;
  for (int i = 0; i < k - 1; ++i) {
    if (i == j) continue;
    const auto u = static_cast<std::size_t>(batch.rank++);
    batch.dims[u] = e.dims[static_cast<std::size_t>(e.perm[static_cast<std::size_t>(i)])];
    batch.src[u] = src_stride_of_output_axis(i);
    batch.dst[u] = out_stride[static_cast<std::size_t>(i)];
  }
  const std::int64_t matrices = total / (rows * cols);
  // Long matrices are also split, along their longer side, so one image still spreads.
  const bool split_rows = rows >= cols;
  const std::int64_t side = split_rows ? rows : cols;
  const std::int64_t pieces = (side + kChunk - 1) / kChunk;
  const std::int64_t per_task = rows * cols / pieces;
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, per_task));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, matrices * pieces, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      Odometer w = batch;
                      std::int64_t m = r.begin() / pieces;
                      w.Seek(m);
                      for (std::int64_t t = r.begin(); t != r.end(); ++t) {
                        if (t / pieces != m) {
                          m = t / pieces;
                          w.Next();
                        }
                        const std::int64_t lo = (t % pieces) * kChunk;
                        const std::int64_t n = std::min(kChunk, side - lo);
                        const Word* s = src + w.src_at;
                        Word* o = dst + w.dst_at;
                        if (split_rows) {
                          Transpose2D(s + lo * ss, ss, o + lo, ds, n, cols);
                        } else {
                          Transpose2D(s + lo, ss, o + lo * ds, ds, rows, n);
                        }
                      }
                    });
}

} // namespace transpose_detail

/// transpose: out dim i = in dim perm[i]; moves 4-byte elements of any dtype.
inline void TransposeKernel(const KernelArgs& args) {
  using transpose_detail::Word;
  const auto& perm = std::get_if<TransposeAttrs>(args.attrs)->perm;
  const Shape& in = args.in[0].shape;
  auto* out = static_cast<Word*>(args.out.data);
  if (args.out.data != args.in[0].data) {
    transpose_detail::Transpose(static_cast<const Word*>(args.in[0].data), out, in, perm);
    return;
  }
  // In place (OpDef::overwritable_input: the batch axis stays first): each image is copied
  // to this thread's workspace and reordered back from there.
  const Shape image(in.begin() + 1, in.end());
  std::array<int, Shape::max_rank> image_perm{};
  for (std::size_t i = 1; i < perm.size(); ++i) image_perm[i - 1] = perm[i] - 1;
  const std::int64_t words = image.numel();
  tbb::parallel_for(std::int64_t{0}, in[0], [&](std::int64_t n) {
    auto* staged = reinterpret_cast<Word*>(ThreadScratch(args));
    std::memcpy(staged, out + n * words, static_cast<std::size_t>(words) * sizeof(Word));
    transpose_detail::Transpose(staged, out + n * words, image,
                                std::span<const int>(image_perm.data(), perm.size() - 1));
  });
}

/// Puts this target's transpose kernel into the table.
inline void RegisterTransposeKernels(KernelTable& table) {
  table.add(Op::Transpose, {"transpose", &TransposeKernel, nullptr, &transpose_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
