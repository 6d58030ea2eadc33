// Per-target conv2d kernels and their gradients as per-image im2col + GEMM; re-included per target.
#if defined(KILN_CPU_CONV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_INL_H_
#undef KILN_CPU_CONV_INL_H_
#else
#define KILN_CPU_CONV_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kiln/backends/cpu/conv_shifted_rows-inl.hpp"
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

/// One row of the column matrix: the tap (input channel, kernel row, kernel column) it
/// stands for. Output column ow reads input column ow * stride_w + offset, which is inside
/// the image for ow in [lo, hi) and in the zero padding elsewhere.
struct Tap {
  std::size_t plane; // offset of the channel's H x W plane in the image
  std::ptrdiff_t kh, offset, lo, hi;
};

inline Tap TapOf(const ConvGeometry& g, std::size_t row) {
  const auto kw = static_cast<std::ptrdiff_t>(row % g.kw);
  const std::size_t kh = row / g.kw % g.kh, c = row / (g.kw * g.kh);
  const auto stride = static_cast<std::ptrdiff_t>(g.stride_w);
  const auto pad = static_cast<std::ptrdiff_t>(g.pad_w);
  const auto ow = static_cast<std::ptrdiff_t>(g.ow), w = static_cast<std::ptrdiff_t>(g.w);
  // ow * stride + offset in [0, w)  <=>  ow in [ceil(-offset / stride), floor((w - 1 - offset) /
  // stride)].
  const std::ptrdiff_t offset = kw - pad;
  const std::ptrdiff_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const std::ptrdiff_t hi = w - 1 - offset < 0 ? 0 : (w - 1 - offset) / stride + 1;
  return {c * g.h * g.w, static_cast<std::ptrdiff_t>(kh), offset, std::min(lo, ow),
          std::clamp(hi, std::min(lo, ow), ow)};
}

/// The input row that output row oh of this tap reads, or -1 when it is padding.
inline std::ptrdiff_t InputRow(const ConvGeometry& g, const Tap& tap, std::size_t oh) {
  const std::ptrdiff_t ih =
      static_cast<std::ptrdiff_t>(oh * g.stride_h) - static_cast<std::ptrdiff_t>(g.pad_h) + tap.kh;
  return ih >= 0 && ih < static_cast<std::ptrdiff_t>(g.h) ? ih : -1;
}

/// Writes output columns [a, b) of one output row of a tap to out[0, b - a): the input row
/// `in` (nullptr for a padding row) read at the tap's columns, zero where they are padding.
HWY_INLINE void EmitTapRow(const Tap& tap, std::ptrdiff_t stride, const float* in, std::ptrdiff_t a,
                           std::ptrdiff_t b, float* HWY_RESTRICT out) {
  const auto count = [](std::ptrdiff_t from, std::ptrdiff_t to) {
    return static_cast<std::size_t>(to - from);
  };
  if (in == nullptr) {
    ZeroFloats(out, count(a, b));
    return;
  }
  const std::ptrdiff_t lo = std::clamp(tap.lo, a, b), hi = std::clamp(tap.hi, lo, b);
  ZeroFloats(out, count(a, lo));
  if (stride == 1) {
    if (hi > lo) CopyFloats(out + (lo - a), in + (lo + tap.offset), count(lo, hi));
  } else {
    for (std::ptrdiff_t c = lo; c < hi; ++c) out[c - a] = in[c * stride + tap.offset];
  }
  ZeroFloats(out + (hi - a), count(hi, b));
}

/// Output pixel p as (output row, output column); computed once per block of pixels, since
/// the divisions cost more than copying a short row.
struct PixelPos {
  std::size_t oh, ow;
};

inline PixelPos PixelPosOf(const ConvGeometry& g, std::size_t p) { return {p / g.ow, p % g.ow}; }

/// Writes `count` entries of one row of an image's column matrix to dst, output pixels from
/// `start` on.
inline void Im2colRow(const ConvGeometry& g, const float* image, const Tap& tap, PixelPos start,
                      std::size_t count, float* HWY_RESTRICT dst) {
  const float* plane = image + tap.plane;
  const auto stride = static_cast<std::ptrdiff_t>(g.stride_w);
  // The common case, a tap that never reads horizontal padding at stride 1, is a plain copy.
  const bool plain = stride == 1 && tap.lo == 0 && tap.hi == static_cast<std::ptrdiff_t>(g.ow);
  for (std::size_t oh = start.oh, ow = start.ow; count > 0; ++oh, ow = 0) {
    const std::size_t n = std::min(count, g.ow - ow);
    const std::ptrdiff_t ih = InputRow(g, tap, oh);
    const float* in = ih < 0 ? nullptr : plane + static_cast<std::size_t>(ih) * g.w;
    if (plain && in != nullptr) {
      CopyFloats(dst, in + (tap.offset + static_cast<std::ptrdiff_t>(ow)), n);
    } else {
      EmitTapRow(tap, stride, in, static_cast<std::ptrdiff_t>(ow),
                 static_cast<std::ptrdiff_t>(ow + n), dst);
    }
    dst += n;
    count -= n;
  }
}

