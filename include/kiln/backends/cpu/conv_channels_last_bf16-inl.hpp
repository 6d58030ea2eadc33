// Per-target channels-last convolutions that multiply in bfloat16 and add in FP32: the implicit
// GEMMs of conv_channels_last-inl.hpp over pairs of depths (AVX512-BF16 dot products), on x86
// AVX-512 targets; re-included per target.
#if defined(KILN_CPU_CONV_CHANNELS_LAST_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_CHANNELS_LAST_BF16_INL_H_
#undef KILN_CPU_CONV_CHANNELS_LAST_BF16_INL_H_
#else
#define KILN_CPU_CONV_CHANNELS_LAST_BF16_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>
#include <tbb/parallel_for.h>

#include "kiln/backends/cpu/conv_channels_last-inl.hpp"
#include "kiln/backends/cpu/gemm_bf16-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/weight_gradient_partials-inl.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

/// Up to 16 floats of a row of the padded image: zeros in the halo.
HWY_INLINE __m512 PaddedLoad(const float* image, std::size_t h, std::size_t w, const ConvHalo& halo,
                             std::size_t row, std::size_t col, std::size_t channel,
                             std::size_t count) {
  if (row < halo.top || row >= halo.top + h || col < halo.left || col >= halo.left + w)
    return _mm512_setzero_ps();
  return _mm512_maskz_loadu_ps(FirstLanes16(count),
                               image + ((row - halo.top) * w + (col - halo.left)) * halo.channels +
                                   channel);
}

/// An h x w image of `halo.channels` (even) channels as bfloat16, zero-padded by the halo into
/// `dst` (halo.height x halo.width pixels).
KILN_BF16_FUNCTION inline void ImageToBf16(const float* HWY_RESTRICT image, std::size_t h,
                                           std::size_t w, const ConvHalo& halo,
                                           std::uint16_t* HWY_RESTRICT dst) {
  if (halo.any()) std::fill_n(dst, halo.floats(), std::uint16_t{0});
  const std::size_t row = w * halo.channels;
  for (std::size_t i = 0; i < h; ++i) {
    const float* src = image + i * row;
    std::uint16_t* out = dst + ((halo.top + i) * halo.width + halo.left) * halo.channels;
    for (std::size_t k = 0; k < row; k += 32) {
      const std::size_t n = std::min<std::size_t>(32, row - k);
      const __m512i v =
          ToBf16(_mm512_maskz_loadu_ps(FirstLanes16(n), src + k),
                 _mm512_maskz_loadu_ps(FirstLanes16(n > 16 ? n - 16 : 0), src + k + 16));
      _mm512_mask_storeu_epi16(out + k, FirstLanes32(n), v);
    }
  }
}

/// The [taps, depth, n] weight (n a multiple of 16, depth even) as pairs of depths:
/// dst[(t * depth / 2 + p) * n + j] = (w[tap][2p][j], w[tap][2p + 1][j]), tap = t, or
/// taps - 1 - t when `flip`.
KILN_BF16_FUNCTION inline void WeightPairs(const float* HWY_RESTRICT w, std::size_t taps,
                                           std::size_t depth, std::size_t n, bool flip,
                                           std::uint32_t* HWY_RESTRICT dst) {
  const std::size_t pairs = depth / 2;
  for (std::size_t t = 0; t < taps; ++t) {
    const float* tap = w + (flip ? taps - 1 - t : t) * depth * n;
    for (std::size_t p = 0; p < pairs; ++p) {
      const float* first = tap + 2 * p * n;
      std::uint32_t* out = dst + (t * pairs + p) * n;
      for (std::size_t j = 0; j < n; j += 16) {
        _mm512_storeu_si512(
            out + j, InterleaveToBf16(_mm512_loadu_ps(first + j), _mm512_loadu_ps(first + n + j)));
      }
    }
  }
}

