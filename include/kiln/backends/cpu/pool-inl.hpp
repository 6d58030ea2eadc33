// Per-target pool kernels; re-included once per Highway target by implementation.hpp. Pools
// and their gradients also run channels-last (Pool2dAttrs::channels_last), and average pools
// also read one layout and write the other (Pool2dAttrs::flip_pooled_layout).
#if defined(KILN_CPU_POOL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_POOL_INL_H_
#undef KILN_CPU_POOL_INL_H_
#else
#define KILN_CPU_POOL_INL_H_
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <variant>

#include <hwy/highway.h>

#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/transpose-inl.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace pool_detail {

/// Output elements a parallel task should at least produce to pay for its scheduling.
inline constexpr std::int64_t kMinTaskElements = 16384;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Geometry of one pooling step, planes = N*C.
///
/// Output columns [vec_lo, vec_hi) have their whole window inside the input row, and for
/// stride 2 also the spare odd lane that LoadInterleaved2 reads past the last tap, so the
/// vector paths need no bounds checks. Strides other than 1 and 2 use the scalar path only.
struct Geometry {
  std::int64_t planes = 0, H = 0, W = 0, OH = 0, OW = 0;
  std::int64_t k = 1, s = 1, p = 0;
  std::int64_t vec_lo = 0, vec_hi = 0;
};

inline Geometry MakeGeometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  Geometry g;
  g.planes = x[0] * x[1];
  g.H = x[2];
  g.W = x[3];
  g.OH = y[2];
  g.OW = y[3];
  g.k = a.kernel;
  g.s = a.stride;
  g.p = a.padding;
  if (g.s == 1 || g.s == 2) {
    g.vec_lo = (g.p + g.s - 1) / g.s;
    const std::int64_t last = g.W - g.k - g.s + 1 + g.p;
    g.vec_hi = last < 0 ? 0 : std::min(g.OW, last / g.s + 1);
    g.vec_hi = std::max(g.vec_hi, g.vec_lo);
  }
  return g;
}

/// Window rows of output row oh that lie inside the input: kh in [lo, hi).
struct TapRange {
  std::int64_t lo, hi;
};

inline TapRange Taps(std::int64_t origin, std::int64_t k, std::int64_t extent) {
  return {std::max<std::int64_t>(0, -origin), std::min(k, extent - origin)};
}

/// Runs f(d, ow) over [lo, hi) in blocks of the widest vector, then of 4 lanes so narrow
/// images still vectorise on wide targets; returns the first column not covered.
template <class F>
HWY_INLINE std::int64_t ForEachBlock(std::int64_t lo, std::int64_t hi, const F& f) {
  const hn::ScalableTag<float> d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = lo;
  for (; i + N <= hi; i += N) f(d, i);
  if constexpr (hn::MaxLanes(hn::ScalableTag<float>()) > 4) {
    const hn::CappedTag<float, 4> d4;
    for (; i + 4 <= hi; i += 4) f(d4, i);
  }
  return i;
}

/// Lanes p[0], p[S], p[2S], ... for S in {1, 2}.
template <int S, class D> HWY_INLINE hn::Vec<D> LoadStrided(D d, const float* p) {
  if constexpr (S == 1) {
    return hn::LoadU(d, p);
  } else {
    hn::Vec<D> even, odd;
    hn::LoadInterleaved2(d, p, even, odd);
    return even;
  }
}

/// Calls f(ow) for the output columns of a row not covered by the vector blocks.
template <class F>
inline void ForEachScalarColumn(const Geometry& g, std::int64_t vec_done, const F& f) {
  for (std::int64_t ow = 0; ow < std::min(g.vec_lo, g.OW); ++ow) f(ow);
  for (std::int64_t ow = std::max(vec_done, g.vec_lo); ow < g.OW; ++ow) f(ow);
}

/// Calls plane_fn(plane) for every N*C plane, in parallel.
template <class F>
inline void ForEachPlane(const Geometry& g, std::int64_t work_per_plane, const F& plane_fn) {
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, work_per_plane));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, g.planes, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t c = r.begin(); c != r.end(); ++c) plane_fn(c);
                    });
}

/// Max (or sum, when kMax is false) of every window of one plane.
template <bool kMax, int S> inline void PoolPlane(const float* x, float* y, const Geometry& g) {
  const float init = kMax ? kNegInf : 0.0f;
  const float scale = kMax ? 1.0f : 1.0f / static_cast<float>(g.k * g.k);
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    float* yr = y + oh * g.OW;
    std::int64_t vec_done = g.vec_lo;
    if constexpr (S != 0) {
      vec_done = ForEachBlock(g.vec_lo, g.vec_hi, [&](auto d, std::int64_t ow) HWY_ATTR {
        auto acc = hn::Set(d, init);
        for (std::int64_t i = kh.lo; i < kh.hi; ++i) {
          const float* xr = x + (ih0 + i) * g.W + ow * S - g.p;
          for (std::int64_t j = 0; j < g.k; ++j) {
            const auto v = LoadStrided<S>(d, xr + j);
            acc = kMax ? MaxKeepingNaN(acc, v) : hn::Add(acc, v);
          }
        }
        hn::StoreU(kMax ? acc : hn::Mul(acc, hn::Set(d, scale)), d, yr + ow);
      });
    }
    ForEachScalarColumn(g, vec_done, [&](std::int64_t ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      const TapRange kw = Taps(iw0, g.k, g.W);
      float acc = init;
      for (std::int64_t i = kh.lo; i < kh.hi; ++i)
        for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
          const float v = x[(ih0 + i) * g.W + iw0 + j];
          acc = kMax ? max_keeping_nan(acc, v) : acc + v;
        }
      yr[ow] = acc * scale;
    });
  }
}

