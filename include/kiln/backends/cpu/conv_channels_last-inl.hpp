// Per-target channels-last ([N, H, W, C]) convolutions as implicit GEMMs that read the image in
// place, with no column matrix; re-included per target.
#if defined(KILN_CPU_CONV_CHANNELS_LAST_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_CHANNELS_LAST_INL_H_
#undef KILN_CPU_CONV_CHANNELS_LAST_INL_H_
#else
#define KILN_CPU_CONV_CHANNELS_LAST_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <utility>
#include <variant>

#include <hwy/highway.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kiln/backends/cpu/conv-inl.hpp"
#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/weight_gradient_partials-inl.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The layout pass only picks channels-last when the channel counts it tiles over are
// multiples of 16, so every tile column is a whole number of vectors on every x86 target.
static_assert(16 % kGemmMaxLanes == 0, "channels-last tiles assume at most 16 lanes");

// A tile is MR rows x NV vectors of accumulators: 24 of them fit the AVX-512 register file
// beside the B vectors and the broadcast, 12 the others. Each row is read through its own
// pointer, so MR stays at 10 to leave general registers for the loop (at 12 GCC spills them).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kConvAccumulators = 24;
#else
inline constexpr std::size_t kConvAccumulators = 12;
#endif
template <std::size_t NV>
inline constexpr std::size_t
    kConvMR = std::max<std::size_t>(1, std::min<std::size_t>(10, kConvAccumulators / NV));

/// The widest tile (in vectors, 4, 2 or 1) that divides a row of `channels` floats.
inline std::size_t ConvTileVectors(std::size_t channels) {
  const std::size_t vectors = channels / hn::Lanes(GemmTag());
  return vectors % 4 == 0 ? 4 : vectors % 2 == 0 ? 2 : 1;
}

/// The taps of a kernel walked in order: tap (i, j) reads its rows at i * row_step + j *
/// col_step and multiplies by the depth x ldb block of B at b + i * b_row_step + j * b_step
/// (negative steps walk the kernel flipped; a strided input gradient's phase steps over taps).
struct TapWalk {
  std::size_t kh, kw;
  std::ptrdiff_t row_step, col_step;
  const float* b;
  std::ptrdiff_t b_row_step, b_step;

  /// Every tap of a kh x kw kernel whose B blocks lie b_step apart, row after row.
  static TapWalk Dense(std::size_t kh, std::size_t kw, const float* b, std::ptrdiff_t b_step) {
    return {kh, kw, 0, 0, b, static_cast<std::ptrdiff_t>(kw) * b_step, b_step};
  }
};

/// c[r, 0 : NV vectors] = sum over the taps in kernel rows `tap_rows` and k < depth of
/// row[r][tap offset + k] * B[tap][k]: a GEMM tile whose A rows are the image's pixels, read in
/// place. Rows past m repeat the last one and are not stored.
template <std::size_t MR, std::size_t NV>
HWY_INLINE void ImplicitTile(const float* const* row, std::size_t m, const TapWalk& taps,
                             const TapRows& tap_rows, std::size_t depth, std::size_t ldb,
                             float* HWY_RESTRICT c, std::size_t ldc) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[MR][NV];
  ZeroAccumulators(acc);
  const float* a[MR];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) a[r] = row[std::min(r, m - 1)];
  // Each tap gets its own depth loop over pointers already offset by the tap, so the loop
  // holds only the row pointers, B and the counter in general registers. One loop over every
  // (tap, k) also carries the tap's indices, and GCC then spills the row pointers: an extra
  // load before every broadcast.
  for (std::size_t i = tap_rows.begin; i < tap_rows.end; ++i) {
    for (std::size_t j = 0; j < taps.kw; ++j) {
      const std::ptrdiff_t offset = static_cast<std::ptrdiff_t>(i) * taps.row_step +
                                    static_cast<std::ptrdiff_t>(j) * taps.col_step;
      const float* at[MR];
      HWY_UNROLL(16)
      for (std::size_t r = 0; r < MR; ++r) at[r] = a[r] + offset;
      const float* b = taps.b + static_cast<std::ptrdiff_t>(i) * taps.b_row_step +
                       static_cast<std::ptrdiff_t>(j) * taps.b_step;
      for (std::size_t k = 0; k < depth; ++k, b += ldb) {
        V bv[NV];
        HWY_UNROLL(4)
        for (std::size_t v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, b + v * lanes);
        HWY_UNROLL(16)
        for (std::size_t r = 0; r < MR; ++r) {
          const V av = hn::Set(d, at[r][k]);
          HWY_UNROLL(4)
          for (std::size_t v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
        }
      }
    }
  }
  ForFirstRows<MR>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * lanes);
  });
}

