// Per-target channels-last 3x3 stride-1 convolutions in the Winograd domain: forward and input
// gradient in F(2x2, 3x3), where each 2x2 block of outputs costs 16 products per (input, output)
// channel pair instead of 36, or in F(4x4, 3x3), 36 per 4x4 block instead of 144 (see
// winograd_tile), paid for by transforming the weight once and every input patch and block of
// products once; the weight gradient in F(3x3, 2x2), the 3x3 kernel from each 4x4 patch and
// the 2x2 tile of dy under it, 16 products instead of 36. Re-included per target.
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
#include "kiln/backends/cpu/weight_gradient_partials-inl.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// g[i][j] = the vector at taps + tap * plane for tap 3i + j of a 3x3 kernel, or 8 - (3i + j)
/// when `flip` (the input gradient's kernel, rotated).
template <class V>
HWY_INLINE void LoadKernel3x3(const float* HWY_RESTRICT taps, std::size_t plane, bool flip,
                              V (&g)[3][3]) {
  const hn::DFromV<V> d;
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      g[i][j] = hn::LoadU(d, taps + (flip ? 8 - (3 * i + j) : 3 * i + j) * plane);
}

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
      LoadKernel3x3(taps + k * width + n, plane, flip, g);
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

/// WinogradWeights for F(4x4, 3x3): u[p][k][n] = (G g G^T)[p] over 36 planes. G's rows are
/// (1/4, 0, 0), -(1, 1, 1)/6, -(1, -1, 1)/6, (1/24, 1/12, 1/6), (1/24, -1/12, 1/6), (0, 0, 1).
inline void WinogradWeights4(const float* HWY_RESTRICT taps, std::size_t depth, std::size_t width,
                             bool flip, float* HWY_RESTRICT u) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d), plane = depth * width;
  const V quarter = hn::Set(d, 0.25f), sixth = hn::Set(d, 1.0f / 6.0f);
  const V twelfth = hn::Set(d, 1.0f / 12.0f), twenty_fourth = hn::Set(d, 1.0f / 24.0f);
  // G applied to three values: six.
  const auto transform = [&](V g0, V g1, V g2, V(&t)[6]) {
    const V outer = hn::Add(g0, g2);
    const V far = hn::MulAdd(g0, twenty_fourth, hn::Mul(g2, sixth));
    t[0] = hn::Mul(g0, quarter);
    t[1] = hn::Neg(hn::Mul(hn::Add(outer, g1), sixth));
    t[2] = hn::Mul(hn::Sub(g1, outer), sixth);
    t[3] = hn::MulAdd(g1, twelfth, far);
    t[4] = hn::NegMulAdd(g1, twelfth, far);
    t[5] = g2;
  };
  for (std::size_t k = 0; k < depth; ++k) {
    for (std::size_t n = 0; n < width; n += lanes) {
      V g[3][3];
      LoadKernel3x3(taps + k * width + n, plane, flip, g);
      V columns[3][6];
      for (std::size_t j = 0; j < 3; ++j) transform(g[0][j], g[1][j], g[2][j], columns[j]);
      for (std::size_t i = 0; i < 6; ++i) {
        V t[6];
        transform(columns[0][i], columns[1][i], columns[2][i], t);
        float* row = u + 6 * i * plane + k * width + n;
        for (std::size_t j = 0; j < 6; ++j) hn::StoreU(t[j], d, row + j * plane);
      }
    }
  }
}

/// B^T applied to six values of F(4x4, 3x3): B^T's rows are (4, 0, -5, 0, 1, 0),
/// (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0),
/// (0, 4, 0, -5, 0, 1).
template <class V> HWY_INLINE void WinogradInput6(const V (&x)[6], V (&t)[6]) {
  const hn::DFromV<V> d;
  const V four = hn::Set(d, 4.0f), five = hn::Set(d, 5.0f), two = hn::Set(d, 2.0f);
  const V a = hn::NegMulAdd(four, x[2], x[4]), b = hn::NegMulAdd(four, x[1], x[3]);
  const V c = hn::Sub(x[4], x[2]), e = hn::Mul(two, hn::Sub(x[3], x[1]));
  t[0] = hn::MulAdd(four, x[0], hn::NegMulAdd(five, x[2], x[4]));
  t[1] = hn::Add(a, b);
  t[2] = hn::Sub(a, b);
  t[3] = hn::Add(c, e);
  t[4] = hn::Sub(c, e);
  t[5] = hn::MulAdd(four, x[1], hn::NegMulAdd(five, x[3], x[5]));
}