/// Floats of the per-block buffer of the whole-tensor 2x2 pooling kernels.
inline constexpr std::int64_t kPairRowsFloats = 1024;

/// Whether a 2x2, stride-2, unpadded pooling over even planes runs over the whole tensor as
/// blocks of row pairs: each plane's rows pair up, and planes follow each other, so the
/// tensor is planes x OH row pairs whatever the plane size, and narrow planes (LeNet's 10 x 10)
/// cost no call per row.
inline bool PoolsRowPairs(const Geometry& g) {
  return g.k == 2 && g.s == 2 && g.p == 0 && g.H % 2 == 0 && g.W % 2 == 0 && g.W <= kPairRowsFloats;
}

/// Output rows per block of the 2x2 row-pair kernels: the block's input (row pairs) halves
/// into at most kPairRowsFloats floats.
inline std::int64_t RowPairBlockRows(const Geometry& g) {
  return std::max<std::int64_t>(1, kPairRowsFloats / g.W);
}

/// Whether avgpool2d_grad runs by row pairs: rows of 16 or more already fill whole vectors
/// plane by plane, and measured no faster so.
inline bool AvgPoolGradRowPairs(const Geometry& g) { return PoolsRowPairs(g) && g.W < 16; }

/// Calls block_fn(first, count) over the tensor's planes x OH output rows in blocks of
/// RowPairBlockRows, in parallel.
template <class F> inline void ForEachRowPairBlock(const Geometry& g, const F& block_fn) {
  const std::int64_t rows = g.planes * g.OH, block = RowPairBlockRows(g);
  const std::int64_t blocks = (rows + block - 1) / block;
  const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / (block * 2 * g.W));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, blocks, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t b = r.begin(); b != r.end(); ++b)
                        block_fn(b * block, std::min(block, rows - b * block));
                    });
}

/// Max (or mean) pooling 2x2 of `count` row pairs from output row `first` on: first the
/// horizontal pairs of the whole block, contiguous whatever the rows (W is even), with whole
/// vectors; then each output row from its two rows of pair results.
template <bool kMax>
inline void PoolRowPairBlock(const float* x, float* y, const Geometry& g, std::int64_t first,
                             std::int64_t count) {
  alignas(64) float pairs[kPairRowsFloats];
  const float* in = x + 2 * first * g.W;
  const std::int64_t n = count * g.W; // pair results: 2 * count rows of OW
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::Vec<decltype(d)> even, odd;
    hn::LoadInterleaved2(d, in + 2 * i, even, odd);
    hn::Store(kMax ? MaxKeepingNaN(even, odd) : hn::Add(even, odd), d, pairs + i);
  }
  for (; i < n; ++i)
    pairs[i] = kMax ? max_keeping_nan(in[2 * i], in[2 * i + 1]) : in[2 * i] + in[2 * i + 1];
  float* out = y + first * g.OW;
  for (std::int64_t r = 0; r < count; ++r) {
    const float* top = pairs + 2 * r * g.OW;
    const float* bottom = top + g.OW;
    for (std::int64_t j = 0; j < g.OW; ++j)
      out[r * g.OW + j] = kMax ? max_keeping_nan(top[j], bottom[j]) : 0.25f * (top[j] + bottom[j]);
  }
}

/// Max (or mean) pooling 2x2 by blocks of row pairs, in parallel.
template <bool kMax> inline void PoolRowPairs(const float* x, float* y, const Geometry& g) {
  ForEachRowPairBlock(g, [&](std::int64_t first, std::int64_t count)
                             HWY_ATTR { PoolRowPairBlock<kMax>(x, y, g, first, count); });
}

/// avgpool2d_grad 2x2 of `count` row pairs from dy row `first` on: each dy row, scaled, fills
/// its two rows of pair values, then the whole block of dx is written as interleaved pairs
/// with whole vectors.
inline void AvgPoolGradRowPairBlock(const float* dy, float* dx, const Geometry& g,
                                    std::int64_t first, std::int64_t count) {
  alignas(64) float pairs[kPairRowsFloats];
  const float* in = dy + first * g.OW;
  for (std::int64_t r = 0; r < count; ++r) {
    for (std::int64_t j = 0; j < g.OW; ++j) {
      const float v = 0.25f * in[r * g.OW + j];
      pairs[2 * r * g.OW + j] = v;
      pairs[(2 * r + 1) * g.OW + j] = v;
    }
  }
  float* out = dx + 2 * first * g.W;
  const std::int64_t n = count * g.W;
  const hn::ScalableTag<float> d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::Load(d, pairs + i);
    hn::StoreInterleaved2(v, v, d, out + 2 * i);
  }
  for (; i < n; ++i) out[2 * i] = out[2 * i + 1] = pairs[i];
}

/// avgpool2d_grad 2x2 by blocks of row pairs, in parallel.
inline void AvgPoolGradByRowPairs(const float* dy, float* dx, const Geometry& g) {
  ForEachRowPairBlock(g, [&](std::int64_t first, std::int64_t count)
                             HWY_ATTR { AvgPoolGradRowPairBlock(dy, dx, g, first, count); });
}