/// ImplicitTile over pairs of depths: c[r, 0 : NV vectors] = sum over the taps in kernel rows
/// `tap_rows` and pairs p of row[r][tap offset + p] . B[tap][p], the rows and B in 32-bit pairs
/// of bfloat16.
template <std::size_t MR, std::size_t NV>
KILN_BF16_FUNCTION HWY_INLINE void
ImplicitTileBf16(const std::uint32_t* const* row, std::size_t m, const TapRows& tap_rows,
                 std::size_t kw, std::ptrdiff_t row_step, std::ptrdiff_t col_step,
                 const std::uint32_t* HWY_RESTRICT b, std::size_t pairs, std::size_t ldb,
                 float* HWY_RESTRICT c, std::size_t ldc) {
  __m512 acc[MR][NV];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const std::uint32_t* a[MR];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) a[r] = row[std::min(r, m - 1)];
  // A depth loop per tap over pointers offset by the tap, as in ImplicitTile.
  for (std::size_t i = tap_rows.begin; i < tap_rows.end; ++i) {
    for (std::size_t j = 0; j < kw; ++j) {
      const std::ptrdiff_t offset =
          static_cast<std::ptrdiff_t>(i) * row_step + static_cast<std::ptrdiff_t>(j) * col_step;
      const std::uint32_t* at[MR];
      HWY_UNROLL(16)
      for (std::size_t r = 0; r < MR; ++r) at[r] = a[r] + offset;
      const std::uint32_t* bt = b + (i * kw + j) * pairs * ldb;
      for (std::size_t p = 0; p < pairs; ++p, bt += ldb) {
        __m512bh bv[NV];
        HWY_UNROLL(4)
        for (std::size_t v = 0; v < NV; ++v)
          bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(bt + v * 16));
        HWY_UNROLL(16)
        for (std::size_t r = 0; r < MR; ++r) {
          const auto av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(at[r][p])));
          HWY_UNROLL(4)
          for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
      }
    }
  }
  ForFirstRows<MR>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  });
}

/// ImplicitGemm over pairs: out[p, 0:n] = sum over taps of the image's pixels under the kernel
/// at output pixel p (each `pairs` pairs of channels, rows `width` pixels long) times B, each
/// tile skipping the kernel rows that meet none of the `data` rows.
template <std::size_t NV>
KILN_BF16_FUNCTION void ImplicitGemmBf16(const std::uint32_t* image, std::size_t width,
                                         std::size_t pairs, std::size_t stride_h,
                                         std::size_t stride_w, std::size_t out_h, std::size_t out_w,
                                         const DataRows& data, std::size_t kh, std::size_t kw,
                                         const std::uint32_t* b, std::size_t n, float* out) {
  constexpr std::size_t mr = kConvMR<NV>;
  constexpr std::size_t nr = NV * 16;
  const std::size_t pixels = out_h * out_w;
  const auto row_step = static_cast<std::ptrdiff_t>(width * pairs);
  const auto col_step = static_cast<std::ptrdiff_t>(pairs);
  const std::uint32_t* row[mr];
  for (std::size_t p0 = 0; p0 < pixels; p0 += mr) {
    const std::size_t m = std::min(mr, pixels - p0);
    for (std::size_t r = 0; r < m; ++r) {
      const std::size_t oh = (p0 + r) / out_w, ow = (p0 + r) % out_w;
      row[r] = image + (oh * stride_h * width + ow * stride_w) * pairs;
    }
    const TapRows tap_rows =
        TapRowsMeetingData(kh, stride_h, p0 / out_w, (p0 + m - 1) / out_w, data);
    for (std::size_t j = 0; j < n; j += nr) {
      ImplicitTileBf16<mr, NV>(row, m, tap_rows, kw, row_step, col_step, b + j, pairs, n,
                               out + p0 * n + j, n);
    }
  }
}

/// ImplicitGemmBf16 with the tile width chosen from n (a multiple of 16).
inline void ImplicitGemmBf16AnyWidth(const std::uint32_t* image, std::size_t width,
                                     std::size_t pairs, std::size_t stride_h, std::size_t stride_w,
                                     std::size_t out_h, std::size_t out_w, const DataRows& data,
                                     std::size_t kh, std::size_t kw, const std::uint32_t* b,
                                     std::size_t n, float* out) {
  const std::size_t vectors = n / 16;
  if (vectors % 4 == 0) {
    ImplicitGemmBf16<4>(image, width, pairs, stride_h, stride_w, out_h, out_w, data, kh, kw, b, n,
                        out);
  } else if (vectors % 2 == 0) {
    ImplicitGemmBf16<2>(image, width, pairs, stride_h, stride_w, out_h, out_w, data, kh, kw, b, n,
                        out);
  } else {
    ImplicitGemmBf16<1>(image, width, pairs, stride_h, stride_w, out_h, out_w, data, kh, kw, b, n,
                        out);
  }
}

/// The weight's pairs, written once per call into the first worker's slice of the workspace,
/// where every worker reads them.
inline std::uint32_t* SharedWeightPairs(const KernelArgs& args, const ConvBf16Layout& layout) {
  return reinterpret_cast<std::uint32_t*>(reinterpret_cast<float*>(args.workspace) +
                                          layout.weights);
}

