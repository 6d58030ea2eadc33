// Per-target channels-last 3x3 stride-1 convolutions in Winograd's F(2x2, 3x3) domain: each 2x2
// block of outputs costs 16 products per (input, output) channel pair instead of 36, paid for
// by transforming the weight once and every 4x4 input patch and 4x4 product once; re-included
// per target.
#if defined(KILN_CPU_CONV_WINOGRAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_WINOGRAD_INL_H_
#undef KILN_CPU_CONV_WINOGRAD_INL_H_
#else
#define KILN_CPU_CONV_WINOGRAD_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>
#include <tbb/parallel_for.h>

#include "kiln/backends/cpu/conv_channels_last-inl.hpp"
#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// u[p][k][n] = (G g G^T)[p] for every (k, n) of the 3x3 kernel g whose tap (i, j) is the
/// depth x width block at taps + tap * depth * width, tap = 3i + j, or 8 - (3i + j) when `flip`
/// (the input gradient's kernel). G's rows are (1, 0, 0), (1, 1, 1)/2, (1, -1, 1)/2, (0, 0, 1).
inline void WinogradWeights(const float* HWY_RESTRICT taps, std::size_t depth, std::size_t width,
                            bool flip, float* HWY_RESTRICT u) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d), plane = depth * width;
  const V half = hn::Set(d, 0.5f);
  for (std::size_t k = 0; k < depth; ++k) {
    for (std::size_t n = 0; n < width; n += lanes) {
      V g[3][3];
      for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 3; ++j) {
          const std::size_t tap = flip ? 8 - (3 * i + j) : 3 * i + j;
          g[i][j] = hn::LoadU(d, taps + tap * plane + k * width + n);
        }
      // G g: four rows of three.
      V t[4][3];
      for (std::size_t j = 0; j < 3; ++j) {
        t[0][j] = g[0][j];
        t[1][j] = hn::Mul(half, hn::Add(hn::Add(g[0][j], g[1][j]), g[2][j]));
        t[2][j] = hn::Mul(half, hn::Add(hn::Sub(g[0][j], g[1][j]), g[2][j]));
        t[3][j] = g[2][j];
      }
      // (G g) G^T: each row of three becomes four.
      for (std::size_t i = 0; i < 4; ++i) {
        float* row = u + 4 * i * plane + k * width + n;
        hn::StoreU(t[i][0], d, row);
        hn::StoreU(hn::Mul(half, hn::Add(hn::Add(t[i][0], t[i][1]), t[i][2])), d, row + plane);
        hn::StoreU(hn::Mul(half, hn::Add(hn::Sub(t[i][0], t[i][1]), t[i][2])), d, row + 2 * plane);
        hn::StoreU(t[i][2], d, row + 3 * plane);
      }
    }
  }
}

/// v[p][0:depth] = (B^T x B)[p] for the 4x4 patch x whose top-left pixel is at `patch` in an
/// image of rows `row` floats long, a vector of channels at a time. B^T's rows are
/// (1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1); `plane` floats lie between the
/// 16 results.
HWY_INLINE void WinogradInputTile(const float* HWY_RESTRICT patch, std::size_t row,
                                  std::size_t depth, float* HWY_RESTRICT v, std::size_t plane) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t c = 0; c < depth; c += lanes) {
    V t[4][4];
    for (std::size_t j = 0; j < 4; ++j) {
      const std::size_t at = j * depth + c;
      const V x0 = hn::LoadU(d, patch + at), x1 = hn::LoadU(d, patch + row + at);
      const V x2 = hn::LoadU(d, patch + 2 * row + at), x3 = hn::LoadU(d, patch + 3 * row + at);
      t[0][j] = hn::Sub(x0, x2);
      t[1][j] = hn::Add(x1, x2);
      t[2][j] = hn::Sub(x2, x1);
      t[3][j] = hn::Sub(x1, x3);
    }
    for (std::size_t i = 0; i < 4; ++i) {
      float* out = v + 4 * i * plane + c;
      hn::StoreU(hn::Sub(t[i][0], t[i][2]), d, out);
      hn::StoreU(hn::Add(t[i][1], t[i][2]), d, out + plane);
      hn::StoreU(hn::Sub(t[i][2], t[i][1]), d, out + 2 * plane);
      hn::StoreU(hn::Sub(t[i][1], t[i][3]), d, out + 3 * plane);
    }
  }
}

/// y = A^T m A for the 16 products m[p][0:width] (`plane` floats apart), a vector of channels
/// at a time, stored to the 2x2 outputs at `out` (rows `row` floats long) that lie inside
/// `rows` x `cols`. A^T's rows are (1, 1, 1, 0) and (0, 1, -1, -1).
HWY_INLINE void WinogradOutputTile(const float* HWY_RESTRICT m, std::size_t plane,
                                   std::size_t width, float* HWY_RESTRICT out, std::size_t row,
                                   std::size_t rows, std::size_t cols) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t c = 0; c < width; c += lanes) {
    V s[2][4];
    for (std::size_t j = 0; j < 4; ++j) {
      const float* at = m + j * plane + c;
      const V m0 = hn::LoadU(d, at), m1 = hn::LoadU(d, at + 4 * plane);
      const V m2 = hn::LoadU(d, at + 8 * plane), m3 = hn::LoadU(d, at + 12 * plane);
      s[0][j] = hn::Add(hn::Add(m0, m1), m2);
      s[1][j] = hn::Sub(hn::Sub(m1, m2), m3);
    }
    for (std::size_t i = 0; i < rows; ++i) {
      float* y = out + i * row + c;
      hn::StoreU(hn::Add(hn::Add(s[i][0], s[i][1]), s[i][2]), d, y);
      if (cols > 1) hn::StoreU(hn::Sub(hn::Sub(s[i][1], s[i][2]), s[i][3]), d, y + width);
    }
  }
}

