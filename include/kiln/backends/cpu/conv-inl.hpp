// Per-target 2-D convolution kernels (forward, grad-input, grad-weight) as per-image im2col +
// GEMM; re-included once per Highway target by implementation.hpp.
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

#include "kiln/backends/cpu/gemm-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Where one row of the column matrix, (channel, kernel row, kernel column), reads its image.
struct ColRow {
  const float* channel; // the input channel's H x W plane
  std::ptrdiff_t kh, kw;
};

inline ColRow ColRowOf(const ConvGeometry& g, const float* image, std::size_t row) {
  const std::size_t kw = row % g.kw, kh = row / g.kw % g.kh, c = row / (g.kw * g.kh);
  return {image + c * g.h * g.w, static_cast<std::ptrdiff_t>(kh), static_cast<std::ptrdiff_t>(kw)};
}

/// Range [lo, hi) of output columns ow in [0, count) whose input column ow * stride - pad + k
/// lies inside [0, size).
inline void ValidRange(std::ptrdiff_t stride, std::ptrdiff_t pad, std::ptrdiff_t k,
                       std::ptrdiff_t size, std::ptrdiff_t count, std::ptrdiff_t& lo,
                       std::ptrdiff_t& hi) {
  const std::ptrdiff_t first = pad - k; // ow * stride >= first
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const std::ptrdiff_t last = size - 1 + pad - k; // ow * stride <= last
  hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, count);
  hi = std::clamp(hi, lo, count);
}

/// Writes row `row` of one image's column matrix, for output pixels [p0, p1), to
/// dst[(p - p0) * step]; taps that fall into the zero padding write 0.
inline void Im2colSpan(const ConvGeometry& g, const float* image, std::size_t row, std::size_t p0,
                       std::size_t p1, float* HWY_RESTRICT dst, std::size_t step) {
  const ColRow src = ColRowOf(g, image, row);
  const auto sh = static_cast<std::ptrdiff_t>(g.stride_h), sw = static_cast<std::ptrdiff_t>(g.stride_w);
  const auto ph = static_cast<std::ptrdiff_t>(g.pad_h), pw = static_cast<std::ptrdiff_t>(g.pad_w);
  const auto h = static_cast<std::ptrdiff_t>(g.h), w = static_cast<std::ptrdiff_t>(g.w);
  std::ptrdiff_t lo = 0, hi = 0;
  ValidRange(sw, pw, src.kw, w, static_cast<std::ptrdiff_t>(g.ow), lo, hi);
  std::size_t oh = p0 / g.ow, ow = p0 % g.ow;
  for (std::size_t p = p0; p < p1; ++oh, ow = 0) {
    const std::size_t run = std::min(p1 - p, g.ow - ow);
    const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(oh) * sh - ph + src.kh;
    const auto begin = static_cast<std::ptrdiff_t>(ow), end = begin + static_cast<std::ptrdiff_t>(run);
    if (ih < 0 || ih >= h) {
      for (std::size_t i = 0; i < run; ++i) dst[i * step] = 0.0f;
    } else {
      // Output column c reads in_row[c * sw + offset]; zero outside [lo, hi).
      const float* in_row = src.channel + ih * w;
      const std::ptrdiff_t offset = src.kw - pw;
      const std::ptrdiff_t vlo = std::clamp(lo, begin, end), vhi = std::clamp(hi, vlo, end);
      const auto at = [&](std::ptrdiff_t c) -> float& {
        return dst[static_cast<std::size_t>(c - begin) * step];
      };
      for (std::ptrdiff_t c = begin; c < vlo; ++c) at(c) = 0.0f;
      if (step == 1 && sw == 1) {
        for (std::ptrdiff_t c = vlo; c < vhi; ++c) dst[c - begin] = in_row[c + offset];
      } else {
        for (std::ptrdiff_t c = vlo; c < vhi; ++c) at(c) = in_row[c * sw + offset];
      }
      for (std::ptrdiff_t c = vhi; c < end; ++c) at(c) = 0.0f;
    }
    dst += run * step;
    p += run;
  }
}

/// Builds one image's column matrix (ckk x pixels) directly in GemmB's pre-packed layout, so
/// the forward GEMM reads it without a second copy.
inline void PackColumns(const ConvGeometry& g, const float* image, float* HWY_RESTRICT dst) {
  const std::size_t nr = GemmNR(), ckk = g.ckk(), pixels = g.pixels();
  for (std::size_t p0 = 0; p0 < pixels; p0 += nr) {
    const std::size_t p1 = std::min(pixels, p0 + nr);
    for (std::size_t row = 0; row < ckk; ++row, dst += nr) {
      Im2colSpan(g, image, row, p0, p1, dst, 1);
      std::fill(dst + (p1 - p0), dst + nr, 0.0f);
    }
  }
}

/// Builds the transpose of one image's column matrix (pixels x ckk) in GemmB's pre-packed
/// layout, the B operand of dW += dy · col^T.
inline void PackColumnsTransposed(const ConvGeometry& g, const float* image,
                                  float* HWY_RESTRICT dst) {
  const std::size_t nr = GemmNR(), ckk = g.ckk(), pixels = g.pixels();
  // Pixels in chunks so the destination block (chunk x NR floats) stays in L1.
  constexpr std::size_t chunk = 32;
  for (std::size_t j0 = 0; j0 < ckk; j0 += nr, dst += pixels * nr) {
    for (std::size_t p0 = 0; p0 < pixels; p0 += chunk) {
      const std::size_t p1 = std::min(pixels, p0 + chunk);
      for (std::size_t jj = 0; jj < nr; ++jj) {
        float* out = dst + p0 * nr + jj;
        if (j0 + jj < ckk) {
          Im2colSpan(g, image, j0 + jj, p0, p1, out, nr);
        } else {
          for (std::size_t p = p0; p < p1; ++p, out += nr) *out = 0.0f;
        }
      }
    }
  }
}