/// Op::Conv2d (or Op::Conv2dGradInput, which is the convolution of the padded dy with the
/// flipped kernel), channels-last, multiplying in bfloat16: each image converted to bfloat16
/// in the worker's scratch, then the implicit GEMM over pairs of channels.
template <Op op> void ChannelsLastBf16Kernel(const KernelArgs& args) {
  constexpr bool forward = op == Op::Conv2d;
  const ConvGeometry g = conv_geometry(op, args);
  const ConvBf16Layout layout = conv_bf16_layout(op, g);
  const ConvHalo halo = conv_halo(op, g);
  const float* in = args.in[0].f32();
  float* out = args.out.f32();
  // The forward pass reads x (C channels) with the [KH, KW, C, O] weight; the input gradient
  // reads dy (O channels) with the [KH, KW, O, C] weight, its taps flipped.
  const std::size_t depth = forward ? g.c : g.o, width = forward ? g.o : g.c;
  const std::size_t in_h = forward ? g.h : g.oh, in_w = forward ? g.w : g.ow;
  const std::size_t out_h = forward ? g.oh : g.h, out_w = forward ? g.ow : g.w;
  const std::size_t image_in = in_h * in_w * depth, image_out = out_h * out_w * width;
  std::uint32_t* weights = SharedWeightPairs(args, layout);
  WeightPairs(args.in[1].f32(), g.kh * g.kw, depth, width, !forward, weights);
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* result = epilogue.result_target(out + n * image_out, scratch + staging);
    auto* image = reinterpret_cast<std::uint16_t*>(scratch + layout.image);
    ImageToBf16(in + n * image_in, in_h, in_w, halo, image);
    ImplicitGemmBf16AnyWidth(reinterpret_cast<const std::uint32_t*>(image), halo.width, depth / 2,
                             forward ? g.stride_h : 1, forward ? g.stride_w : 1, out_h, out_w,
                             HaloedRows(halo, in_h), g.kh, g.kw, weights, width, result);
    epilogue(n * image_out, (n + 1) * image_out, scratch + layout.total, result);
  });
}

/// The padded image as pairs of values `stride` pixels apart along a row: dst[(row * width +
/// col) * C + c] = (x[row][col][c], x[row][col + stride][c]), zero past the row's end.
KILN_BF16_FUNCTION inline void PixelPairs(const float* HWY_RESTRICT image, std::size_t h,
                                          std::size_t w, const ConvHalo& halo, std::size_t stride,
                                          std::uint32_t* HWY_RESTRICT dst) {
  const std::size_t channels = halo.channels;
  for (std::size_t row = 0; row < halo.height; ++row) {
    for (std::size_t col = 0; col < halo.width; ++col) {
      std::uint32_t* out = dst + (row * halo.width + col) * channels;
      for (std::size_t c = 0; c < channels; c += 16) {
        const std::size_t count = std::min<std::size_t>(16, channels - c);
        const __m512 first = PaddedLoad(image, h, w, halo, row, col, c, count);
        const __m512 second = col + stride < halo.width
                                  ? PaddedLoad(image, h, w, halo, row, col + stride, c, count)
                                  : _mm512_setzero_ps();
        _mm512_mask_storeu_epi32(out + c, FirstLanes16(count), InterleaveToBf16(first, second));
      }
    }
  }
}

/// dy of one image as pairs of neighbouring output pixels of a row: dst[(oh * halves + q) * O
/// + o] = (dy[oh][2q][o], dy[oh][2q + 1][o]), zero for the missing second pixel of an odd row.
KILN_BF16_FUNCTION inline void GradientPairs(const float* HWY_RESTRICT dy, const ConvGeometry& g,
                                             std::uint32_t* HWY_RESTRICT dst) {
  const std::size_t halves = (g.ow + 1) / 2;
  for (std::size_t oh = 0; oh < g.oh; ++oh) {
    for (std::size_t q = 0; q < halves; ++q) {
      const float* first = dy + (oh * g.ow + 2 * q) * g.o;
      const bool has_second = 2 * q + 1 < g.ow;
      std::uint32_t* out = dst + (oh * halves + q) * g.o;
      for (std::size_t o = 0; o < g.o; o += 16) {
        const __m512 second = has_second ? _mm512_loadu_ps(first + g.o + o) : _mm512_setzero_ps();
        _mm512_storeu_si512(out + o, InterleaveToBf16(_mm512_loadu_ps(first + o), second));
      }
    }
  }
}

/// WeightGradTile over pairs of output pixels: partial[rows, 0:NV vectors] += sum over the
/// image's pixel pairs of x-pairs(p)[offset[r]] . dy-pairs[p, 0:NV vectors].
template <std::size_t MR, std::size_t NV>
KILN_BF16_FUNCTION void
WeightGradTileBf16(const std::uint32_t* x_pairs, std::size_t width, const ConvGeometry& g,
                   const std::size_t* offset, std::size_t m,
                   const std::uint32_t* HWY_RESTRICT dy_pairs, float* HWY_RESTRICT partial) {
  __m512 acc[MR][NV];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  std::size_t at[MR];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) at[r] = offset[std::min(r, m - 1)];
  const std::size_t halves = (g.ow + 1) / 2;
  const std::size_t pair_step = 2 * g.stride_w * g.c, row_step = g.stride_h * width * g.c;
  const std::uint32_t* x = x_pairs;
  const std::uint32_t* grad = dy_pairs;
  for (std::size_t q = 0, count = g.oh * halves, half = 0, oh = 0; q < count; ++q) {
    __m512bh bv[NV];
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v)
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(grad + v * 16));
    HWY_UNROLL(16)
    for (std::size_t r = 0; r < MR; ++r) {
      const auto av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[at[r]])));
      HWY_UNROLL(4)
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
    grad += g.o;
    x += pair_step;
    if (++half == halves) {
      half = 0;
      x = x_pairs + ++oh * row_step;
    }
  }
  ForFirstRows<MR>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) {
      float* p = partial + r * g.o + v * 16;
      _mm512_storeu_ps(p, _mm512_add_ps(acc[r][v], _mm512_loadu_ps(p)));
    }
  });
}