/// Builds one image's column matrix (ckk x pixels) directly in GemmB's pre-packed layout, so
/// the forward GEMM reads it without a second copy.
inline void PackColumns(const ConvGeometry& g, const float* image, float* HWY_RESTRICT dst) {
  const std::size_t nr = GemmNR(), ckk = g.ckk(), pixels = g.pixels();
  for (std::size_t row = 0; row < ckk; ++row) {
    const Tap tap = TapOf(g, row);
    PixelPos start{0, 0};
    float* out = dst + row * nr;
    for (std::size_t p0 = 0; p0 < pixels; p0 += nr, out += ckk * nr) {
      const std::size_t n = std::min(nr, pixels - p0);
      Im2colRow(g, image, tap, start, n, out);
      if (n < nr) ZeroFloats(out + n, nr - n);
      for (start.ow += n; start.ow >= g.ow; start.ow -= g.ow) ++start.oh;
    }
  }
}

/// Builds the transpose of one image's column matrix (pixels x ckk) in GemmB's pre-packed
/// layout, the B operand of dW += dy · col^T: plain column-matrix rows for a block of pixels
/// go to `rows` (max_nr x conv_pixel_chunk floats), then are transposed into place.
inline void PackColumnsTransposed(const ConvGeometry& g, const float* image,
                                  float* HWY_RESTRICT dst, float* HWY_RESTRICT rows) {
  const std::size_t nr = GemmNR(), ckk = g.ckk(), pixels = g.pixels();
  constexpr std::size_t chunk = conv_pixel_chunk;
  Tap taps[gemm_blocking::max_nr];
  for (std::size_t j0 = 0; j0 < ckk; j0 += nr, dst += pixels * nr) {
    const std::size_t cols = std::min(nr, ckk - j0);
    for (std::size_t j = 0; j < cols; ++j) taps[j] = TapOf(g, j0 + j);
    for (std::size_t p0 = 0; p0 < pixels; p0 += chunk) {
      const std::size_t n = std::min(chunk, pixels - p0);
      const PixelPos start = PixelPosOf(g, p0);
      for (std::size_t j = 0; j < cols; ++j) {
        Im2colRow(g, image, taps[j], start, n, rows + j * chunk);
      }
      float* out = dst + p0 * nr;
      PackColumnsOfB(rows, chunk, n, n, cols, out, nr);
      if (cols < nr) {
        for (std::size_t k = 0; k < n; ++k) ZeroFloats(out + k * nr + cols, nr - cols);
      }
    }
  }
}

/// dx += col2im(dcol) for one image: every column-matrix entry is added back onto the input
/// pixel it was read from.
inline void Col2imAdd(const ConvGeometry& g, const float* HWY_RESTRICT dcol,
                      float* HWY_RESTRICT dx) {
  const auto stride = static_cast<std::ptrdiff_t>(g.stride_w);
  const std::size_t ckk = g.ckk(), pixels = g.pixels();
  for (std::size_t row = 0; row < ckk; ++row) {
    const Tap tap = TapOf(g, row);
    if (tap.hi <= tap.lo) continue;
    float* plane = dx + tap.plane;
    const float* src = dcol + row * pixels;
    for (std::size_t oh = 0; oh < g.oh; ++oh, src += g.ow) {
      const std::ptrdiff_t ih = InputRow(g, tap, oh);
      if (ih < 0) continue;
      float* in = plane + static_cast<std::size_t>(ih) * g.w;
      if (stride == 1) {
        AddFloats(in + (tap.lo + tap.offset), src + tap.lo,
                  static_cast<std::size_t>(tap.hi - tap.lo));
      } else {
        for (std::ptrdiff_t c = tap.lo; c < tap.hi; ++c) in[c * stride + tap.offset] += src[c];
      }
    }
  }
}

/// Op::Conv2d: y[n] = W · im2col(x[n]) per image, images in parallel; the epilogue runs
/// over each image's output while it is in cache.
inline void Conv2dKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2d, args);
  const ConvLayout layout = conv_layout(Op::Conv2d, g, ConvAlgorithm::columns);
  const float* x = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* y = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), image = g.o * pixels;
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* col = scratch + layout.col;
    float* yn = epilogue.result_target(y + n * image, scratch + staging);
    PackColumns(g, x + n * g.c * g.h * g.w, col);
    const GemmB b{MatRef{}, col, ckk};
    Gemm(g.o, pixels, ckk, MatRef{w, ckk, 1}, b, yn, pixels, false, nullptr, nullptr);
    epilogue(n * image, (n + 1) * image, scratch + layout.total, yn);
  });
}