/// PoolPlane for the geometry's stride.
template <bool kMax> inline void PoolAnyPlane(const float* x, float* y, const Geometry& g) {
  if (g.s == 1) {
    PoolPlane<kMax, 1>(x, y, g);
  } else if (g.s == 2) {
    PoolPlane<kMax, 2>(x, y, g);
  } else {
    PoolPlane<kMax, 0>(x, y, g);
  }
}

template <bool kMax> inline void PoolForward(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const Geometry g = MakeGeometry(args.in[0].shape, args.out.shape, a);
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  if (PoolsRowPairs(g)) {
    PoolRowPairs<kMax>(x, y, g);
    return;
  }
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  ForEachPlane(g, out_plane * g.k * g.k, [&](std::int64_t c) HWY_ATTR {
    PoolAnyPlane<kMax>(x + c * in_plane, y + c * out_plane, g);
  });
}

/// Zeroes the input positions no 2x2/stride-2 window covers: the last row and column of an
/// odd-sized plane.
inline void ZeroUncovered2x2(float* dx, const Geometry& g) {
  for (std::int64_t ih = 0; ih < 2 * g.OH; ++ih)
    std::fill(dx + ih * g.W + 2 * g.OW, dx + (ih + 1) * g.W, 0.0f);
  std::fill(dx + 2 * g.OH * g.W, dx + g.H * g.W, 0.0f);
}

/// Which tap of 2x2 windows holds the first maximum, as 0..3 in scan order (a0 a1 / b0 b1);
/// strict > keeps the first, as the scalar kernel does.
template <class D, class V = hn::Vec<D>> HWY_INLINE V FirstMaxTap2x2(D d, V a0, V a1, V b0, V b1) {
  auto best = a0;
  auto which = hn::Zero(d);
  auto gt = hn::Gt(a1, best);
  best = hn::IfThenElse(gt, a1, best);
  which = hn::IfThenElse(gt, hn::Set(d, 1.0f), which);
  gt = hn::Gt(b0, best);
  best = hn::IfThenElse(gt, b0, best);
  which = hn::IfThenElse(gt, hn::Set(d, 2.0f), which);
  gt = hn::Gt(b1, best);
  return hn::IfThenElse(gt, hn::Set(d, 3.0f), which);
}

/// maxpool2d_grad for kernel 2, stride 2, no padding: windows tile the plane, so every
/// covered dx element is written exactly once, without a zeroing pass or scatter.
inline void MaxPoolGradPlane2x2(const float* x, const float* dy, float* dx, const Geometry& g) {
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const float* x0 = x + 2 * oh * g.W;
    const float* x1 = x0 + g.W;
    float* d0 = dx + 2 * oh * g.W;
    float* d1 = d0 + g.W;
    const float* dyr = dy + oh * g.OW;
    const std::int64_t done = ForEachBlock(0, g.OW, [&](auto d, std::int64_t ow) HWY_ATTR {
      hn::Vec<decltype(d)> a0, a1, b0, b1;
      hn::LoadInterleaved2(d, x0 + 2 * ow, a0, a1);
      hn::LoadInterleaved2(d, x1 + 2 * ow, b0, b1);
      const auto which = FirstMaxTap2x2(d, a0, a1, b0, b1);
      const auto grad = hn::LoadU(d, dyr + ow);
      hn::StoreInterleaved2(hn::IfThenElseZero(hn::Eq(which, hn::Zero(d)), grad),
                            hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 1.0f)), grad), d,
                            d0 + 2 * ow);
      hn::StoreInterleaved2(hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 2.0f)), grad),
                            hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 3.0f)), grad), d,
                            d1 + 2 * ow);
    });
    for (std::int64_t ow = done; ow < g.OW; ++ow) {
      const float v[4] = {x0[2 * ow], x0[2 * ow + 1], x1[2 * ow], x1[2 * ow + 1]};
      int which = 0;
      for (int t = 1; t < 4; ++t)
        if (v[t] > v[which]) which = t;
      d0[2 * ow] = which == 0 ? dyr[ow] : 0.0f;
      d0[2 * ow + 1] = which == 1 ? dyr[ow] : 0.0f;
      d1[2 * ow] = which == 2 ? dyr[ow] : 0.0f;
      d1[2 * ow + 1] = which == 3 ? dyr[ow] : 0.0f;
    }
  }
  ZeroUncovered2x2(dx, g);
}