/// One image of a channels-last convolution: out[p, 0:n] = sum over taps of image pixels
/// under the kernel at output pixel p (out_h x out_w of them, `stride` apart, each
/// `channels` floats) times B. `width` is the image's row length in pixels; only `data` rows
/// of the image hold values, so each tile skips the kernel rows that meet none of them.
template <std::size_t NV>
void ImplicitGemm(const float* image, std::size_t width, std::size_t channels, std::size_t stride_h,
                  std::size_t stride_w, std::size_t out_h, std::size_t out_w, const DataRows& data,
                  TapWalk taps, std::size_t n, float* out) {
  constexpr std::size_t mr = kConvMR<NV>;
  const std::size_t nr = NV * hn::Lanes(GemmTag()), pixels = out_h * out_w;
  taps.row_step = static_cast<std::ptrdiff_t>(width * channels);
  taps.col_step = static_cast<std::ptrdiff_t>(channels);
  const float* row[mr];
  for (std::size_t p0 = 0; p0 < pixels; p0 += mr) {
    const std::size_t m = std::min(mr, pixels - p0);
    for (std::size_t r = 0; r < m; ++r) {
      const std::size_t oh = (p0 + r) / out_w, ow = (p0 + r) % out_w;
      row[r] = image + (oh * stride_h * width + ow * stride_w) * channels;
    }
    const TapRows tap_rows =
        TapRowsMeetingData(taps.kh, stride_h, p0 / out_w, (p0 + m - 1) / out_w, data);
    for (std::size_t j = 0; j < n; j += nr) {
      TapWalk at = taps;
      at.b += j;
      ImplicitTile<mr, NV>(row, m, at, tap_rows, channels, n, out + p0 * n + j, n);
    }
  }
}

/// ImplicitGemm with the tile width chosen from n, the output channels.
inline void ImplicitGemmAnyWidth(const float* image, std::size_t width, std::size_t channels,
                                 std::size_t stride_h, std::size_t stride_w, std::size_t out_h,
                                 std::size_t out_w, const DataRows& data, const TapWalk& taps,
                                 std::size_t n, float* out) {
  switch (ConvTileVectors(n)) {
  case 4:
    ImplicitGemm<4>(image, width, channels, stride_h, stride_w, out_h, out_w, data, taps, n, out);
    break;
  case 2:
    ImplicitGemm<2>(image, width, channels, stride_h, stride_w, out_h, out_w, data, taps, n, out);
    break;
  default:
    ImplicitGemm<1>(image, width, channels, stride_h, stride_w, out_h, out_w, data, taps, n, out);
  }
}

/// Copies an h x w image of `halo.channels` channels into the middle of dst, a zeroed
/// halo.height x halo.width image.
inline void PadImage(const float* HWY_RESTRICT image, std::size_t h, std::size_t w,
                     const ConvHalo& halo, float* HWY_RESTRICT dst) {
  ZeroFloats(dst, halo.floats());
  const std::size_t row = w * halo.channels;
  for (std::size_t i = 0; i < h; ++i) {
    CopyFloats(dst + ((halo.top + i) * halo.width + halo.left) * halo.channels, image + i * row,
               row);
  }
}

/// The rows of an image of h rows that hold it once HaloedImage has given it `halo`.
inline DataRows HaloedRows(const ConvHalo& halo, std::size_t h) {
  const auto top = static_cast<std::ptrdiff_t>(halo.top);
  return {top, top + static_cast<std::ptrdiff_t>(h)};
}

/// The image a channels-last kernel reads: in place, or padded into `scratch` when the
/// convolution has a halo. Returns it and its row length in pixels.
inline std::pair<const float*, std::size_t> HaloedImage(const float* image, std::size_t h,
                                                        std::size_t w, const ConvHalo& halo,
                                                        float* scratch) {
  if (!halo.any()) return {image, w};
  PadImage(image, h, w, halo, scratch);
  return {scratch, halo.width};
}