/// The 16 products of a group of `count` transformed tiles (inputs, [16][group][depth]) with
/// the transformed weight u, into products ([16][group][width]). Kept out of line, so that the
/// GEMM tiles get the registers to themselves (inlined into the transforms, GCC spilled B).
template <std::size_t NV>
HWY_NOINLINE void WinogradProducts(const float* inputs, std::size_t count, const float* u,
                                   std::size_t depth, std::size_t width, float* products) {
  constexpr std::size_t mr = kConvMR<NV>;
  const std::size_t nr = NV * hn::Lanes(GemmTag());
  const std::size_t in_plane = winograd_group * depth, out_plane = winograd_group * width;
  // Each product is a one-tap implicit GEMM: rows of A depth floats apart, read in place.
  const float* rows[mr];
  for (std::size_t p = 0; p < 16; ++p) {
    const TapWalk tap = TapWalk::Dense(1, 1, u + p * depth * width, 0);
    for (std::size_t r0 = 0; r0 < count; r0 += mr) {
      const std::size_t m = std::min(mr, count - r0);
      for (std::size_t r = 0; r < m; ++r) rows[r] = inputs + p * in_plane + (r0 + r) * depth;
      for (std::size_t j = 0; j < width; j += nr) {
        TapWalk at = tap;
        at.b += j;
        ImplicitTile<mr, NV>(rows, m, at, TapRows{0, 1}, depth, width,
                             products + p * out_plane + r0 * width + j, width);
      }
    }
  }
}

/// One image: out (out_h x out_w pixels of `width` channels) from `image` (the input, already
/// inside its halo), the transformed weight u and the worker's scratch, a group of tiles at a
/// time: transform the group's patches, multiply each of the 16 planes by u's, transform back.
template <std::size_t NV>
void WinogradImage(const WinogradShape& s, const float* image, const float* u, float* inputs,
                   float* products, float* out) {
  constexpr std::size_t mr = kConvMR<NV>;
  static_assert(winograd_group % mr == 0, "a group is a whole number of GEMM tiles");
  const std::size_t depth = s.depth, width = s.width;
  const std::size_t row = s.halo.width * depth, in_plane = winograd_group * depth;
  const std::size_t out_plane = winograd_group * width, tiles = s.tiles();
  for (std::size_t t0 = 0; t0 < tiles; t0 += winograd_group) {
    const std::size_t count = std::min(winograd_group, tiles - t0);
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t ty = (t0 + t) / s.tiles_w, tx = (t0 + t) % s.tiles_w;
      WinogradInputTile(image + 2 * ty * row + 2 * tx * depth, row, depth, inputs + t * depth,
                        in_plane);
    }
    WinogradProducts<NV>(inputs, count, u, depth, width, products);
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t ty = (t0 + t) / s.tiles_w, tx = (t0 + t) % s.tiles_w;
      const std::size_t oy = 2 * ty, ox = 2 * tx;
      WinogradOutputTile(products + t * width, out_plane, width, out + (oy * s.out_w + ox) * width,
                         s.out_w * width, std::min<std::size_t>(2, s.out_h - oy),
                         std::min<std::size_t>(2, s.out_w - ox));
    }
  }
}

/// Op::Conv2d, or Op::Conv2dGradInput (the convolution of the padded dy with the flipped
/// kernel), channels-last, 3x3 at stride 1, in the Winograd domain; images in parallel, the
/// epilogue over each image's output while it is in cache.
template <Op op> void WinogradKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(op, args);
  const WinogradShape s = winograd_shape(op, g);
  const WinogradLayout layout = winograd_layout(s);
  const float* in = args.in[0].f32();
  float* out = args.out.f32();
  float* u = reinterpret_cast<float*>(args.workspace) + layout.weights;
  WinogradWeights(args.in[1].f32(), s.depth, s.width, op == Op::Conv2dGradInput, u);
  const std::size_t image_in = s.in_h * s.in_w * s.depth, image_out = s.out_h * s.out_w * s.width;
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  const std::size_t vectors = ConvTileVectors(s.width);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* result = epilogue.result_target(out + n * image_out, scratch + staging);
    const float* image = in + n * image_in;
    if (s.padded()) {
      PadImage(image, s.in_h, s.in_w, s.halo, scratch + layout.image);
      image = scratch + layout.image;
    }
    float* inputs = scratch + layout.inputs;
    float* products = scratch + layout.products;
    if (vectors == 4) {
      WinogradImage<4>(s, image, u, inputs, products, result);
    } else if (vectors == 2) {
      WinogradImage<2>(s, image, u, inputs, products, result);
    } else {
      WinogradImage<1>(s, image, u, inputs, products, result);
    }
    epilogue(n * image_out, (n + 1) * image_out, scratch + layout.total, result);
  });
}

/// Puts this target's Winograd convolutions into the table.
inline void RegisterWinogradConvKernels(KernelTable& table) {
  table.add(Op::Conv2d, {"conv2d.winograd", &WinogradKernel<Op::Conv2d>,
                         &winograd_accepts<Op::Conv2d>, &winograd_workspace<Op::Conv2d>});
  table.add(Op::Conv2dGradInput,
            {"conv2d_grad_input.winograd", &WinogradKernel<Op::Conv2dGradInput>,
             &winograd_accepts<Op::Conv2dGradInput>, &winograd_workspace<Op::Conv2dGradInput>});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
