// Per-target NCHW stride-1 convolutions as GEMMs whose operand rows are shifted windows of the
// zero-padded image: no column matrix at all. See ShiftedRows in workspace.hpp for the "wide"
// output rows. Re-included per target.
#if defined(KILN_CPU_CONV_SHIFTED_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_SHIFTED_ROWS_INL_H_
#undef KILN_CPU_CONV_SHIFTED_ROWS_INL_H_
#else
#define KILN_CPU_CONV_SHIFTED_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/float_runs-inl.hpp"
#include "kiln/backends/cpu/gemm-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/weight_gradient_partials-inl.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

static_assert(kGemmMaxLanes <= max_float_lanes, "the partial sums assume at most 16 lanes");

// The weight gradient's tile: kDotRows output channels x kDotTaps taps of vector sums, with
// the output channels' dy vectors and one image vector beside them in registers.
// A count of output channels that is a multiple of 6 but not of kDotRows (LeNet-5's first
// layer) takes tiles of 6 x kDotTapsOf6 where the registers hold them (0: nowhere).
#if HWY_TARGET == HWY_SCALAR
inline constexpr std::size_t kDotRows = 2, kDotTaps = 2, kDotRowsOf6 = 0, kDotTapsOf6 = 1;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kDotRows = 4, kDotTaps = 6, kDotRowsOf6 = 6, kDotTapsOf6 = 3;
#else
inline constexpr std::size_t kDotRows = 2, kDotTaps = 5, kDotRowsOf6 = 0, kDotTapsOf6 = 1;
#endif

/// Where tap k reads: A (the weights) at a[k] from its row start, the padded image at b[k].
struct TapOffsets {
  std::size_t* a;
  std::size_t* b;
};

/// Fills `at` for every tap of `op` and returns it. The forward taps are column-matrix rows
/// (channel, kernel row, kernel column), A being the OIHW weight. The input gradient's taps are
/// (output channel, kernel row, kernel column) of the weight read at o * C*KH*KW + (row, column)
/// from input channel c's row c * KH*KW, over dy read flipped: a stride-1 convolution of the
/// padded dy with the rotated kernel. The weight gradient's taps are in dW's order; the
/// others are grouped by the image row they read (kernel row, or flipped kernel row), so that
/// a tile can take just the groups that meet rows holding data.
inline TapOffsets ShiftedTapOffsets(Op op, const ConvGeometry& g, const ShiftedRows& s,
                                    float* scratch) {
  const TapOffsets at{reinterpret_cast<std::size_t*>(scratch),
                      reinterpret_cast<std::size_t*>(scratch) + s.taps};
  const std::size_t kk = g.kh * g.kw;
  const bool flipped = op == Op::Conv2dGradInput, by_read_row = op != Op::Conv2dGradWeight;
  for (std::size_t plane = 0; plane < s.planes; ++plane) {
    for (std::size_t r = 0; r < g.kh; ++r) {
      const std::size_t read_row = flipped ? g.kh - 1 - r : r;
      for (std::size_t c = 0; c < g.kw; ++c) {
        const std::size_t weight_tap = plane * kk + r * g.kw + c;
        const std::size_t k = by_read_row ? (read_row * s.planes + plane) * g.kw + c : weight_tap;
        at.a[k] = flipped ? plane * g.c * kk + r * g.kw + c : weight_tap;
        at.b[k] = plane * s.plane + read_row * s.width + (flipped ? g.kw - 1 - c : c);
      }
    }
  }
  return at;
}

/// Copies one image (s.planes planes of s.in_h x s.in_w) into the middle of zeroed planes of
/// s.plane floats.
inline void PadPlanes(const ShiftedRows& s, const float* HWY_RESTRICT image,
                      float* HWY_RESTRICT dst) {
  ZeroFloats(dst, s.planes * s.plane);
  for (std::size_t p = 0; p < s.planes; ++p) {
    for (std::size_t i = 0; i < s.in_h; ++i) {
      CopyFloats(dst + p * s.plane + (s.top + i) * s.width + s.left,
                 image + (p * s.in_h + i) * s.in_w, s.in_w);
    }
  }
}