/// Op::Conv2d, channels-last: y[n] = implicit GEMM of x[n] with the [KH, KW, C, O] weight,
/// images in parallel; the epilogue runs over each image's output while it is in cache.
inline void Conv2dChannelsLastKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2d, args);
  const ConvLayout layout = conv_layout(Op::Conv2d, g, ConvAlgorithm::channels_last);
  const ConvHalo halo = conv_halo(Op::Conv2d, g);
  const float* x = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* y = args.out.f32();
  const std::size_t image = g.pixels() * g.o;
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* yn = epilogue.result_target(y + n * image, scratch + staging);
    const auto [in, width] = HaloedImage(x + n * g.h * g.w * g.c, g.h, g.w, halo, scratch);
    const TapWalk taps = TapWalk::Dense(g.kh, g.kw, w, static_cast<std::ptrdiff_t>(g.c * g.o));
    ImplicitGemmAnyWidth(in, width, g.c, g.stride_h, g.stride_w, g.oh, g.ow, HaloedRows(halo, g.h),
                         taps, g.o, yn);
    epilogue(n * image, (n + 1) * image, scratch + layout.total, yn);
  });
}

/// One phase (ph, pw) of a strided channels-last input gradient for one image: the dx pixels
/// at rows q * stride_h + ph - pad_h and columns r * stride_w + pw - pad_w, each the sum over
/// kernel taps (ph + a stride_h, pw + b stride_w) of dy(q - a, r - b) times the tap's [O, C]
/// block. That is a stride-1 implicit GEMM over `padded` (dy with the halo conv_halo gives it)
/// with the taps walked backwards; its result goes to `phase_out`, then to its pixels of dxn.
inline void ConvGradInputPhase(const ConvGeometry& g, const ConvHalo& halo, const float* padded,
                               const float* w, std::size_t ph, std::size_t pw, float* phase_out,
                               float* dxn) {
  const ConvPhase rows = conv_phase(ph, g.h, g.kh, g.stride_h, g.pad_h);
  const ConvPhase columns = conv_phase(pw, g.w, g.kw, g.stride_w, g.pad_w);
  if (rows.count() == 0 || columns.count() == 0) return;
  const std::size_t block = g.o * g.c;
  // Tap (a, b) of the walk is kernel tap (ph + (T_h - 1 - a) stride_h, pw + (T_w - 1 - b)
  // stride_w): dy rows from q - (T_h - 1) up to q, read forwards.
  TapWalk taps{rows.taps,
               columns.taps,
               0,
               0,
               w,
               -static_cast<std::ptrdiff_t>(g.stride_h * g.kw * block),
               -static_cast<std::ptrdiff_t>(g.stride_w * block)};
  if (rows.taps > 0 && columns.taps > 0)
    taps.b +=
        ((ph + (rows.taps - 1) * g.stride_h) * g.kw + pw + (columns.taps - 1) * g.stride_w) * block;
  // The halo puts dy row q - (T_h - 1) of the first pixel at padded row top + first - T_h + 1,
  // never above the top: phase 0 has the most taps.
  const std::size_t top = halo.top + rows.first + 1 - std::max<std::size_t>(rows.taps, 1);
  const std::size_t left = halo.left + columns.first + 1 - std::max<std::size_t>(columns.taps, 1);
  const DataRows dy_rows = HaloedRows(halo, g.oh);
  const auto view_top = static_cast<std::ptrdiff_t>(top);
  ImplicitGemmAnyWidth(padded + (top * halo.width + left) * g.o, halo.width, g.o, 1, 1,
                       rows.count(), columns.count(),
                       {dy_rows.begin - view_top, dy_rows.end - view_top}, taps, g.c, phase_out);
  for (std::size_t q = 0; q < rows.count(); ++q) {
    const std::size_t ih = (rows.first + q) * g.stride_h + ph - g.pad_h;
    for (std::size_t r = 0; r < columns.count(); ++r) {
      const std::size_t iw = (columns.first + r) * g.stride_w + pw - g.pad_w;
      CopyFloats(dxn + (ih * g.w + iw) * g.c, phase_out + (q * columns.count() + r) * g.c, g.c);
    }
  }
}