/// maxpool2d_grad for any geometry: finds each window's first maximum (vectorised over
/// output columns where possible), then adds dy there; overlapping windows accumulate.
template <int S>
inline void MaxPoolGradPlane(const float* x, const float* dy, float* dx, const Geometry& g) {
  std::fill(dx, dx + g.H * g.W, 0.0f);
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    if (kh.lo >= kh.hi) continue;
    const float* dyr = dy + oh * g.OW;
    std::int64_t vec_done = g.vec_lo;
    if constexpr (S != 0) {
      vec_done = ForEachBlock(g.vec_lo, g.vec_hi, [&](auto d, std::int64_t ow) HWY_ATTR {
        const hn::RebindToSigned<decltype(d)> di;
        const auto iota = hn::Iota(di, 0);
        const auto lane_off = S == 1 ? iota : hn::Add(iota, iota);
        const std::int64_t col0 = ow * S - g.p;
        auto best = hn::Set(d, kNegInf);
        auto idx =
            hn::Add(lane_off, hn::Set(di, static_cast<std::int32_t>((ih0 + kh.lo) * g.W + col0)));
        for (std::int64_t i = kh.lo; i < kh.hi; ++i) {
          const std::int64_t row = (ih0 + i) * g.W + col0;
          for (std::int64_t j = 0; j < g.k; ++j) {
            const auto v = LoadStrided<S>(d, x + row + j);
            const auto gt = hn::Gt(v, best);
            best = hn::IfThenElse(gt, v, best);
            idx = hn::IfThenElse(hn::RebindMask(di, gt),
                                 hn::Add(lane_off, hn::Set(di, static_cast<std::int32_t>(row + j))),
                                 idx);
          }
        }
        HWY_ALIGN std::int32_t pos[HWY_MAX_BYTES / sizeof(std::int32_t)];
        hn::Store(idx, di, pos);
        for (std::size_t l = 0; l < hn::Lanes(d); ++l)
          dx[pos[l]] += dyr[ow + static_cast<std::int64_t>(l)];
      });
    }
    ForEachScalarColumn(g, vec_done, [&](std::int64_t ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      const TapRange kw = Taps(iw0, g.k, g.W);
      float best = kNegInf;
      std::int64_t arg = -1;
      for (std::int64_t i = kh.lo; i < kh.hi; ++i)
        for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
          const std::int64_t at = (ih0 + i) * g.W + iw0 + j;
          if (arg < 0 || x[at] > best) {
            best = x[at];
            arg = at;
          }
        }
      if (arg >= 0) dx[arg] += dyr[ow];
    });
  }
}

inline void MaxPoolGrad(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const Geometry g = MakeGeometry(args.in[0].shape, args.in[1].shape, a);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dx = args.out.f32();
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  ForEachPlane(g, out_plane * g.k * g.k + in_plane, [&](std::int64_t c) HWY_ATTR {
    const float* xc = x + c * in_plane;
    const float* dyc = dy + c * out_plane;
    float* dxc = dx + c * in_plane;
    if (g.k == 2 && g.s == 2 && g.p == 0) {
      MaxPoolGradPlane2x2(xc, dyc, dxc, g);
    } else if (g.s == 1) {
      MaxPoolGradPlane<1>(xc, dyc, dxc, g);
    } else if (g.s == 2) {
      MaxPoolGradPlane<2>(xc, dyc, dxc, g);
    } else {
      MaxPoolGradPlane<0>(xc, dyc, dxc, g);
    }
  });
}

/// avgpool2d_grad for kernel 2, stride 2, no padding: each dx element is dy/4 of the one
/// window covering it, written once.
inline void AvgPoolGradPlane2x2(const float* dy, float* dx, const Geometry& g) {
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    float* d0 = dx + 2 * oh * g.W;
    float* d1 = d0 + g.W;
    const float* dyr = dy + oh * g.OW;
    const std::int64_t done = ForEachBlock(0, g.OW, [&](auto d, std::int64_t ow) HWY_ATTR {
      const auto v = hn::Mul(hn::LoadU(d, dyr + ow), hn::Set(d, 0.25f));
      hn::StoreInterleaved2(v, v, d, d0 + 2 * ow);
      hn::StoreInterleaved2(v, v, d, d1 + 2 * ow);
    });
    for (std::int64_t ow = done; ow < g.OW; ++ow) {
      const float v = dyr[ow] * 0.25f;
      d0[2 * ow] = d0[2 * ow + 1] = d1[2 * ow] = d1[2 * ow + 1] = v;
    }
  }
  ZeroUncovered2x2(dx, g);
}

/// avgpool2d_grad for any geometry: spreads dy/(k*k) over each window, one tap at a time so
/// a vector's lanes never hit the same dx element.
template <int S> inline void AvgPoolGradPlane(const float* dy, float* dx, const Geometry& g) {
  std::fill(dx, dx + g.H * g.W, 0.0f);
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    const float* dyr = dy + oh * g.OW;
    std::int64_t vec_done = g.vec_lo;
    if constexpr (S != 0) {
      vec_done = ForEachBlock(g.vec_lo, g.vec_hi, [&](auto d, std::int64_t ow) HWY_ATTR {
        const auto v = hn::Mul(hn::LoadU(d, dyr + ow), hn::Set(d, scale));
        for (std::int64_t i = kh.lo; i < kh.hi; ++i) {
          float* dr = dx + (ih0 + i) * g.W + ow * S - g.p;
          for (std::int64_t j = 0; j < g.k; ++j) {
            if constexpr (S == 1) {
              hn::StoreU(hn::Add(hn::LoadU(d, dr + j), v), d, dr + j);
            } else {
              hn::Vec<decltype(d)> even, odd;
              hn::LoadInterleaved2(d, dr + j, even, odd);
              hn::StoreInterleaved2(hn::Add(even, v), odd, d, dr + j);
            }
          }
        }
      });
    }
    ForEachScalarColumn(g, vec_done, [&](std::int64_t ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      const TapRange kw = Taps(iw0, g.k, g.W);
      const float v = dyr[ow] * scale;
      for (std::int64_t i = kh.lo; i < kh.hi; ++i)
        for (std::int64_t j = kw.lo; j < kw.hi; ++j) dx[(ih0 + i) * g.W + iw0 + j] += v;
    });
  }
}