/// Op::Conv2dGradInput: dx[n] = col2im(W^T · dy[n]) per image, images in parallel; the
/// epilogue (typically the previous relu's gradient mask) runs over each finished image.
inline void Conv2dGradInputKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradInput, g, ConvAlgorithm::columns);
  const float* dy = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* dx = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), image = g.c * g.h * g.w;
  // W^T: element (ckk row, output channel) of the row-major [O, ckk] weight.
  const MatRef wt{w, 1, ckk};
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    const GemmB b{MatRef{dy + n * g.o * pixels, pixels, 1}};
    float* dxn = epilogue.result_target(dx + n * image, scratch + staging);
    if (g.pointwise()) {
      Gemm(ckk, pixels, g.o, wt, b, dxn, pixels, false, scratch + layout.pack_a,
           scratch + layout.pack_b);
    } else {
      float* dcol = scratch + layout.col;
      Gemm(ckk, pixels, g.o, wt, b, dcol, pixels, false, scratch + layout.pack_a,
           scratch + layout.pack_b);
      std::fill_n(dxn, image, 0.0f);
      Col2imAdd(g, dcol, dxn);
    }
    epilogue(n * image, (n + 1) * image, scratch + layout.total, dxn);
  });
}

/// Fraction of the micro-tiles' lanes doing useful work in an m x n GEMM output.
inline double TileUse(std::size_t m, std::size_t n) {
  if (m == 0 || n == 0) return 0.0;
  const std::size_t nr = GemmNR();
  const auto round_up = [](std::size_t v, std::size_t unit) {
    return (v + unit - 1) / unit * unit;
  };
  return static_cast<double>(m * n) / static_cast<double>(round_up(m, kGemmMR) * round_up(n, nr));
}

/// Op::Conv2dGradWeight: dW = sum_n dy[n] · im2col(x[n])^T. Each run of images accumulates
/// into its own partial dW in the workspace; the partials are summed at the end. When there
/// are few taps (a strided first layer: 9 for a 3x3 kernel on one channel), the GEMM is turned
/// around to dW^T = col · dy^T, so that the taps fill tile rows instead of wide tile columns.
/// The epilogue (typically the optimizer update) runs over each block of the summed dW.
inline void Conv2dGradWeightKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradWeight, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradWeight, g, ConvAlgorithm::columns);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dw = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), size = g.o * ckk;
  const PartialWeightGradients partials{args, layout.partial, 1};
  const EpilogueRunner epilogue(args);
  if (g.batch == 0 || pixels == 0) {
    std::fill_n(dw, size, 0.0f);
    epilogue(0, size, ThreadScratch(args) + layout.total);
    return;
  }
  const bool by_taps = TileUse(ckk, g.o) > TileUse(g.o, ckk);
  partials.Accumulate(g.batch, size, [&](std::size_t n, float* partial) {
    float* scratch = ThreadScratch(args);
    float* col = scratch + layout.col;
    const float* image = x + n * g.c * g.h * g.w;
    const float* dyn = dy + n * g.o * pixels;
    if (by_taps) {
      for (std::size_t row = 0; row < ckk; ++row) {
        Im2colRow(g, image, TapOf(g, row), PixelPos{0, 0}, pixels, col + row * pixels);
      }
      Gemm(ckk, g.o, pixels, MatRef{col, pixels, 1}, GemmB{MatRef{dyn, 1, pixels}}, partial, g.o,
           true, nullptr, scratch + layout.pack_b);
      return;
    }
    PackColumnsTransposed(g, image, col, scratch + layout.rows);
    Gemm(g.o, ckk, pixels, MatRef{dyn, pixels, 1}, GemmB{MatRef{}, col, pixels}, partial, ckk, true,
         nullptr, nullptr);
  });
  // Element (o, tap) of dW sits at tap * O + o in a turned-around partial.
  const auto at = [&](std::size_t i) { return by_taps ? i % ckk * g.o + i / ckk : i; };
  partials.SumInto(dw, size, at, epilogue, layout.total);
}

/// Puts this target's column-matrix convolutions into the table.
inline void RegisterConvKernels(KernelTable& table) {
  using A = ConvAlgorithm;
  table.add(Op::Conv2d, {"conv2d.columns", &Conv2dKernel, &conv_accepts<Op::Conv2d, A::columns>,
                         &conv_workspace<Op::Conv2d, A::columns>});
  table.add(Op::Conv2dGradInput, {"conv2d_grad_input.columns", &Conv2dGradInputKernel,
                                  &conv_accepts<Op::Conv2dGradInput, A::columns>,
                                  &conv_workspace<Op::Conv2dGradInput, A::columns>});
  table.add(Op::Conv2dGradWeight, {"conv2d_grad_weight.columns", &Conv2dGradWeightKernel,
                                   &conv_accepts<Op::Conv2dGradWeight, A::columns>,
                                   &conv_workspace<Op::Conv2dGradWeight, A::columns>});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
