// CUDA pooling kernels, max and average, with their gradients: each reads and writes NCHW or
// channels-last, and average pooling may also read one layout and write the other.
#pragma once

#include <cstdint>
#include <variant>

#include <cuda_runtime.h>

#include "kiln/backends/cuda/launch.cuh"
#include "kiln/ops/scalar_math.hpp"

namespace kiln::cuda {

namespace pool_detail {

/// One pooling call in a form both layouts share: element (group, ih, iw, lane) of x lives at
/// ((group * h + ih) * w + iw) * lanes + lane, and likewise in y over (oh, ow). NCHW has N*C
/// groups of one lane; channels-last has N groups of C lanes, so consecutive threads walk the
/// contiguous channels. Passed to kernels by value.
struct PoolGeometry {
  std::int64_t groups = 0, lanes = 1, h = 0, w = 0, oh = 0, ow = 0;
  std::int64_t k = 1, s = 1, p = 0;
};

/// `x` is the unpooled tensor (x, or dx), `y` the pooled one (y, or dy).
inline PoolGeometry pool_geometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  PoolGeometry g;
  if (a.channels_last) {
    g.groups = x[0];
    g.lanes = x[3];
    g.h = x[1];
    g.w = x[2];
    g.oh = y[1];
    g.ow = y[2];
  } else {
    g.groups = x[0] * x[1];
    g.h = x[2];
    g.w = x[3];
    g.oh = y[2];
    g.ow = y[3];
  }
  g.k = a.kernel;
  g.s = a.stride;
  g.p = a.padding;
  return g;
}

/// A half-open range [lo, hi).
struct Range {
  std::int64_t lo, hi;
};

/// Taps [lo, hi) of a window starting at `origin` that lie inside [0, extent): padding is
/// skipped, never read (it is -inf for max, 0 for the average's sum).
__device__ inline Range window_taps(std::int64_t origin, std::int64_t k, std::int64_t extent) {
  return {origin < 0 ? -origin : 0, extent - origin < k ? extent - origin : k};
}

/// Windows [lo, hi) along one axis whose taps include input coordinate `at`: window o covers
/// o*s - p .. o*s - p + k - 1.
__device__ inline Range covering_windows(std::int64_t at, std::int64_t k, std::int64_t s,
                                         std::int64_t p, std::int64_t outputs) {
  const std::int64_t last = at + p; // >= 0: o*s <= last
  const std::int64_t first = last - k + 1;
  const std::int64_t lo = first <= 0 ? 0 : (first + s - 1) / s;
  const std::int64_t hi = last / s + 1;
  return {lo, hi < outputs ? hi : outputs};
}

/// Splits a flat index over (group, row, col, lane) with `rows` x `cols` per group.
template <bool channels_last> struct Coordinates {
  std::int64_t group, row, col, lane;
  __device__ Coordinates(std::int64_t i, std::int64_t rows, std::int64_t cols, std::int64_t lanes) {
    lane = 0;
    if constexpr (channels_last) {
      lane = i % lanes;
      i /= lanes;
    }
    col = i % cols;
    i /= cols;
    row = i % rows;
    group = i / rows;
  }
};

/// Element stride between neighbouring pixels: 1 in NCHW, C channels-last.
template <bool channels_last> __device__ inline std::int64_t pixel_stride(const PoolGeometry& g) {
  if constexpr (channels_last) return g.lanes;
  return 1;
}

/// The pixel (ih * w + iw) of the first maximum of window (oh, ow) of one group and lane, -1
/// when no tap is inside the input. Like the CPU kernels and the reference, the first in-bound
/// tap in row-major order holds until a later tap is strictly greater: ties go to the first,
/// a NaN first tap keeps the gradient, later NaNs never take it.
template <bool channels_last>
__device__ inline std::int64_t first_max_pixel(const float* __restrict__ xg, const PoolGeometry& g,
                                               std::int64_t oh, std::int64_t ow) {
  const std::int64_t ih0 = oh * g.s - g.p, iw0 = ow * g.s - g.p;
  const Range kh = window_taps(ih0, g.k, g.h), kw = window_taps(iw0, g.k, g.w);
  std::int64_t arg = -1;
  float best = 0.0f;
  for (std::int64_t i = kh.lo; i < kh.hi; ++i)
    for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
      const std::int64_t pixel = (ih0 + i) * g.w + iw0 + j;
      const float v = xg[pixel * pixel_stride<channels_last>(g)];
      if (arg < 0 || v > best) {
        best = v;
        arg = pixel;
      }
    }
  return arg;
}