/// dx of one plane from its dy, by the geometry's kernel for it.
inline void AvgPoolGradAnyPlane(const float* dy, float* dx, const Geometry& g) {
  if (g.k == 2 && g.s == 2 && g.p == 0) {
    AvgPoolGradPlane2x2(dy, dx, g);
  } else if (g.s == 1) {
    AvgPoolGradPlane<1>(dy, dx, g);
  } else if (g.s == 2) {
    AvgPoolGradPlane<2>(dy, dx, g);
  } else {
    AvgPoolGradPlane<0>(dy, dx, g);
  }
}

inline void AvgPoolGrad(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const Geometry g = MakeGeometry(args.out.shape, args.in[0].shape, a);
  const float* dy = args.in[0].f32();
  float* dx = args.out.f32();
  if (AvgPoolGradRowPairs(g)) {
    AvgPoolGradByRowPairs(dy, dx, g);
    return;
  }
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  ForEachPlane(g, out_plane * g.k * g.k + in_plane, [&](std::int64_t c) HWY_ATTR {
    AvgPoolGradAnyPlane(dy + c * out_plane, dx + c * in_plane, g);
  });
}

// Channels-last (NHWC) max pooling: vectorised over the contiguous channels.

/// Geometry of a channels-last pooling step: x [N,H,W,C], y [N,OH,OW,C].
struct GeometryNhwc {
  std::int64_t N = 0, H = 0, W = 0, C = 0, OH = 0, OW = 0;
  std::int64_t k = 1, s = 1, p = 0;
};

inline GeometryNhwc MakeGeometryNhwc(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], a.kernel, a.stride, a.padding};
}

/// Runs f(d, c) over channels [lo, hi) in blocks of the widest vector, then of 4 lanes, then
/// of one lane, so every channel count runs the same vector code.
template <class F>
HWY_INLINE void ForEachChannelBlock(std::int64_t lo, std::int64_t hi, const F& f) {
  const hn::ScalableTag<float> d;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t c = lo;
  for (; c + N <= hi; c += N) f(d, c);
  if constexpr (hn::MaxLanes(hn::ScalableTag<float>()) > 4) {
    const hn::CappedTag<float, 4> d4;
    for (; c + 4 <= hi; c += 4) f(d4, c);
  }
  const hn::CappedTag<float, 1> d1;
  for (; c < hi; ++c) f(d1, c);
}

/// Calls row_fn(n, oh) for every output row of every image, in parallel.
template <class F>
inline void ForEachOutputRow(const GeometryNhwc& g, std::int64_t work_per_row, const F& row_fn) {
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, work_per_row));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, g.N * g.OH, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t row = r.begin(); row != r.end(); ++row)
                        row_fn(row / g.OH, row % g.OH);
                    });
}

/// maxpool2d over [N,H,W,C]; padding counts as -inf.
inline void MaxPoolForwardNhwc(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const GeometryNhwc g = MakeGeometryNhwc(args.in[0].shape, args.out.shape, a);
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  ForEachOutputRow(g, g.OW * g.C * g.k * g.k, [&](std::int64_t n, std::int64_t oh) HWY_ATTR {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    const float* xn = x + n * g.H * g.W * g.C;
    float* yr = y + (n * g.OH + oh) * g.OW * g.C;
    for (std::int64_t ow = 0; ow < g.OW; ++ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      const TapRange kw = Taps(iw0, g.k, g.W);
      ForEachChannelBlock(0, g.C, [&](auto d, std::int64_t c) HWY_ATTR {
        auto acc = hn::Set(d, kNegInf);
        for (std::int64_t i = kh.lo; i < kh.hi; ++i) {
          const float* xr = xn + ((ih0 + i) * g.W + iw0) * g.C + c;
          for (std::int64_t j = kw.lo; j < kw.hi; ++j)
            acc = MaxKeepingNaN(acc, hn::LoadU(d, xr + j * g.C));
        }
        hn::StoreU(acc, d, yr + ow * g.C + c);
      });
    }
  });
}

/// maxpool2d_grad over [N,H,W,C] for kernel 2, stride 2, no padding, one output row: each
/// window's four taps are read, then its four dx elements written, so dx may be x's memory.
/// Also zeroes what no window covers: the last column, and below the last row pair the last
/// row, of an odd-sized image.
inline void MaxPoolGradRowNhwc2x2(const float* x, const float* dy, float* dx, const GeometryNhwc& g,
                                  std::int64_t n, std::int64_t oh) {
  const std::int64_t image = g.H * g.W * g.C, line = g.W * g.C;
  const std::int64_t top = n * image + 2 * oh * line;
  const float* x0 = x + top;
  const float* x1 = x0 + line;
  float* d0 = dx + top;
  float* d1 = d0 + line;
  const float* dyr = dy + (n * g.OH + oh) * g.OW * g.C;
  for (std::int64_t ow = 0; ow < g.OW; ++ow) {
    const std::int64_t left = 2 * ow * g.C, right = left + g.C;
    ForEachChannelBlock(0, g.C, [&](auto d, std::int64_t c) HWY_ATTR {
      const auto a0 = hn::LoadU(d, x0 + left + c), a1 = hn::LoadU(d, x0 + right + c);
      const auto b0 = hn::LoadU(d, x1 + left + c), b1 = hn::LoadU(d, x1 + right + c);
      const auto which = FirstMaxTap2x2(d, a0, a1, b0, b1);
      const auto grad = hn::LoadU(d, dyr + ow * g.C + c);
      hn::StoreU(hn::IfThenElseZero(hn::Eq(which, hn::Zero(d)), grad), d, d0 + left + c);
      hn::StoreU(hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 1.0f)), grad), d, d0 + right + c);
      hn::StoreU(hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 2.0f)), grad), d, d1 + left + c);
      hn::StoreU(hn::IfThenElseZero(hn::Eq(which, hn::Set(d, 3.0f)), grad), d, d1 + right + c);
    });
  }
  std::fill(d0 + 2 * g.OW * g.C, d0 + line, 0.0f);
  std::fill(d1 + 2 * g.OW * g.C, d1 + line, 0.0f);
  if (oh == g.OH - 1) std::fill(dx + n * image + 2 * g.OH * line, dx + (n + 1) * image, 0.0f);
}