/// One image's share of the weight gradient over pixel pairs, added to `partial`.
template <std::size_t NV>
void WeightGradImageBf16(const std::uint32_t* x_pairs, std::size_t width, const ConvGeometry& g,
                         const std::uint32_t* dy_pairs, float* partial) {
  constexpr std::size_t mr = kConvMR<NV>;
  ForEachWeightGradTile<mr>(
      g, width, NV * 16,
      [&](const std::size_t* offset, std::size_t m, std::size_t r0, std::size_t j) {
        WeightGradTileBf16<mr, NV>(x_pairs, width, g, offset, m, dy_pairs + j,
                                   partial + r0 * g.o + j);
      });
}

/// Op::Conv2dGradWeight, channels-last, multiplying in bfloat16: the depth of its GEMM is the
/// output pixels, so each image's x and dy become pairs of neighbouring pixels; the partials
/// are summed as in the FP32 kernel.
inline void Conv2dGradWeightChannelsLastBf16Kernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradWeight, args);
  const ConvBf16Layout layout = conv_bf16_layout(Op::Conv2dGradWeight, g);
  const ConvHalo halo = conv_halo(Op::Conv2dGradWeight, g);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  const std::size_t size = g.o * g.ckk();
  const PartialWeightGradients partials{args, layout.partial, 1};
  const EpilogueRunner epilogue(args);
  const std::size_t vectors = g.o / 16;
  partials.Accumulate(g.batch, size, [&](std::size_t n, float* sum) {
    float* scratch = ThreadScratch(args);
    auto* x_pairs = reinterpret_cast<std::uint32_t*>(scratch + layout.image);
    auto* dy_pairs = reinterpret_cast<std::uint32_t*>(scratch + layout.gradient);
    PixelPairs(x + n * g.h * g.w * g.c, g.h, g.w, halo, g.stride_w, x_pairs);
    GradientPairs(dy + n * g.pixels() * g.o, g, dy_pairs);
    if (vectors % 4 == 0) {
      WeightGradImageBf16<4>(x_pairs, halo.width, g, dy_pairs, sum);
    } else if (vectors % 2 == 0) {
      WeightGradImageBf16<2>(x_pairs, halo.width, g, dy_pairs, sum);
    } else {
      WeightGradImageBf16<1>(x_pairs, halo.width, g, dy_pairs, sum);
    }
  });
  const std::size_t taps = g.kh * g.kw;
  const auto at = [&](std::size_t i) {
    const std::size_t o = i / (g.c * taps), c = i / taps % g.c;
    return (i % taps * g.c + c) * g.o + o;
  };
  partials.SumInto(args.out.f32(), size, at, epilogue, layout.total);
}

/// Puts this target's bfloat16 channels-last convolutions into the table where the CPU runs
/// them.
inline void RegisterChannelsLastBf16ConvKernels(KernelTable& table) {
  if (!Bf16KernelsRun()) return;
  table.add(Op::Conv2d,
            {"conv2d.channels_last.bf16", &ChannelsLastBf16Kernel<Op::Conv2d>,
             &conv_bf16_accepts<Op::Conv2d>, &conv_bf16_workspace<Op::Conv2d>, Precision::bf16});
  table.add(Op::Conv2dGradInput,
            {"conv2d_grad_input.channels_last.bf16", &ChannelsLastBf16Kernel<Op::Conv2dGradInput>,
             &conv_bf16_accepts<Op::Conv2dGradInput>, &conv_bf16_workspace<Op::Conv2dGradInput>,
             Precision::bf16});
  table.add(Op::Conv2dGradWeight,
            {"conv2d_grad_weight.channels_last.bf16", &Conv2dGradWeightChannelsLastBf16Kernel,
             &conv_bf16_accepts<Op::Conv2dGradWeight>, &conv_bf16_workspace<Op::Conv2dGradWeight>,
             Precision::bf16});
}

#else

inline void RegisterChannelsLastBf16ConvKernels(KernelTable&) {}

#endif

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