/// y = the max of each window, one thread per output element. The max starts at -inf and
/// takes each tap through max_keeping_nan, as the CPU kernels: a NaN tap makes the window's
/// max NaN.
template <bool channels_last>
__global__ void maxpool_kernel(const float* __restrict__ x, float* __restrict__ y, PoolGeometry g,
                               std::int64_t n) {
  const std::int64_t step = pixel_stride<channels_last>(g);
  KILN_CUDA_FOR_EACH(i, n) {
    const Coordinates<channels_last> o(i, g.oh, g.ow, g.lanes);
    const float* xg = x + o.group * g.h * g.w * g.lanes + o.lane;
    const std::int64_t ih0 = o.row * g.s - g.p, iw0 = o.col * g.s - g.p;
    const Range kh = window_taps(ih0, g.k, g.h), kw = window_taps(iw0, g.k, g.w);
    float acc = -__int_as_float(0x7f800000);
    for (std::int64_t r = kh.lo; r < kh.hi; ++r)
      for (std::int64_t c = kw.lo; c < kw.hi; ++c)
        acc = max_keeping_nan(acc, xg[((ih0 + r) * g.w + iw0 + c) * step]);
    y[i] = acc;
  }
}

/// dx of max pooling, one thread per dx element: the dy of every window that covers it and
/// whose first maximum it is, added in (oh, ow) order as the CPU kernels add them.
template <bool channels_last>
__global__ void maxpool_grad_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                    float* __restrict__ dx, PoolGeometry g, std::int64_t n) {
  const std::int64_t step = pixel_stride<channels_last>(g);
  KILN_CUDA_FOR_EACH(i, n) {
    const Coordinates<channels_last> e(i, g.h, g.w, g.lanes);
    const float* xg = x + e.group * g.h * g.w * g.lanes + e.lane;
    const float* dyg = dy + e.group * g.oh * g.ow * g.lanes + e.lane;
    const std::int64_t me = e.row * g.w + e.col;
    const Range rows = covering_windows(e.row, g.k, g.s, g.p, g.oh);
    const Range cols = covering_windows(e.col, g.k, g.s, g.p, g.ow);
    float acc = 0.0f;
    for (std::int64_t oh = rows.lo; oh < rows.hi; ++oh)
      for (std::int64_t ow = cols.lo; ow < cols.hi; ++ow)
        if (first_max_pixel<channels_last>(xg, g, oh, ow) == me)
          acc += dyg[(oh * g.ow + ow) * step];
    dx[i] = acc;
  }
}