/// Op::Conv2dGradInput, channels-last. At stride 1, dx[n] is the convolution of dy[n], padded
/// by kernel - 1 - padding, with the flipped kernel, read from the [KH, KW, O, C] weight. At
/// larger strides each dx pixel's taps depend on its position modulo the stride, so dx is
/// computed as stride_h x stride_w phases (ConvGradInputPhase), each a stride-1 implicit GEMM
/// that multiplies only the taps that meet dy.
inline void Conv2dGradInputChannelsLastKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradInput, g, ConvAlgorithm::channels_last);
  const ConvHalo halo = conv_halo(Op::Conv2dGradInput, g);
  const bool phases = g.stride_h > 1 || g.stride_w > 1;
  const float* dy = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* dx = args.out.f32();
  const std::size_t image = g.h * g.w * g.c, block = g.o * g.c;
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* dxn = epilogue.result_target(dx + n * image, scratch + staging);
    const float* dyn = dy + n * g.pixels() * g.o;
    if (phases) {
      PadImage(dyn, g.oh, g.ow, halo, scratch + layout.col);
      for (std::size_t ph = 0; ph < g.stride_h; ++ph)
        for (std::size_t pw = 0; pw < g.stride_w; ++pw)
          ConvGradInputPhase(g, halo, scratch + layout.col, w, ph, pw, scratch + layout.rows, dxn);
    } else {
      const auto [in, width] = HaloedImage(dyn, g.oh, g.ow, halo, scratch);
      // Tap (i, j) of the flipped kernel is tap (KH - 1 - i, KW - 1 - j) of the weight.
      const TapWalk taps = TapWalk::Dense(g.kh, g.kw, w + (g.kh * g.kw - 1) * block,
                                          -static_cast<std::ptrdiff_t>(block));
      ImplicitGemmAnyWidth(in, width, g.o, 1, 1, g.h, g.w, HaloedRows(halo, g.oh), taps, g.c, dxn);
    }
    epilogue(n * image, (n + 1) * image, scratch + layout.total, dxn);
  });
}

/// partial[rows, 0:NV vectors] += sum over the image's output pixels p of
/// x(p)[offset[r]] * dy[p, 0:NV vectors], where x(p) is the image under the kernel at p and
/// row r stands for one (kernel row, kernel column, input channel). Rows past m repeat the
/// last one and are not stored.
template <std::size_t MR, std::size_t NV>
HWY_INLINE void WeightGradTile(const float* image, std::size_t width, const ConvGeometry& g,
                               const std::size_t* offset, std::size_t m,
                               const float* HWY_RESTRICT dy, float* HWY_RESTRICT partial) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[MR][NV];
  ZeroAccumulators(acc);
  std::size_t at[MR];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) at[r] = offset[std::min(r, m - 1)];
  // One loop over every pixel: the end of an output row only moves x to the next one, and the
  // tile reads through one pointer and fixed offsets, so no per-row loop is needed.
  const std::size_t pixel_step = g.stride_w * g.c, row_step = g.stride_h * width * g.c;
  const float* x = image;
  const float* grad = dy;
  for (std::size_t p = 0, pixels = g.pixels(), ow = 0, oh = 0; p < pixels; ++p) {
    V bv[NV];
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, grad + v * lanes);
    HWY_UNROLL(16)
    for (std::size_t r = 0; r < MR; ++r) {
      const V av = hn::Set(d, x[at[r]]);
      HWY_UNROLL(4)
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
    grad += g.o;
    x += pixel_step;
    if (++ow == g.ow) {
      ow = 0;
      x = image + ++oh * row_step;
    }
  }
  ForFirstRows<MR>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) {
      float* p = partial + r * g.o + v * lanes;
      hn::StoreU(hn::Add(acc[r][v], hn::LoadU(d, p)), d, p);
    }
  });
}