/// WinogradInputTile for F(4x4, 3x3): v[p][0:depth] = (B^T x B)[p] for the 6x6 patch x. Its
/// 36 intermediate vectors fill the register file, so it runs out of line, where the group's
/// loop state does not compete for registers with them (3-5% faster than inline).
inline HWY_NOINLINE void WinogradInputTile4(const float* HWY_RESTRICT patch, std::size_t row,
                                            std::size_t depth, float* HWY_RESTRICT v,
                                            std::size_t plane) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t c = 0; c < depth; c += lanes) {
    V t[6][6];
    for (std::size_t j = 0; j < 6; ++j) {
      V x[6], column[6];
      for (std::size_t i = 0; i < 6; ++i) x[i] = hn::LoadU(d, patch + i * row + j * depth + c);
      WinogradInput6(x, column);
      for (std::size_t i = 0; i < 6; ++i) t[i][j] = column[i];
    }
    for (std::size_t i = 0; i < 6; ++i) {
      V out[6];
      WinogradInput6(t[i], out);
      for (std::size_t j = 0; j < 6; ++j) hn::StoreU(out[j], d, v + (6 * i + j) * plane + c);
    }
  }
}

/// v[p][0:depth] = (B^T x B)[p] for the 4x4 patch x whose top-left pixel is at `patch` in an
/// image of rows `row` floats long, a vector of channels at a time. B^T's rows are
/// (1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0) and, for F(2x2, 3x3), (0, 1, 0, -1); the weight
/// gradient's F(3x3, 2x2) negates the last. `plane` floats lie between the 16 results.
template <Op op>
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
      t[3][j] = op == Op::Conv2dGradWeight ? hn::Sub(x3, x1) : hn::Sub(x1, x3);
    }
    for (std::size_t i = 0; i < 4; ++i) {
      float* out = v + 4 * i * plane + c;
      hn::StoreU(hn::Sub(t[i][0], t[i][2]), d, out);
      hn::StoreU(hn::Add(t[i][1], t[i][2]), d, out + plane);
      hn::StoreU(hn::Sub(t[i][2], t[i][1]), d, out + 2 * plane);
      hn::StoreU(op == Op::Conv2dGradWeight ? hn::Sub(t[i][3], t[i][1]) : hn::Sub(t[i][1], t[i][3]),
                 d, out + 3 * plane);
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

/// A^T applied to six values of F(4x4, 3x3): A^T's rows are (1, 1, 1, 1, 1, 0),
/// (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1).
template <class V> HWY_INLINE void WinogradOutput6(const V (&m)[6], V (&y)[4]) {
  const hn::DFromV<V> d;
  const V a = hn::Add(m[1], m[2]), b = hn::Sub(m[1], m[2]);
  const V c = hn::Add(m[3], m[4]), e = hn::Sub(m[3], m[4]);
  y[0] = hn::Add(hn::Add(m[0], a), c);
  y[1] = hn::MulAdd(hn::Set(d, 2.0f), e, b);
  y[2] = hn::MulAdd(hn::Set(d, 4.0f), c, a);
  y[3] = hn::Add(hn::MulAdd(hn::Set(d, 8.0f), e, b), m[5]);
}

/// WinogradOutputTile for F(4x4, 3x3): the 4x4 outputs A^T m A from 36 products, stored where
/// they lie inside `rows` x `cols`. Out of line, as WinogradInputTile4.
inline HWY_NOINLINE void WinogradOutputTile4(const float* HWY_RESTRICT m, std::size_t plane,
                                             std::size_t width, float* HWY_RESTRICT out,
                                             std::size_t row, std::size_t rows, std::size_t cols) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t c = 0; c < width; c += lanes) {
    V s[4][6];
    for (std::size_t j = 0; j < 6; ++j) {
      V column[6], y[4];
      for (std::size_t i = 0; i < 6; ++i) column[i] = hn::LoadU(d, m + (6 * i + j) * plane + c);
      WinogradOutput6(column, y);
      for (std::size_t i = 0; i < 4; ++i) s[i][j] = y[i];
    }
    for (std::size_t i = 0; i < rows; ++i) {
      V y[4];
      WinogradOutput6(s[i], y);
      for (std::size_t j = 0; j < cols; ++j) hn::StoreU(y[j], d, out + i * row + j * width + c);
    }
  }
}