/// dx of max pooling with 2x2 windows, stride 2, no padding, where dx may be x's memory: one
/// thread per 2x2 block of dx reads its four x values before writing its four dx values, and
/// no other thread touches them (windows tile the plane). Blocks past the last window (the
/// last row and column of an odd plane) are zeroed. Hence no __restrict__ on x and dx.
template <bool channels_last>
__global__ void maxpool_grad_tiled_kernel(const float* x, const float* __restrict__ dy, float* dx,
                                          PoolGeometry g, std::int64_t block_rows,
                                          std::int64_t block_cols, std::int64_t n) {
  const std::int64_t step = pixel_stride<channels_last>(g);
  KILN_CUDA_FOR_EACH(i, n) {
    const Coordinates<channels_last> b(i, block_rows, block_cols, g.lanes);
    const std::int64_t base = b.group * g.h * g.w * g.lanes + b.lane;
    const std::int64_t a0 = base + (2 * b.row * g.w + 2 * b.col) * step, a1 = a0 + step;
    const std::int64_t b0 = a0 + g.w * step, b1 = b0 + step;
    if (b.row < g.oh && b.col < g.ow) {
      const float v[4] = {x[a0], x[a1], x[b0], x[b1]};
      int which = 0;
      for (int t = 1; t < 4; ++t)
        if (v[t] > v[which]) which = t;
      const float grad =
          dy[b.group * g.oh * g.ow * g.lanes + (b.row * g.ow + b.col) * step + b.lane];
      dx[a0] = which == 0 ? grad : 0.0f;
      dx[a1] = which == 1 ? grad : 0.0f;
      dx[b0] = which == 2 ? grad : 0.0f;
      dx[b1] = which == 3 ? grad : 0.0f;
    } else {
      const bool right = 2 * b.col + 1 < g.w, below = 2 * b.row + 1 < g.h;
      dx[a0] = 0.0f;
      if (right) dx[a1] = 0.0f;
      if (below) dx[b0] = 0.0f;
      if (right && below) dx[b1] = 0.0f;
    }
  }
}

/// The sizes of one average pooling call, whatever the layouts: x (or dx) is N x C x h x w,
/// y (or dy) N x C x oh x ow. Passed to kernels by value.
struct AvgPoolSizes {
  std::int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  std::int64_t k = 1, s = 1, p = 0;
};

/// An element's coordinates, whatever the layout it is stored in.
struct Element {
  std::int64_t n, c, row, col;
};

/// One N x C x rows x cols tensor stored NCHW or, channels_last, NHWC. In both layouts element
/// (n, c, row, col) lies at plane(n, c) + (row * cols + col) * pixel_step(), so a window's
/// taps are read the same way whichever layout the tensor has.
template <bool channels_last> struct PoolLayout {
  std::int64_t channels, rows, cols;

  /// The offset of element (n, c, 0, 0).
  __device__ std::int64_t plane(std::int64_t n, std::int64_t c) const {
    if constexpr (channels_last) return n * rows * cols * channels + c;
    return (n * channels + c) * rows * cols;
  }
  /// The distance between horizontally neighbouring elements of one plane.
  __device__ std::int64_t pixel_step() const {
    if constexpr (channels_last) return channels;
    return 1;
  }
  /// The coordinates of the element at offset `i`.
  __device__ Element element(std::int64_t i) const {
    Element e{};
    if constexpr (channels_last) {
      e.c = i % channels;
      i /= channels;
    }
    e.col = i % cols;
    i /= cols;
    e.row = i % rows;
    i /= rows;
    if constexpr (!channels_last) {
      e.c = i % channels;
      i /= channels;
    }
    e.n = i;
    return e;
  }
};

/// y = the mean of each window, one thread per y element so that writes stay coalesced
/// whatever the layouts (x is read in its own layout, strided when it differs from y's). The
/// mean is the sum of the in-bound taps in row-major order times 1/(k*k); with `pair_sums`
/// (2x2 windows, where the CPU adds horizontal pairs first) it is (a0 + a1) + (b0 + b1)
/// instead, for the same rounding.
template <bool x_channels_last, bool y_channels_last>
__global__ void avgpool_kernel(const float* __restrict__ x, float* __restrict__ y, AvgPoolSizes z,
                               std::int64_t count, bool pair_sums, float scale) {
  const PoolLayout<x_channels_last> xl{z.c, z.h, z.w};
  const PoolLayout<y_channels_last> yl{z.c, z.oh, z.ow};
  const std::int64_t step = xl.pixel_step();
  KILN_CUDA_FOR_EACH(i, count) {
    const Element o = yl.element(i);
    const float* xp = x + xl.plane(o.n, o.c);
    const std::int64_t ih0 = o.row * z.s - z.p, iw0 = o.col * z.s - z.p;
    float acc = 0.0f;
    if (pair_sums) {
      const float* top = xp + (ih0 * z.w + iw0) * step;
      const float* bottom = top + z.w * step;
      acc = (top[0] + top[step]) + (bottom[0] + bottom[step]);
    } else {
      const Range kh = window_taps(ih0, z.k, z.h), kw = window_taps(iw0, z.k, z.w);
      for (std::int64_t r = kh.lo; r < kh.hi; ++r)
        for (std::int64_t c = kw.lo; c < kw.hi; ++c) acc += xp[((ih0 + r) * z.w + iw0 + c) * step];
    }
    y[i] = acc * scale;
  }
}