/// c[r, 0 : NV vectors] = sum over taps k in [first_tap, end_tap) of a[r * lda + at.a[k]] *
/// window[at.b[k] + 0 : NV vectors], for r < m; rows past m repeat the last one and are not
/// stored.
template <std::size_t MR, std::size_t NV>
HWY_INLINE void ShiftedRowsTile(std::size_t first_tap, std::size_t end_tap,
                                const float* HWY_RESTRICT a, std::size_t lda, std::size_t m,
                                const float* HWY_RESTRICT window, const TapOffsets& at,
                                float* HWY_RESTRICT c, std::size_t ldc) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  const float* rows[MR];
  HWY_UNROLL(8)
  for (std::size_t r = 0; r < MR; ++r) rows[r] = a + std::min(r, m - 1) * lda;
  V acc[MR][NV];
  ZeroAccumulators(acc);
  for (std::size_t k = first_tap; k < end_tap; ++k) {
    const float* b = window + at.b[k];
    const std::size_t ak = at.a[k];
    MultiplyAddRank1(acc, rows, ak, b);
  }
  ForFirstRows<MR>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * lanes);
  });
}

/// ShiftedRowsTile as ShiftedRowsImage calls it. The 8-row tile runs out of line: inlined into
/// the image's loops, GCC kept one of its B vectors on the stack (LeNet-5's 6->16 forward
/// convolution took 1.7x as long); the other heights run as fast inline.
template <std::size_t MR, std::size_t NV>
HWY_NOINLINE void ShiftedRowsTileOutOfLine(std::size_t first_tap, std::size_t end_tap,
                                           const float* a, std::size_t lda, std::size_t m,
                                           const float* window, const TapOffsets& at, float* c,
                                           std::size_t ldc) {
  ShiftedRowsTile<MR, NV>(first_tap, end_tap, a, lda, m, window, at, c, ldc);
}

template <std::size_t MR, std::size_t NV>
HWY_INLINE void ShiftedRowsImageTile(std::size_t first_tap, std::size_t end_tap, const float* a,
                                     std::size_t lda, std::size_t m, const float* window,
                                     const TapOffsets& at, float* c, std::size_t ldc) {
  if constexpr (MR == 8) {
    ShiftedRowsTileOutOfLine<MR, NV>(first_tap, end_tap, a, lda, m, window, at, c, ldc);
  } else {
    ShiftedRowsTile<MR, NV>(first_tap, end_tap, a, lda, m, window, at, c, ldc);
  }
}

// Accumulators a shifted-rows tile may use beside its B vectors and broadcast: 24 of the 32
// AVX-512 registers, 12 of 16 elsewhere.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kShiftedAccumulators = 24;
#elif HWY_TARGET == HWY_SCALAR
inline constexpr std::size_t kShiftedAccumulators = 8;
#else
inline constexpr std::size_t kShiftedAccumulators = 12;
#endif

/// The wide output rows of one image, `m` rows of A (output channels; input channels for the
/// input gradient) MR at a time, column blocks outside so the image windows stay in L1.
/// A tile is at most max_nr columns wide, the slack every wide row has. Its taps are grouped
/// by the padded row they read (ShiftedTapOffsets), `kh` groups; it takes only the groups
/// that reach a row holding the image for one of its output rows.
template <std::size_t MR>
void ShiftedRowsImage(const ShiftedRows& s, std::size_t kh, std::size_t m, const float* a,
                      std::size_t lda, const float* padded, const TapOffsets& at, float* wide) {
  constexpr std::size_t nv_fit = std::max<std::size_t>(1, kShiftedAccumulators / MR);
  constexpr std::size_t nv = std::min(nv_fit, gemm_blocking::max_nr / kGemmMaxLanes);
  const std::size_t nr = nv * hn::Lanes(GemmTag()), row_floats = s.row_floats();
  const std::size_t group = s.taps / kh;
  const auto top = static_cast<std::ptrdiff_t>(s.top);
  const DataRows data{top, top + static_cast<std::ptrdiff_t>(s.in_h)};
  for (std::size_t q = 0; q < s.columns; q += nr) {
    const std::size_t last = std::min(q + nr, s.columns) - 1;
    const TapRows rows = TapRowsMeetingData(kh, 1, q / s.width, last / s.width, data);
    for (std::size_t r = 0; r < m; r += MR) {
      ShiftedRowsImageTile<MR, nv>(rows.begin * group, rows.end * group, a + r * lda, lda,
                                   std::min(MR, m - r), padded + q, at, wide + r * row_floats + q,
                                   row_floats);
    }
  }
}