/// One GEMM tile of WinogradProducts. The two-vector tile runs out of line: inlined into the
/// loops below, GCC kept one of its accumulators on the stack (the tile took 1.25x as long); the
/// one- and four-vector tiles run faster inline.
template <std::size_t MR, std::size_t NV>
HWY_NOINLINE void WinogradPlaneTileOutOfLine(const float* const* rows, std::size_t m,
                                             const TapWalk& at, std::size_t depth,
                                             std::size_t width, float* c) {
  ImplicitTile<MR, NV>(rows, m, at, TapRows{0, 1}, depth, width, c, width);
}

template <std::size_t MR, std::size_t NV>
HWY_INLINE void WinogradPlaneTile(const float* const* rows, std::size_t m, const TapWalk& at,
                                  std::size_t depth, std::size_t width, float* c) {
  if constexpr (NV == 2) {
    WinogradPlaneTileOutOfLine<MR, NV>(rows, m, at, depth, width, c);
  } else {
    ImplicitTile<MR, NV>(rows, m, at, TapRows{0, 1}, depth, width, c, width);
  }
}

/// The products of a group of `count` transformed tiles (inputs, [planes][group][depth]) with
/// the transformed weight u, into products ([planes][group][width]). Kept out of line, so that
/// the GEMM tiles get the registers to themselves (inlined into the transforms, GCC spilled B).
template <std::size_t NV>
HWY_NOINLINE void WinogradProducts(const float* inputs, std::size_t count, const float* u,
                                   std::size_t planes, std::size_t depth, std::size_t width,
                                   float* products) {
  constexpr std::size_t mr = kConvMR<NV>;
  const std::size_t nr = NV * hn::Lanes(GemmTag());
  const std::size_t in_plane = winograd_group * depth, out_plane = winograd_group * width;
  // Each product is a one-tap implicit GEMM: rows of A depth floats apart, read in place.
  const float* rows[mr];
  for (std::size_t p = 0; p < planes; ++p) {
    const TapWalk tap = TapWalk::Dense(1, 1, u + p * depth * width, 0);
    for (std::size_t r0 = 0; r0 < count; r0 += mr) {
      const std::size_t m = std::min(mr, count - r0);
      for (std::size_t r = 0; r < m; ++r) rows[r] = inputs + p * in_plane + (r0 + r) * depth;
      for (std::size_t j = 0; j < width; j += nr) {
        TapWalk at = tap;
        at.b += j;
        WinogradPlaneTile<mr, NV>(rows, m, at, depth, width,
                                  products + p * out_plane + r0 * width + j);
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
  const std::size_t out_plane = winograd_group * width, tiles = s.tiles(), m = s.tile;
  for (std::size_t t0 = 0; t0 < tiles; t0 += winograd_group) {
    const std::size_t count = std::min(winograd_group, tiles - t0);
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t ty = (t0 + t) / s.tiles_w, tx = (t0 + t) % s.tiles_w;
      const float* patch = image + m * (ty * row + tx * depth);
      if (m == 4) {
        WinogradInputTile4(patch, row, depth, inputs + t * depth, in_plane);
      } else {
        WinogradInputTile<Op::Conv2d>(patch, row, depth, inputs + t * depth, in_plane);
      }
    }
    WinogradProducts<NV>(inputs, count, u, s.planes(), depth, width, products);
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t ty = (t0 + t) / s.tiles_w, tx = (t0 + t) % s.tiles_w;
      const std::size_t oy = m * ty, ox = m * tx;
      float* at = out + (oy * s.out_w + ox) * width;
      const std::size_t rows = std::min(m, s.out_h - oy), cols = std::min(m, s.out_w - ox);
      if (m == 4) {
        WinogradOutputTile4(products + t * width, out_plane, width, at, s.out_w * width, rows,
                            cols);
      } else {
        WinogradOutputTile(products + t * width, out_plane, width, at, s.out_w * width, rows, cols);
      }
    }
  }
}

/// The image the 4x4 patches are read from: `image` in place, or copied into its halo in
/// `scratch` where WinogradShape::padded says it needs one.
inline const float* WinogradPatches(const WinogradShape& s, const float* image, float* scratch) {
  if (!s.padded()) return image;
  PadImage(image, s.in_h, s.in_w, s.halo, scratch);
  return scratch;
}

/// Op::Conv2d, or Op::Conv2dGradInput (the convolution of the padded dy with the flipped
/// kernel), channels-last, 3x3 at stride 1, in the Winograd domain; images in parallel, the
/// epilogue over each image's output while it is in cache.
template <Op op> void WinogradKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(op, args);
  const WinogradShape s = winograd_shape(op, g);
  const WinogradLayout layout = winograd_layout(op, s);
  const float* in = args.in[0].f32();
  float* out = args.out.f32();
  float* u = reinterpret_cast<float*>(args.workspace) + layout.weights;
  if (s.tile == 4) {
    WinogradWeights4(args.in[1].f32(), s.depth, s.width, op == Op::Conv2dGradInput, u);
  } else {
    WinogradWeights(args.in[1].f32(), s.depth, s.width, op == Op::Conv2dGradInput, u);
  }
  const std::size_t image_in = s.in_h * s.in_w * s.depth, image_out = s.out_h * s.out_w * s.width;
  const EpilogueRunner epilogue(args);
  const std::size_t staging = layout.total + epilogue_floats(args.attrs);
  const std::size_t vectors = ConvTileVectors(s.width);
  tbb::parallel_for(std::size_t{0}, g.batch, [&](std::size_t n) {
    float* scratch = ThreadScratch(args);
    float* result = epilogue.result_target(out + n * image_out, scratch + staging);
    const float* image = WinogradPatches(s, in + n * image_in, scratch + layout.image);
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

/// u[p][0:width] = (G y G^T)[p] for the 2x2 tile y of dy at `tile` (rows `row` floats long),
/// of which `rows` x `cols` lie inside dy and the rest count as zero. G's rows are (1, 0),
/// (1, 1)/2, (1, -1)/2, (0, 1); `plane` floats lie between the 16 results.
HWY_INLINE void WinogradGradientTile(const float* HWY_RESTRICT tile, std::size_t row,
                                     std::size_t rows, std::size_t cols, std::size_t width,
                                     float* HWY_RESTRICT u, std::size_t plane) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  const V half = hn::Set(d, 0.5f), zero = hn::Zero(d);
  for (std::size_t c = 0; c < width; c += lanes) {
    const V y00 = hn::LoadU(d, tile + c);
    const V y01 = cols > 1 ? hn::LoadU(d, tile + width + c) : zero;
    const V y10 = rows > 1 ? hn::LoadU(d, tile + row + c) : zero;
    const V y11 = rows > 1 && cols > 1 ? hn::LoadU(d, tile + row + width + c) : zero;
    // G y: four rows of two.
    const V t[4][2] = {{y00, y01},
                       {hn::Mul(half, hn::Add(y00, y10)), hn::Mul(half, hn::Add(y01, y11))},
                       {hn::Mul(half, hn::Sub(y00, y10)), hn::Mul(half, hn::Sub(y01, y11))},
                       {y10, y11}};
    // (G y) G^T: each row of two becomes four.
    for (std::size_t i = 0; i < 4; ++i) {
      float* out = u + 4 * i * plane + c;
      hn::StoreU(t[i][0], d, out);
      hn::StoreU(hn::Mul(half, hn::Add(t[i][0], t[i][1])), d, out + plane);
      hn::StoreU(hn::Mul(half, hn::Sub(t[i][0], t[i][1])), d, out + 2 * plane);
      hn::StoreU(t[i][1], d, out + 3 * plane);
    }
  }
}

/// Rows (input channels) of the weight gradient's GEMM tiles: 8 divides every channel count
/// the Winograd kernels take, and 8 x 2 vectors of accumulators leave AVX-512 registers for the
/// loads.
inline constexpr std::size_t kWinogradWeightMR = 8;

/// Whether the weight gradient's tiles may be two vectors wide: not where 16 accumulators
/// would fill the register file (AVX2's 16 registers; GCC then kept them on the stack).
inline constexpr bool kWinogradWeightTwoVectors = 2 * kWinogradWeightMR <= kConvAccumulators;

/// partial[c, 0 : NV vectors] += sum over t < count of v[t][c] * u[t][0 : NV vectors] for the
/// kWinogradWeightMR channels c from `v`: one tile of one of the 16 products, summed over a
/// group of tiles (rows of v `depth` floats apart, of u and partial `width`).
template <std::size_t NV>
HWY_INLINE void WinogradWeightTile(const float* HWY_RESTRICT v, std::size_t depth,
                                   const float* HWY_RESTRICT u, std::size_t width,
                                   std::size_t count, float* HWY_RESTRICT partial) {
  constexpr std::size_t mr = kWinogradWeightMR;
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d);
  V acc[mr][NV];
  ZeroAccumulators(acc);
  for (std::size_t t = 0; t < count; ++t, v += depth, u += width) MultiplyAddRank1(acc, v, u);
  HWY_UNROLL(8)
  for (std::size_t r = 0; r < mr; ++r) {
    HWY_UNROLL(4)
    for (std::size_t j = 0; j < NV; ++j) {
      float* p = partial + r * width + j * lanes;
      hn::StoreU(hn::Add(acc[r][j], hn::LoadU(d, p)), d, p);
    }
  }
}

/// partial[p] += v[p]^T u[p] for the 16 products of a group of `count` tiles (v: the
/// transformed patches of x, [16][group][depth]; u: of dy, [16][group][width]). Out of line,
/// as WinogradProducts.
template <std::size_t NV>
HWY_NOINLINE void WinogradWeightProducts(const float* v, const float* u, std::size_t count,
                                         std::size_t depth, std::size_t width, float* partial) {
  const std::size_t nr = NV * hn::Lanes(GemmTag());
  const std::size_t v_plane = winograd_group * depth, u_plane = winograd_group * width;
  for (std::size_t p = 0; p < 16; ++p)
    for (std::size_t c = 0; c < depth; c += kWinogradWeightMR)
      for (std::size_t j = 0; j < width; j += nr)
        WinogradWeightTile<NV>(v + p * v_plane + c, depth, u + p * u_plane + j, width, count,
                               partial + (p * depth + c) * width + j);
}

/// One image's share of the weight gradient, in the Winograd domain, added to `partial`
/// ([16][depth][width]): the patches of `image` (x inside its halo) under each 2x2 tile of
/// dy, and the tile, both transformed a group of tiles at a time, then multiplied.
template <std::size_t NV>
void WinogradWeightImage(const WinogradShape& s, const float* image, const float* dy, float* inputs,
                         float* gradients, float* partial) {
  const std::size_t depth = s.depth, width = s.width;
  const std::size_t row = s.halo.width * depth, dy_row = s.out_w * width;
  const std::size_t v_plane = winograd_group * depth, u_plane = winograd_group * width;
  const std::size_t tiles = s.tiles();
  for (std::size_t t0 = 0; t0 < tiles; t0 += winograd_group) {
    const std::size_t count = std::min(winograd_group, tiles - t0);
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t ty = (t0 + t) / s.tiles_w, tx = (t0 + t) % s.tiles_w;
      WinogradInputTile<Op::Conv2dGradWeight>(image + 2 * ty * row + 2 * tx * depth, row, depth,
                                              inputs + t * depth, v_plane);
      WinogradGradientTile(
          dy + 2 * ty * dy_row + 2 * tx * width, dy_row, std::min<std::size_t>(2, s.out_h - 2 * ty),
          std::min<std::size_t>(2, s.out_w - 2 * tx), width, gradients + t * width, u_plane);
    }
    WinogradWeightProducts<NV>(inputs, gradients, count, depth, width, partial);
  }
}