/// maxpool2d_grad over [N,H,W,C] for any geometry, channels [c0, c1) of image n: finds each
/// window's first maximum per channel, then adds dy at that tap; overlapping windows
/// accumulate in the same (oh, ow) order as the NCHW kernel.
inline void MaxPoolGradChannelsNhwc(const float* x, const float* dy, float* dx,
                                    const GeometryNhwc& g, std::int64_t n, std::int64_t c0,
                                    std::int64_t c1) {
  const std::int64_t image = g.H * g.W * g.C;
  const float* xn = x + n * image;
  float* dxn = dx + n * image;
  const float* dyn = dy + n * g.OH * g.OW * g.C;
  for (std::int64_t pix = 0; pix < g.H * g.W; ++pix)
    std::fill(dxn + pix * g.C + c0, dxn + pix * g.C + c1, 0.0f);
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    if (kh.lo >= kh.hi) continue;
    for (std::int64_t ow = 0; ow < g.OW; ++ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      const TapRange kw = Taps(iw0, g.k, g.W);
      if (kw.lo >= kw.hi) continue;
      const auto at = [&](std::int64_t i, std::int64_t j) {
        return ((ih0 + i) * g.W + iw0 + j) * g.C;
      };
      const auto tap = [&](std::int64_t i, std::int64_t j) {
        return static_cast<float>(i * g.k + j);
      };
      ForEachChannelBlock(c0, c1, [&](auto d, std::int64_t c) HWY_ATTR {
        // The first in-bound tap is the maximum until a later one is strictly greater.
        auto best = hn::LoadU(d, xn + at(kh.lo, kw.lo) + c);
        auto which = hn::Set(d, tap(kh.lo, kw.lo));
        for (std::int64_t i = kh.lo; i < kh.hi; ++i)
          for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
            const auto v = hn::LoadU(d, xn + at(i, j) + c);
            const auto gt = hn::Gt(v, best);
            best = hn::IfThenElse(gt, v, best);
            which = hn::IfThenElse(gt, hn::Set(d, tap(i, j)), which);
          }
        const auto grad = hn::LoadU(d, dyn + (oh * g.OW + ow) * g.C + c);
        for (std::int64_t i = kh.lo; i < kh.hi; ++i)
          for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
            float* p = dxn + at(i, j) + c;
            const auto add = hn::IfThenElseZero(hn::Eq(which, hn::Set(d, tap(i, j))), grad);
            hn::StoreU(hn::Add(hn::LoadU(d, p), add), d, p);
          }
      });
    }
  }
}

/// Channels a task of the general channels-last pool gradient covers.
inline constexpr std::int64_t kChannelChunk = 64;

inline void MaxPoolGradNhwc(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const GeometryNhwc g = MakeGeometryNhwc(args.in[0].shape, args.in[1].shape, a);
  const float* x = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dx = args.out.f32();
  if (g.k == 2 && g.s == 2 && g.p == 0) {
    // Windows tile the image: rows of windows are independent, and run in place.
    ForEachOutputRow(g, 4 * g.OW * g.C, [&](std::int64_t n, std::int64_t oh) HWY_ATTR {
      MaxPoolGradRowNhwc2x2(x, dy, dx, g, n, oh);
    });
    return;
  }
  // Overlapping windows of one image add into the same dx rows: split by image and channels.
  const std::int64_t chunks = (g.C + kChannelChunk - 1) / kChannelChunk;
  const std::int64_t work = g.OH * g.OW * g.k * g.k * std::min(g.C, kChannelChunk);
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, work));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, g.N * chunks, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t t = r.begin(); t != r.end(); ++t) {
                        const std::int64_t c0 = (t % chunks) * kChannelChunk;
                        MaxPoolGradChannelsNhwc(x, dy, dx, g, t / chunks, c0,
                                                std::min(g.C, c0 + kChannelChunk));
                      }
                    });
}

// Average pooling in the other layouts, image by image: channels-last, and flipped (the pooled
// tensor in the other layout from the unpooled one). Each image is pooled in the unpooled
// tensor's layout, and the pooled side, a quarter of the data for 2x2 windows, is reordered
// through this thread's scratch while it is in L1: the reorder costs no pass over memory. The
// sums are the NCHW kernels' own, so a folded reorder changes no result.

/// Whether a 2x2 average takes the row-pair kernels' order, (a0 + a1) + (b0 + b1).
inline bool SumsPairs(const GeometryNhwc& g) {
  return PoolsRowPairs(Geometry{0, g.H, g.W, 0, 0, g.k, g.s, g.p});
}

/// Calls block_fn(first, count) over the output rows of `planes` consecutive planes in blocks
/// of RowPairBlockRows, on this thread.
template <class F>
inline void ForEachRowPairBlockOf(const Geometry& g, std::int64_t planes, const F& block_fn) {
  const std::int64_t rows = planes * g.OH, block = RowPairBlockRows(g);
  for (std::int64_t first = 0; first < rows; first += block)
    block_fn(first, std::min(block, rows - first));
}