/// dx of average pooling, one thread per dx element, each reading dy in dy's layout: dy *
/// (1/(k*k)) of every window covering it, added in (oh, ow) order as the CPU kernel adds
/// them. __fmul_rn keeps nvcc from fusing the product into the sum: the CPU rounds the
/// product before adding it.
template <bool dx_channels_last, bool dy_channels_last>
__global__ void avgpool_grad_kernel(const float* __restrict__ dy, float* __restrict__ dx,
                                    AvgPoolSizes z, std::int64_t count, float scale) {
  const PoolLayout<dx_channels_last> dxl{z.c, z.h, z.w};
  const PoolLayout<dy_channels_last> dyl{z.c, z.oh, z.ow};
  const std::int64_t step = dyl.pixel_step();
  KILN_CUDA_FOR_EACH(i, count) {
    const Element e = dxl.element(i);
    const float* dyp = dy + dyl.plane(e.n, e.c);
    const Range rows = covering_windows(e.row, z.k, z.s, z.p, z.oh);
    const Range cols = covering_windows(e.col, z.k, z.s, z.p, z.ow);
    float acc = 0.0f;
    for (std::int64_t oh = rows.lo; oh < rows.hi; ++oh)
      for (std::int64_t ow = cols.lo; ow < cols.hi; ++ow)
        acc += __fmul_rn(dyp[(oh * z.ow + ow) * step], scale);
    dx[i] = acc;
  }
}

/// `x` is the unpooled tensor (x, or dx), `y` the pooled one (y, or dy), each in the layout
/// `a` gives it.
inline AvgPoolSizes avg_pool_sizes(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  AvgPoolSizes z;
  z.n = x[0];
  if (a.channels_last) {
    z.c = x[3];
    z.h = x[1];
    z.w = x[2];
  } else {
    z.c = x[1];
    z.h = x[2];
    z.w = x[3];
  }
  const int row_dim = a.pooled_channels_last() ? 1 : 2;
  z.oh = y[row_dim];
  z.ow = y[row_dim + 1];
  z.k = a.kernel;
  z.s = a.stride;
  z.p = a.padding;
  return z;
}

/// 1/(k*k) in float, as the CPU computes it (a product by it, not a division by k*k).
inline float mean_scale(const Pool2dAttrs& a) {
  return 1.0f / static_cast<float>(static_cast<std::int64_t>(a.kernel) * a.kernel);
}

template <bool channels_last> void maxpool2d(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const PoolGeometry g = pool_geometry(args.in[0].shape, args.out.shape, a);
  launch(channels_last ? "maxpool2d.channels_last" : "maxpool2d", &maxpool_kernel<channels_last>,
         blocks_for(n), block_threads, 0, args.in[0].f32(), args.out.f32(), g, n);
}

inline void avgpool2d(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const AvgPoolSizes z = avg_pool_sizes(args.in[0].shape, args.out.shape, a);
  // The CPU's 2x2 path over even planes (rows no wider than its 1024-float pair buffer) sums
  // horizontal pairs first; other geometries sum taps in row-major order. The CPU decides on
  // the plane alone, so the layouts do not enter into it.
  const bool pair_sums =
      z.k == 2 && z.s == 2 && z.p == 0 && z.h % 2 == 0 && z.w % 2 == 0 && z.w <= 1024;
  // Indexed [x channels-last][y channels-last].
  constexpr decltype(&avgpool_kernel<false, false>) kernels[2][2] = {
      {&avgpool_kernel<false, false>, &avgpool_kernel<false, true>},
      {&avgpool_kernel<true, false>, &avgpool_kernel<true, true>}};
  launch("avgpool2d", kernels[a.channels_last][a.pooled_channels_last()], blocks_for(n),
         block_threads, 0, args.in[0].f32(), args.out.f32(), z, n, pair_sums, mean_scale(a));
}