/// kernel[tap][c][0:width] = A^T m A over m[p] = the sum, in slot order, of every worker's
/// partial[p][c] (`slices` of them, `slice_floats` apart from `first`): the 3x3 weight
/// gradient of channel c. A^T's rows for F(3x3, 2x2) are (1, 1, 1, 0), (0, 1, -1, 0),
/// (0, 1, 1, 1).
inline void WinogradWeightKernelRow(const float* first, std::size_t slices,
                                    std::size_t slice_floats, std::size_t c, std::size_t depth,
                                    std::size_t width, float* HWY_RESTRICT kernel) {
  const GemmTag d;
  using V = hn::Vec<GemmTag>;
  const std::size_t lanes = hn::Lanes(d), plane = depth * width;
  for (std::size_t o = 0; o < width; o += lanes) {
    V m[16];
    for (std::size_t p = 0; p < 16; ++p) {
      const float* at = first + p * plane + c * width + o;
      m[p] = hn::LoadU(d, at);
      for (std::size_t t = 1; t < slices; ++t)
        m[p] = hn::Add(m[p], hn::LoadU(d, at + t * slice_floats));
    }
    V s[3][4];
    for (std::size_t j = 0; j < 4; ++j) {
      s[0][j] = hn::Add(hn::Add(m[j], m[4 + j]), m[8 + j]);
      s[1][j] = hn::Sub(m[4 + j], m[8 + j]);
      s[2][j] = hn::Add(hn::Add(m[4 + j], m[8 + j]), m[12 + j]);
    }
    for (std::size_t i = 0; i < 3; ++i) {
      float* out = kernel + 3 * i * plane + c * width + o;
      hn::StoreU(hn::Add(hn::Add(s[i][0], s[i][1]), s[i][2]), d, out);
      hn::StoreU(hn::Sub(s[i][1], s[i][2]), d, out + plane);
      hn::StoreU(hn::Add(hn::Add(s[i][1], s[i][2]), s[i][3]), d, out + 2 * plane);
    }
  }
}