/// Calls tile(offset, m, r0, j) for every tile of a weight gradient's [KH, KW, C, O] rows: rows
/// r0 .. r0 + m - 1 (at most MR, each a (kernel row, kernel column, input channel) whose value
/// under the kernel at the first output pixel sits at offset[r] in an image of rows `width`
/// pixels long), columns j .. j + nr - 1.
template <std::size_t MR, class Tile>
HWY_INLINE void ForEachWeightGradTile(const ConvGeometry& g, std::size_t width, std::size_t nr,
                                      const Tile& tile) {
  const std::size_t rows = g.ckk();
  std::size_t offset[MR];
  for (std::size_t r0 = 0; r0 < rows; r0 += MR) {
    const std::size_t m = std::min(MR, rows - r0);
    for (std::size_t r = 0; r < m; ++r) {
      const std::size_t tap = (r0 + r) / g.c, c = (r0 + r) % g.c;
      offset[r] = (tap / g.kw * width + tap % g.kw) * g.c + c;
    }
    for (std::size_t j = 0; j < g.o; j += nr) tile(offset, m, r0, j);
  }
}

/// One image's share of the weight gradient, added to `partial` ([KH, KW, C, O]).
template <std::size_t NV>
void WeightGradImage(const float* image, std::size_t width, const ConvGeometry& g, const float* dy,
                     float* partial) {
  constexpr std::size_t mr = kConvMR<NV>;
  ForEachWeightGradTile<mr>(
      g, width, NV * hn::Lanes(GemmTag()),
      [&](const std::size_t* offset, std::size_t m, std::size_t r0, std::size_t j) {
        WeightGradTile<mr, NV>(image, width, g, offset, m, dy + j, partial + r0 * g.o + j);
      });
}

/// Op::Conv2dGradWeight, channels-last: dW = sum over images of x-under-the-kernel^T · dy,
/// each run of images summed into its own [KH, KW, C, O] partial; the partials are
/// then added up into the OIHW dW and the epilogue runs over each block of it.
inline void Conv2dGradWeightChannelsLastKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradWeight, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradWeight, g, ConvAlgorithm::channels_last);
  const ConvHalo halo = conv_halo(Op::Conv2dGradWeight, g);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dw = args.out.f32();
  const std::size_t size = g.o * g.ckk();
  const PartialWeightGradients partials{args, layout.partial, 1};
  const EpilogueRunner epilogue(args);
  const std::size_t vectors = ConvTileVectors(g.o);
  partials.Accumulate(g.batch, size, [&](std::size_t n, float* sum) {
    float* scratch = ThreadScratch(args);
    const auto [in, width] = HaloedImage(x + n * g.h * g.w * g.c, g.h, g.w, halo, scratch);
    const float* dyn = dy + n * g.pixels() * g.o;
    if (vectors == 4) {
      WeightGradImage<4>(in, width, g, dyn, sum);
    } else if (vectors == 2) {
      WeightGradImage<2>(in, width, g, dyn, sum);
    } else {
      WeightGradImage<1>(in, width, g, dyn, sum);
    }
  });
  // dW[o, c, tap] sits at (tap * C + c) * O + o in a partial.
  const std::size_t taps = g.kh * g.kw;
  const auto at = [&](std::size_t i) {
    const std::size_t o = i / (g.c * taps), c = i / taps % g.c;
    return (i % taps * g.c + c) * g.o + o;
  };
  partials.SumInto(dw, size, at, epilogue, layout.total);
}

/// Puts this target's channels-last convolutions into the table.
inline void RegisterChannelsLastConvKernels(KernelTable& table) {
  using A = ConvAlgorithm;
  table.add(Op::Conv2d, {"conv2d.channels_last", &Conv2dChannelsLastKernel,
                         &conv_accepts<Op::Conv2d, A::channels_last>,
                         &conv_workspace<Op::Conv2d, A::channels_last>});
  table.add(Op::Conv2dGradInput,
            {"conv2d_grad_input.channels_last", &Conv2dGradInputChannelsLastKernel,
             &conv_accepts<Op::Conv2dGradInput, A::channels_last>,
             &conv_workspace<Op::Conv2dGradInput, A::channels_last>});
  table.add(Op::Conv2dGradWeight,
            {"conv2d_grad_weight.channels_last", &Conv2dGradWeightChannelsLastKernel,
             &conv_accepts<Op::Conv2dGradWeight, A::channels_last>,
             &conv_workspace<Op::Conv2dGradWeight, A::channels_last>});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