/// Means of every window of `planes` consecutive NCHW planes, on this thread.
inline void AvgPoolPlanes(const float* x, float* y, const Geometry& g, std::int64_t planes) {
  if (PoolsRowPairs(g)) {
    ForEachRowPairBlockOf(g, planes, [&](std::int64_t first, std::int64_t count) HWY_ATTR {
      PoolRowPairBlock<false>(x, y, g, first, count);
    });
    return;
  }
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  for (std::int64_t c = 0; c < planes; ++c)
    PoolAnyPlane<false>(x + c * in_plane, y + c * out_plane, g);
}

/// dx of `planes` consecutive NCHW planes from their dy, on this thread, as AvgPoolGrad.
inline void AvgPoolGradPlanes(const float* dy, float* dx, const Geometry& g, std::int64_t planes) {
  if (AvgPoolGradRowPairs(g)) {
    ForEachRowPairBlockOf(g, planes, [&](std::int64_t first, std::int64_t count) HWY_ATTR {
      AvgPoolGradRowPairBlock(dy, dx, g, first, count);
    });
    return;
  }
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  for (std::int64_t c = 0; c < planes; ++c)
    AvgPoolGradAnyPlane(dy + c * out_plane, dx + c * in_plane, g);
}

/// Calls window_fn(pixel, ih0, iw0, kh, kw) for every window of one channels-last image in
/// (oh, ow) order: its pixel of the pooled image, its top left tap (padding included) and the
/// taps inside the image.
template <class F> inline void ForEachWindowNhwc(const GeometryNhwc& g, const F& window_fn) {
  for (std::int64_t oh = 0; oh < g.OH; ++oh) {
    const std::int64_t ih0 = oh * g.s - g.p;
    const TapRange kh = Taps(ih0, g.k, g.H);
    for (std::int64_t ow = 0; ow < g.OW; ++ow) {
      const std::int64_t iw0 = ow * g.s - g.p;
      window_fn(oh * g.OW + ow, ih0, iw0, kh, Taps(iw0, g.k, g.W));
    }
  }
}

/// Means of every window of one image x [H,W,C] into y [OH,OW,C], vectorised over channels:
/// the in-bound taps in row-major order times 1/(k*k), or for the row-pair geometries
/// (a0 + a1) + (b0 + b1) times 1/4, as the NCHW kernels sum.
inline void AvgPoolImageNhwc(const float* x, float* y, const GeometryNhwc& g) {
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  const bool pairs = SumsPairs(g);
  ForEachWindowNhwc(g, [&](std::int64_t pixel, std::int64_t ih0, std::int64_t iw0, TapRange kh,
                           TapRange kw) HWY_ATTR {
    float* yp = y + pixel * g.C;
    ForEachChannelBlock(0, g.C, [&](auto d, std::int64_t c) HWY_ATTR {
      const auto tap = [&](std::int64_t i, std::int64_t j) HWY_ATTR {
        return hn::LoadU(d, x + ((ih0 + i) * g.W + iw0 + j) * g.C + c);
      };
      if (pairs) {
        const auto sum = hn::Add(hn::Add(tap(0, 0), tap(0, 1)), hn::Add(tap(1, 0), tap(1, 1)));
        hn::StoreU(hn::Mul(hn::Set(d, 0.25f), sum), d, yp + c);
        return;
      }
      auto acc = hn::Zero(d);
      for (std::int64_t i = kh.lo; i < kh.hi; ++i)
        for (std::int64_t j = kw.lo; j < kw.hi; ++j) acc = hn::Add(acc, tap(i, j));
      hn::StoreU(hn::Mul(acc, hn::Set(d, scale)), d, yp + c);
    });
  });
}

/// dx [H,W,C] of one image from dy [OH,OW,C]: each dy times 1/(k*k) added to every tap of its
/// window, windows in (oh, ow) order.
inline void AvgPoolGradImageNhwc(const float* dy, float* dx, const GeometryNhwc& g) {
  const float scale = 1.0f / static_cast<float>(g.k * g.k);
  std::fill(dx, dx + g.H * g.W * g.C, 0.0f);
  ForEachWindowNhwc(g, [&](std::int64_t pixel, std::int64_t ih0, std::int64_t iw0, TapRange kh,
                           TapRange kw) HWY_ATTR {
    const float* dyp = dy + pixel * g.C;
    ForEachChannelBlock(0, g.C, [&](auto d, std::int64_t c) HWY_ATTR {
      const auto v = hn::Mul(hn::LoadU(d, dyp + c), hn::Set(d, scale));
      for (std::int64_t i = kh.lo; i < kh.hi; ++i)
        for (std::int64_t j = kw.lo; j < kw.hi; ++j) {
          float* p = dx + ((ih0 + i) * g.W + iw0 + j) * g.C + c;
          hn::StoreU(hn::Add(hn::LoadU(d, p), v), d, p);
        }
    });
  });
}

/// The pooled and unpooled sizes of an average pool, whichever layout each side has.
struct AvgPoolSides {
  std::int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  Geometry nchw;
  GeometryNhwc nhwc;
};