/// dx += col2im(dcol) for one image: every column-matrix entry is added back onto the input
/// pixel it was read from.
inline void Col2imAdd(const ConvGeometry& g, const float* HWY_RESTRICT dcol, float* HWY_RESTRICT dx) {
  const auto sh = static_cast<std::ptrdiff_t>(g.stride_h), sw = static_cast<std::ptrdiff_t>(g.stride_w);
  const auto ph = static_cast<std::ptrdiff_t>(g.pad_h), pw = static_cast<std::ptrdiff_t>(g.pad_w);
  const auto h = static_cast<std::ptrdiff_t>(g.h), w = static_cast<std::ptrdiff_t>(g.w);
  const std::size_t ckk = g.ckk(), pixels = g.pixels();
  for (std::size_t row = 0; row < ckk; ++row) {
    const std::size_t kw = row % g.kw, kh = row / g.kw % g.kh, c = row / (g.kw * g.kh);
    float* plane = dx + c * g.h * g.w;
    const float* src = dcol + row * pixels;
    std::ptrdiff_t lo = 0, hi = 0;
    ValidRange(sw, pw, static_cast<std::ptrdiff_t>(kw), w, static_cast<std::ptrdiff_t>(g.ow), lo, hi);
    for (std::size_t oh = 0; oh < g.oh; ++oh, src += g.ow) {
      const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(oh) * sh - ph + static_cast<std::ptrdiff_t>(kh);
      if (ih < 0 || ih >= h) continue;
      float* out_row = plane + ih * w;
      const std::ptrdiff_t offset = static_cast<std::ptrdiff_t>(kw) - pw;
      if (sw == 1) {
        for (std::ptrdiff_t c2 = lo; c2 < hi; ++c2) out_row[c2 + offset] += src[c2];
      } else {
        for (std::ptrdiff_t c2 = lo; c2 < hi; ++c2) out_row[c2 * sw + offset] += src[c2];
      }
    }
  }
}

/// Op::Conv2d: y[n] = W · im2col(x[n]) per image, images in parallel.
inline void Conv2dKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2d, args);
  const ConvLayout layout = conv_layout(Op::Conv2d, g);
  const float* x = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* y = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels();
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* col = scratch + layout.col;
    PackColumns(g, x + n * g.c * g.h * g.w, col);
    const GemmB b{MatRef{}, col, ckk};
    Gemm(g.o, pixels, ckk, MatRef{w, ckk, 1}, b, y + n * g.o * pixels, pixels, false,
         scratch + layout.pack_a, nullptr);
  });
}

/// Op::Conv2dGradInput: dx[n] = col2im(W^T · dy[n]) per image, images in parallel.
inline void Conv2dGradInputKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradInput, g);
  const float* dy = args.in[0].f32();
  const float* w = args.in[1].f32();
  float* dx = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), image = g.c * g.h * g.w;
  // W^T: element (ckk row, output channel) of the row-major [O, ckk] weight.
  const MatRef wt{w, 1, ckk};
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    const GemmB b{MatRef{dy + n * g.o * pixels, pixels, 1}};
    float* dxn = dx + n * image;
    if (g.pointwise()) {
      Gemm(ckk, pixels, g.o, wt, b, dxn, pixels, false, scratch + layout.pack_a,
           scratch + layout.pack_b);
      return;
    }
    float* dcol = scratch + layout.col;
    Gemm(ckk, pixels, g.o, wt, b, dcol, pixels, false, scratch + layout.pack_a,
         scratch + layout.pack_b);
    std::fill_n(dxn, image, 0.0f);
    Col2imAdd(g, dcol, dxn);
  });
}

/// Op::Conv2dGradWeight: dW = sum_n dy[n] · im2col(x[n])^T. Each thread accumulates its images
/// into its own partial dW in the workspace; the partials are summed at the end.
inline void Conv2dGradWeightKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradWeight, args);
  const ConvLayout layout = conv_layout(Op::Conv2dGradWeight, g);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dw = args.out.f32();
  const std::size_t ckk = g.ckk(), pixels = g.pixels(), size = g.o * ckk;
  const auto slices = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  const std::size_t slice_floats = args.workspace_per_thread / sizeof(float);
  const auto partial = [&](std::size_t t) {
    return reinterpret_cast<float*>(args.workspace) + t * slice_floats + layout.partial;
  };
  if (g.batch == 0 || pixels == 0) {
    std::fill_n(dw, size, 0.0f);
    return;
  }
  for (std::size_t t = 0; t < slices; ++t) std::fill_n(partial(t), size, 0.0f);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* col = scratch + layout.col;
    PackColumnsTransposed(g, x + n * g.c * g.h * g.w, col);
    const GemmB b{MatRef{}, col, pixels};
    Gemm(g.o, ckk, pixels, MatRef{dy + n * g.o * pixels, pixels, 1}, b,
         scratch + layout.partial, ckk, true, scratch + layout.pack_a, nullptr);
  });
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, size, 4096),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t i = r.begin(); i < r.end(); ++i) {
                        float sum = 0.0f;
                        for (std::size_t t = 0; t < slices; ++t) sum += partial(t)[i];
                        dw[i] = sum;
                      }
                    });
}

inline void RegisterConvKernels(KernelTable& table) {
  table.run[op_index(Op::Conv2d)] = &Conv2dKernel;
  table.run[op_index(Op::Conv2dGradInput)] = &Conv2dGradInputKernel;
  table.run[op_index(Op::Conv2dGradWeight)] = &Conv2dGradWeightKernel;
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