/// ShiftedRowsImage with the tile height that wastes the fewest rows on `m` (8, 6 or 4; the
/// wider tile on a tie).
inline void ShiftedRowsImageAnyHeight(const ShiftedRows& s, std::size_t kh, std::size_t m,
                                      const float* a, std::size_t lda, const float* padded,
                                      const TapOffsets& at, float* wide) {
  const auto padded_rows = [m](std::size_t mr) { return (m + mr - 1) / mr * mr; };
  if (padded_rows(8) <= std::min(padded_rows(6), padded_rows(4))) {
    ShiftedRowsImage<8>(s, kh, m, a, lda, padded, at, wide);
  } else if (padded_rows(6) <= padded_rows(4)) {
    ShiftedRowsImage<6>(s, kh, m, a, lda, padded, at, wide);
  } else {
    ShiftedRowsImage<4>(s, kh, m, a, lda, padded, at, wide);
  }
}

/// Op::Conv2d and Op::Conv2dGradInput over shifted rows: per image, the padded image (x, or
/// dy), its wide output rows, then each row's first out_w columns to the output, where the
/// epilogue runs over them while they are in cache.
inline void ConvShiftedRows(Op op, const KernelArgs& args, const ConvGeometry& g,
                            const ConvLayout& layout) {
  const ShiftedRows s = shifted_rows(op, g);
  const bool input_gradient = op == Op::Conv2dGradInput;
  const float* in = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* out = args.out.f32();
  const std::size_t m = input_gradient ? g.c : g.o;
  const std::size_t lda = input_gradient ? g.kh * g.kw : g.ckk();
  const std::size_t image_in = s.planes * s.in_h * s.in_w, image_out = m * s.out_h * s.out_w;
  const std::size_t row_floats = s.row_floats();
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* padded = scratch + layout.col;
    float* wide = scratch + layout.rows;
    const TapOffsets at = ShiftedTapOffsets(op, g, s, scratch + layout.offsets);
    PadPlanes(s, in + n * image_in, padded);
    ShiftedRowsImageAnyHeight(s, g.kh, m, w, lda, padded, at, wide);
    float* result = epilogue.result_target(out + n * image_out, scratch + staging);
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t i = 0; i < s.out_h; ++i) {
        CopyFloats(result + (r * s.out_h + i) * s.out_w, wide + r * row_floats + i * s.width,
                   s.out_w);
      }
    }
    epilogue(n * image_out, (n + 1) * image_out, scratch + layout.total, result);
  });
}

/// partial[r * ldp + k * lanes] += the lane-wise sums over `vectors` vectors of
/// dy[r] * window[offsets[k]], for r < m and k < n; rows and taps past m and n repeat the last
/// one and are not stored.
template <std::size_t RO, std::size_t RK>
HWY_INLINE void ShiftedDotTile(std::size_t vectors, const float* HWY_RESTRICT dy, std::size_t ldy,
                               std::size_t m, const float* HWY_RESTRICT window,
                               const std::size_t* HWY_RESTRICT offsets, std::size_t n,
                               float* HWY_RESTRICT partial, std::size_t ldp) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  const float* rows[RO];
  const float* taps[RK];
  HWY_UNROLL(8)
  for (std::size_t r = 0; r < RO; ++r) rows[r] = dy + std::min(r, m - 1) * ldy;
  HWY_UNROLL(8)
  for (std::size_t k = 0; k < RK; ++k) taps[k] = window + offsets[std::min(k, n - 1)];
  V acc[RO][RK];
  ZeroAccumulators(acc);
  for (std::size_t i = 0, at = 0; i < vectors; ++i, at += lanes) {
    V dv[RO];
    HWY_UNROLL(8)
    for (std::size_t r = 0; r < RO; ++r) dv[r] = hn::LoadU(d, rows[r] + at);
    HWY_UNROLL(8)
    for (std::size_t k = 0; k < RK; ++k) {
      const V xv = hn::LoadU(d, taps[k] + at);
      HWY_UNROLL(8)
      for (std::size_t r = 0; r < RO; ++r) acc[r][k] = hn::MulAdd(dv[r], xv, acc[r][k]);
    }
  }
  ForFirstRows<RO>(m, [&](std::size_t r) HWY_ATTR {
    ForFirstRows<RK>(n, [&](std::size_t k) HWY_ATTR {
      float* p = partial + r * ldp + k * lanes;
      hn::Store(hn::Add(hn::Load(d, p), acc[r][k]), d, p);
    });
  });
}