inline AvgPoolSides MakeAvgPoolSides(const Shape& unpooled, const Shape& pooled,
                                     const Pool2dAttrs& a) {
  AvgPoolSides s;
  s.N = unpooled[0];
  s.C = a.channels_last ? unpooled[3] : unpooled[1];
  s.H = a.channels_last ? unpooled[1] : unpooled[2];
  s.W = a.channels_last ? unpooled[2] : unpooled[3];
  s.OH = a.pooled_channels_last() ? pooled[1] : pooled[2];
  s.OW = a.pooled_channels_last() ? pooled[2] : pooled[3];
  s.nchw = MakeGeometry(Shape{s.N, s.C, s.H, s.W}, Shape{s.N, s.C, s.OH, s.OW}, a);
  s.nhwc = MakeGeometryNhwc(Shape{s.N, s.H, s.W, s.C}, Shape{s.N, s.OH, s.OW, s.C}, a);
  return s;
}

/// Calls image_fn(n, scratch) for every image, in parallel, with this thread's scratch.
template <class F>
inline void ForEachImage(const KernelArgs& args, const AvgPoolSides& s, const F& image_fn) {
  const std::int64_t work = s.C * (s.H * s.W + s.OH * s.OW);
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, work));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, s.N, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      float* scratch = ThreadScratch(args);
                      for (std::int64_t n = r.begin(); n != r.end(); ++n) image_fn(n, scratch);
                    });
}

/// avgpool2d with x, y, or both channels-last.
inline void AvgPoolOtherLayouts(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const AvgPoolSides s = MakeAvgPoolSides(args.in[0].shape, args.out.shape, a);
  const std::int64_t image = s.C * s.H * s.W, pooled = s.C * s.OH * s.OW, pixels = s.OH * s.OW;
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  ForEachImage(args, s, [&](std::int64_t n, float* scratch) HWY_ATTR {
    const float* xn = x + n * image;
    float* yn = y + n * pooled;
    if (!a.channels_last) { // [C, OH*OW] in scratch, to [OH*OW, C]
      AvgPoolPlanes(xn, scratch, s.nchw, s.C);
      transpose_detail::Transpose2D(scratch, pixels, yn, s.C, s.C, pixels);
    } else if (a.pooled_channels_last()) {
      AvgPoolImageNhwc(xn, yn, s.nhwc);
    } else { // [OH*OW, C] in scratch, to [C, OH*OW]
      AvgPoolImageNhwc(xn, scratch, s.nhwc);
      transpose_detail::Transpose2D(scratch, s.C, yn, pixels, pixels, s.C);
    }
  });
}

/// avgpool2d_grad with dy, dx, or both channels-last.
inline void AvgPoolGradOtherLayouts(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const AvgPoolSides s = MakeAvgPoolSides(args.out.shape, args.in[0].shape, a);
  const std::int64_t image = s.C * s.H * s.W, pooled = s.C * s.OH * s.OW, pixels = s.OH * s.OW;
  const float* dy = args.in[0].f32();
  float* dx = args.out.f32();
  ForEachImage(args, s, [&](std::int64_t n, float* scratch) HWY_ATTR {
    const float* dyn = dy + n * pooled;
    float* dxn = dx + n * image;
    if (!a.channels_last) { // dy [OH*OW, C] to [C, OH*OW] in scratch
      transpose_detail::Transpose2D(dyn, s.C, scratch, pixels, pixels, s.C);
      AvgPoolGradPlanes(scratch, dxn, s.nchw, s.C);
    } else if (a.pooled_channels_last()) {
      AvgPoolGradImageNhwc(dyn, dxn, s.nhwc);
    } else { // dy [C, OH*OW] to [OH*OW, C] in scratch
      transpose_detail::Transpose2D(dyn, pixels, scratch, s.C, s.C, pixels);
      AvgPoolGradImageNhwc(scratch, dxn, s.nhwc);
    }
  });
}

} // namespace pool_detail

/// avgpool2d: window sum / (kernel*kernel), padding included as zeros.
inline void AvgPool2dKernel(const KernelArgs& args) { pool_detail::PoolForward<false>(args); }

/// avgpool2d_grad: dy -> dx of out.shape, dy/(kernel*kernel) spread over each window.
inline void AvgPool2dGradKernel(const KernelArgs& args) { pool_detail::AvgPoolGrad(args); }

/// Puts this target's pooling kernels and their gradients into the table.
inline void RegisterPoolKernels(KernelTable& table) {
  table.add(Op::MaxPool2d, {"maxpool2d", &pool_detail::PoolForward<true>, &pool_accepts<false>});
  table.add(Op::MaxPool2d,
            {"maxpool2d.channels_last", &pool_detail::MaxPoolForwardNhwc, &pool_accepts<true>});
  table.add(Op::MaxPool2dGrad, {"maxpool2d_grad", &pool_detail::MaxPoolGrad, &pool_accepts<false>});
  table.add(Op::MaxPool2dGrad,
            {"maxpool2d_grad.channels_last", &pool_detail::MaxPoolGradNhwc, &pool_accepts<true>});
  table.add(Op::AvgPool2d, {"avgpool2d", &AvgPool2dKernel, &pool_accepts<false>});
  table.add(Op::AvgPool2d, {"avgpool2d.other_layouts", &pool_detail::AvgPoolOtherLayouts,
                            &pool_in_other_layouts, &pooled_image_workspace});
  table.add(Op::AvgPool2dGrad, {"avgpool2d_grad", &AvgPool2dGradKernel, &pool_accepts<false>});
  table.add(Op::AvgPool2dGrad,
            {"avgpool2d_grad.other_layouts", &pool_detail::AvgPoolGradOtherLayouts,
             &pool_in_other_layouts, &pooled_image_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