/// Op::Conv2dGradWeight, channels-last, 3x3 at stride 1, in the Winograd domain: each run of
/// images summed into its worker's [16][C][O] partial (PartialWeightGradients' fixed split),
/// the partials added in slot order and transformed back to [3][3][C][O], then written to the
/// OIHW dW with the epilogue over each block.
inline void WinogradWeightGradientKernel(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradWeight, args);
  const WinogradShape s = winograd_shape(Op::Conv2dGradWeight, g);
  const WinogradLayout layout = winograd_layout(Op::Conv2dGradWeight, s);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  const std::size_t image_in = s.in_h * s.in_w * s.depth, image_out = s.out_h * s.out_w * s.width;
  const PartialWeightGradients partials{args, layout.partial, 1};
  const bool two_vectors = ConvTileVectors(s.width) >= 2;
  partials.Accumulate(g.batch, 16 * s.depth * s.width, [&](std::size_t n, float* sum) {
    float* scratch = ThreadScratch(args);
    const float* image = WinogradPatches(s, x + n * image_in, scratch + layout.image);
    float* inputs = scratch + layout.inputs;
    float* gradients = scratch + layout.products;
    if constexpr (kWinogradWeightTwoVectors) {
      if (two_vectors) {
        WinogradWeightImage<2>(s, image, dy + n * image_out, inputs, gradients, sum);
        return;
      }
    }
    WinogradWeightImage<1>(s, image, dy + n * image_out, inputs, gradients, sum);
  });
  float* kernel = reinterpret_cast<float*>(args.workspace) + layout.kernel;
  tbb::parallel_for(std::size_t{0}, s.depth, [&](std::size_t c) {
    WinogradWeightKernelRow(partials.slice(0), partials.slices,
                            args.workspace_per_worker / sizeof(float), c, s.depth, s.width, kernel);
  });
  // dW[o, c, tap] sits at (tap * C + c) * O + o in the kernel.
  const std::size_t taps = 9, size = g.o * g.c * taps;
  const auto at = [&](std::size_t i) {
    const std::size_t o = i / (g.c * taps), c = i / taps % g.c;
    return (i % taps * g.c + c) * g.o + o;
  };
  const PartialWeightGradients transformed{args, layout.kernel, 1, 1};
  transformed.SumInto(args.out.f32(), size, at, EpilogueRunner(args), layout.total);
}

/// Puts this target's Winograd convolutions into the table.
inline void RegisterWinogradConvKernels(KernelTable& table) {
  table.add(Op::Conv2d, {"conv2d.winograd", &WinogradKernel<Op::Conv2d>,
                         &winograd_accepts<Op::Conv2d>, &winograd_workspace<Op::Conv2d>});
  table.add(Op::Conv2dGradInput,
            {"conv2d_grad_input.winograd", &WinogradKernel<Op::Conv2dGradInput>,
             &winograd_accepts<Op::Conv2dGradInput>, &winograd_workspace<Op::Conv2dGradInput>});
  table.add(Op::Conv2dGradWeight,
            {"conv2d_grad_weight.winograd", &WinogradWeightGradientKernel,
             &winograd_accepts<Op::Conv2dGradWeight>, &winograd_workspace<Op::Conv2dGradWeight>});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
