// Per-target channels-last input gradients that scatter each dy pixel over its window, for
// input channels too few to fill the channels-last kernels' vectors (LeNet-5's 6): the vectors
// run along a kernel row's (column, channel) run of dx instead, and no product meets the
// padding that the convolution-of-dy form multiplies. Re-included per target.
#if defined(KILN_CPU_CONV_SCATTER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_SCATTER_INL_H_
#undef KILN_CPU_CONV_SCATTER_INL_H_
#else
#define KILN_CPU_CONV_SCATTER_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>
#include <tbb/parallel_for.h>

#include "kiln/backends/cpu/conv_channels_last-inl.hpp"
#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/float_runs-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// The most vectors of a run one tile keeps in registers; longer runs go in pieces.
inline constexpr std::size_t kScatterVectors = 4;

/// Pixels per scatter tile when its runs take NV vectors: as many accumulators as the
/// channels-last tiles keep.
template <std::size_t NV>
inline constexpr std::size_t
    kScatterPixels = std::max<std::size_t>(1, std::min(scatter_max_pixels, kConvAccumulators / NV));

/// dst[r][0 : NV vectors] += sum over k < depth of pixels[k * P + r] * w[k * ldw + 0 : NV
/// vectors], for the first m of P pixels (the others repeat one of them and are not stored).
/// Out of line: inlined into ScatterImage's loops, GCC kept the weight vectors on the stack.
template <std::size_t P, std::size_t NV>
HWY_NOINLINE void ScatterTile(const float* HWY_RESTRICT pixels, std::size_t m, std::size_t depth,
                              const float* HWY_RESTRICT w, std::size_t ldw, float* const* dst) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[P][NV];
  ZeroAccumulators(acc);
  for (std::size_t k = 0; k < depth; ++k, pixels += P, w += ldw) MultiplyAddRank1(acc, pixels, w);
  ForFirstRows<P>(m, [&](std::size_t r) HWY_ATTR {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) {
      float* at = dst[r] + v * lanes;
      hn::StoreU(hn::Add(hn::LoadU(d, at), acc[r][v]), d, at);
    }
  });
}

/// runs[(i * O + o) * run_floats + j * C + c] = w[i, j, o, c] for the [KH, KW, O, C] weight;
/// the floats past each run stay zero, so a run's last vector adds nothing past its end.
inline void ScatterWeights(const ConvGeometry& g, const ScatterShape& s, const float* w,
                           float* runs) {
  ZeroFloats(runs, g.kh * g.o * s.run_floats);
  for (std::size_t i = 0; i < g.kh; ++i)
    for (std::size_t j = 0; j < g.kw; ++j)
      for (std::size_t o = 0; o < g.o; ++o)
        CopyFloats(runs + (i * g.o + o) * s.run_floats + j * g.c,
                   w + ((i * g.kw + j) * g.o + o) * g.c, g.c);
}