/// Reads x (input 0) and dy (input 1); y is not an input: each window's maximum is found
/// again in x.
template <bool channels_last> void maxpool2d_grad(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const PoolGeometry g = pool_geometry(args.in[0].shape, args.in[1].shape, a);
  const char* name = channels_last ? "maxpool2d_grad.channels_last" : "maxpool2d_grad";
  if (g.k == 2 && g.s == 2 && g.p == 0) {
    // The only geometry whose dx may overwrite x (OpDef::overwritable_input).
    const std::int64_t block_rows = (g.h + 1) / 2, block_cols = (g.w + 1) / 2;
    const std::int64_t blocks = g.groups * block_rows * block_cols * g.lanes;
    launch(name, &maxpool_grad_tiled_kernel<channels_last>, blocks_for(blocks), block_threads, 0,
           args.in[0].f32(), args.in[1].f32(), args.out.f32(), g, block_rows, block_cols, blocks);
    return;
  }
  launch(name, &maxpool_grad_kernel<channels_last>, blocks_for(n), block_threads, 0,
         args.in[0].f32(), args.in[1].f32(), args.out.f32(), g, n);
}

/// Reads dy (input 0) only; dx's plane size comes from the attributes (args.out.shape).
inline void avgpool2d_grad(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const AvgPoolSizes z = avg_pool_sizes(args.out.shape, args.in[0].shape, a);
  // Indexed [dx channels-last][dy channels-last].
  constexpr decltype(&avgpool_grad_kernel<false, false>) kernels[2][2] = {
      {&avgpool_grad_kernel<false, false>, &avgpool_grad_kernel<false, true>},
      {&avgpool_grad_kernel<true, false>, &avgpool_grad_kernel<true, true>}};
  launch("avgpool2d_grad", kernels[a.channels_last][a.pooled_channels_last()], blocks_for(n),
         block_threads, 0, args.in[0].f32(), args.out.f32(), z, n, mean_scale(a));
}

/// Max pooling has a kernel per layout and none that changes layout, so a call that flips
/// the layout finds no kernel rather than a wrong one.
template <bool channels_last> bool pool_layout_accepts(const KernelQuery& q) {
  const auto* a = q.attrs ? std::get_if<Pool2dAttrs>(q.attrs) : nullptr;
  return a && a->channels_last == channels_last && !a->flip_pooled_layout;
}

/// One average pooling kernel serves every pair of layouts: it picks its instantiation when
/// it launches.
inline bool avgpool_accepts(const KernelQuery& q) {
  return q.attrs && std::holds_alternative<Pool2dAttrs>(*q.attrs);
}

} // namespace pool_detail

/// Puts the pooling kernels and their gradients into the table.
inline void register_pool_kernels(KernelTable& table) {
  using namespace pool_detail;
  table.add(Op::MaxPool2d, {"maxpool2d", &maxpool2d<false>, &pool_layout_accepts<false>});
  table.add(Op::MaxPool2d,
            {"maxpool2d.channels_last", &maxpool2d<true>, &pool_layout_accepts<true>});
  table.add(Op::MaxPool2dGrad,
            {"maxpool2d_grad", &maxpool2d_grad<false>, &pool_layout_accepts<false>});
  table.add(Op::MaxPool2dGrad,
            {"maxpool2d_grad.channels_last", &maxpool2d_grad<true>, &pool_layout_accepts<true>});
  table.add(Op::AvgPool2d, {"avgpool2d", &avgpool2d, &avgpool_accepts});
  table.add(Op::AvgPool2dGrad, {"avgpool2d_grad", &avgpool2d_grad, &avgpool_accepts});
}

} // namespace kiln::cuda