/// Every (output channel, tap) tile of one image's dot products, RO x RK at a time.
template <std::size_t RO, std::size_t RK>
void ShiftedDots(std::size_t vectors, const float* wide, std::size_t row_floats, std::size_t m,
                 const float* padded, const std::size_t* offsets, std::size_t taps, float* sums) {
  const std::size_t lanes = hn::Lanes(GemmTag());
  for (std::size_t o = 0; o < m; o += RO) {
    for (std::size_t k = 0; k < taps; k += RK) {
      ShiftedDotTile<RO, RK>(vectors, wide + o * row_floats, row_floats, std::min(RO, m - o),
                             padded, offsets + k, std::min(RK, taps - k),
                             sums + (o * taps + k) * lanes, taps * lanes);
    }
  }
}

/// Op::Conv2dGradWeight over shifted rows: dW[o, tap] = sum over images and wide columns of
/// dy[o] (widened, zero past each row's end) times the tap's window of the padded image. Each
/// thread keeps a vector of partial sums per dW element; lanes and threads are summed at the
/// end, where the epilogue (typically the optimizer update) runs over each block of dW.
inline void Conv2dGradWeightShiftedRows(const KernelArgs& args, const ConvGeometry& g,
                                        const ConvLayout& layout) {
  const ShiftedRows s = shifted_rows(Op::Conv2dGradWeight, g);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dw = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), size = g.o * ckk;
  const std::size_t lanes = hn::Lanes(GemmTag()), row_floats = s.row_floats();
  const std::size_t vectors = (s.columns + lanes - 1) / lanes;
  const bool by_six = kDotRowsOf6 > 0 && g.o % 6 == 0 && g.o % kDotRows != 0;
  const PartialWeightGradients partials{args, layout.partial, lanes};
  partials.Accumulate(g.batch, size, [&](std::size_t n, float* sums) {
    float* scratch = ThreadScratch(args);
    float* padded = scratch + layout.col;
    float* wide = scratch + layout.rows;
    const TapOffsets at = ShiftedTapOffsets(Op::Conv2dGradWeight, g, s, scratch + layout.offsets);
    PadPlanes(s, x + n * g.c * g.h * g.w, padded);
    ZeroFloats(wide, g.o * row_floats);
    const float* dyn = dy + n * g.o * pixels;
    for (std::size_t o = 0; o < g.o; ++o) {
      for (std::size_t i = 0; i < g.oh; ++i) {
        CopyFloats(wide + o * row_floats + i * s.width, dyn + (o * g.oh + i) * g.ow, g.ow);
      }
    }
    if constexpr (kDotRowsOf6 > 0) {
      if (by_six) {
        ShiftedDots<kDotRowsOf6, kDotTapsOf6>(vectors, wide, row_floats, g.o, padded, at.b, ckk,
                                              sums);
        return;
      }
    }
    ShiftedDots<kDotRows, kDotTaps>(vectors, wide, row_floats, g.o, padded, at.b, ckk, sums);
  });
  const EpilogueRunner epilogue(args);
  partials.SumInto(
      dw, size, [](std::size_t i) { return i; }, epilogue, layout.total);
}

/// A convolution or either gradient over shifted rows of the padded image.
template <Op op> void ConvShiftedRowsKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(op, args);
  const ConvLayout layout = conv_layout(op, g, ConvAlgorithm::shifted_rows);
  if constexpr (op == Op::Conv2dGradWeight) {
    Conv2dGradWeightShiftedRows(args, g, layout);
  } else {
    ConvShiftedRows(op, args, g, layout);
  }
}

/// Puts this target's shifted-rows convolutions into the table.
inline void RegisterShiftedRowsConvKernels(KernelTable& table) {
  using A = ConvAlgorithm;
  table.add(Op::Conv2d, {"conv2d.shifted_rows", &ConvShiftedRowsKernel<Op::Conv2d>,
                         &conv_accepts<Op::Conv2d, A::shifted_rows>,
                         &conv_workspace<Op::Conv2d, A::shifted_rows>});
  table.add(Op::Conv2dGradInput,
            {"conv2d_grad_input.shifted_rows", &ConvShiftedRowsKernel<Op::Conv2dGradInput>,
             &conv_accepts<Op::Conv2dGradInput, A::shifted_rows>,
             &conv_workspace<Op::Conv2dGradInput, A::shifted_rows>});
  table.add(Op::Conv2dGradWeight,
            {"conv2d_grad_weight.shifted_rows", &ConvShiftedRowsKernel<Op::Conv2dGradWeight>,
             &conv_accepts<Op::Conv2dGradWeight, A::shifted_rows>,
             &conv_workspace<Op::Conv2dGradWeight, A::shifted_rows>});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