/// Adds every dy pixel of one image times each kernel row's runs into the padded dx. A tile
/// takes P pixels down one column of dy: their windows' rows lie stride_h apart, so for one
/// kernel row no two of them add into the same floats.
template <std::size_t NV>
void ScatterImage(const ConvGeometry& g, const ScatterShape& s, const float* dy, const float* runs,
                  float* pixels, float* padded) {
  constexpr std::size_t P = kScatterPixels<NV>;
  const std::size_t lanes = hn::Lanes(GemmTag());
  const std::size_t vectors = (s.run + lanes - 1) / lanes;
  const std::size_t row_floats = s.cols * g.c;
  float* dst[P];
  for (std::size_t ox = 0; ox < g.ow; ++ox) {
    for (std::size_t oy = 0; oy < g.oh; oy += P) {
      const std::size_t m = std::min(P, g.oh - oy);
      for (std::size_t r = 0; r < P; ++r) {
        const float* pixel = dy + ((oy + std::min(r, m - 1)) * g.ow + ox) * g.o;
        for (std::size_t k = 0; k < g.o; ++k) pixels[k * P + r] = pixel[k];
      }
      for (std::size_t i = 0; i < g.kh; ++i) {
        const float* row_runs = runs + i * g.o * s.run_floats;
        for (std::size_t v = 0; v < vectors; v += NV) {
          for (std::size_t r = 0; r < m; ++r)
            dst[r] = padded + ((oy + r) * g.stride_h + i) * row_floats + ox * g.stride_w * g.c +
                     v * lanes;
          const float* w = row_runs + v * lanes;
          switch (std::min(NV, vectors - v)) {
          case 4:
            ScatterTile<P, 4 <= NV ? 4 : NV>(pixels, m, g.o, w, s.run_floats, dst);
            break;
          case 3:
            ScatterTile<P, 3 <= NV ? 3 : NV>(pixels, m, g.o, w, s.run_floats, dst);
            break;
          case 2:
            ScatterTile<P, 2 <= NV ? 2 : NV>(pixels, m, g.o, w, s.run_floats, dst);
            break;
          default:
            ScatterTile<P, 1>(pixels, m, g.o, w, s.run_floats, dst);
            break;
          }
        }
      }
    }
  }
}

/// dx[n] = the padded dx without its padding; rows and columns a stride left uncovered are 0.
inline void UnpadScatter(const ConvGeometry& g, const ScatterShape& s, const float* padded,
                         float* dx) {
  const std::size_t inside = g.pad_w < s.cols ? std::min(g.w, s.cols - g.pad_w) : 0;
  for (std::size_t i = 0; i < g.h; ++i, dx += g.w * g.c) {
    const std::size_t row = i + g.pad_h;
    const std::size_t copied = row < s.rows ? inside : 0;
    if (copied > 0) CopyFloats(dx, padded + (row * s.cols + g.pad_w) * g.c, copied * g.c);
    if (copied < g.w) ZeroFloats(dx + copied * g.c, (g.w - copied) * g.c);
  }
}

/// Op::Conv2dGradInput, channels-last, for few input channels: dx[n] = sum over dy[n]'s
/// pixels p and kernel rows i of dy[n][p] times the weight's [KW, C] run for row i, added at
/// p's window. Images in parallel, each into its own padded copy of dx, then the epilogue
/// over it while it is in cache.
inline void Conv2dGradInputScatterKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, args);
  const ScatterShape s = scatter_shape(g);
  const ScatterLayout layout = scatter_layout(g);
  float* runs = reinterpret_cast<float*>(args.workspace) + layout.weights;
  ScatterWeights(g, s, args.in[1].f32(), runs);
  const float* dy = args.in[0].f32();
  float* dx = args.out.f32();
  const std::size_t image = g.h * g.w * g.c, lanes = hn::Lanes(GemmTag());
  const std::size_t vectors = std::min(kScatterVectors, (s.run + lanes - 1) / lanes);
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* dxn = epilogue.result_target(dx + n * image, scratch + staging);
    const float* dyn = dy + n * g.pixels() * g.o;
    float* padded = scratch + layout.image;
    ZeroFloats(padded, s.floats(g.c) + s.run_floats - s.run);
    float* pixels = scratch + layout.pixels;
    if (vectors == 4) {
      ScatterImage<4>(g, s, dyn, runs, pixels, padded);
    } else if (vectors == 3) {
      ScatterImage<3>(g, s, dyn, runs, pixels, padded);
    } else if (vectors == 2) {
      ScatterImage<2>(g, s, dyn, runs, pixels, padded);
    } else {
      ScatterImage<1>(g, s, dyn, runs, pixels, padded);
    }
    UnpadScatter(g, s, padded, dxn);
    epilogue(n * image, (n + 1) * image, scratch + layout.total, dxn);
  });
}

/// Puts this target's scatter input gradient into the table.
inline void RegisterScatterConvKernels(KernelTable& table) {
  table.add(Op::Conv2dGradInput, {"conv2d_grad_input.scatter", &Conv2dGradInputScatterKernel,
                                  &scatter_accepts, &scatter_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
