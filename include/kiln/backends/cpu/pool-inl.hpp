// Per-target pool kernels; re-included once per Highway target by implementation.hpp.
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

#include "kiln/backends/cpu/kernel_table.hpp"

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
            acc = kMax ? hn::Max(acc, v) : hn::Add(acc, v);
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
          acc = kMax ? std::max(acc, v) : acc + v;
        }
      yr[ow] = acc * scale;
    });
  }
}

template <bool kMax> inline void PoolForward(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const Geometry g = MakeGeometry(args.in[0].shape, args.out.shape, a);
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  ForEachPlane(g, out_plane * g.k * g.k, [&](std::int64_t c) HWY_ATTR {
    if (g.s == 1) {
      PoolPlane<kMax, 1>(x + c * in_plane, y + c * out_plane, g);
    } else if (g.s == 2) {
      PoolPlane<kMax, 2>(x + c * in_plane, y + c * out_plane, g);
    } else {
      PoolPlane<kMax, 0>(x + c * in_plane, y + c * out_plane, g);
    }
  });
}

/// Zeroes the input positions no 2x2/stride-2 window covers: the last row and column of an
/// odd-sized plane.
inline void ZeroUncovered2x2(float* dx, const Geometry& g) {
  for (std::int64_t ih = 0; ih < 2 * g.OH; ++ih)
    std::fill(dx + ih * g.W + 2 * g.OW, dx + (ih + 1) * g.W, 0.0f);
  std::fill(dx + 2 * g.OH * g.W, dx + g.H * g.W, 0.0f);
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
      // Which tap holds the first maximum, as 0..3 in scan order; strict > keeps the first.
      auto best = a0;
      auto which = hn::Zero(d);
      auto gt = hn::Gt(a1, best);
      best = hn::IfThenElse(gt, a1, best);
      which = hn::IfThenElse(gt, hn::Set(d, 1.0f), which);
      gt = hn::Gt(b0, best);
      best = hn::IfThenElse(gt, b0, best);
      which = hn::IfThenElse(gt, hn::Set(d, 2.0f), which);
      gt = hn::Gt(b1, best);
      which = hn::IfThenElse(gt, hn::Set(d, 3.0f), which);
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

inline void AvgPoolGrad(const KernelArgs& args) {
  const auto& a = *std::get_if<Pool2dAttrs>(args.attrs);
  const Geometry g = MakeGeometry(args.out.shape, args.in[0].shape, a);
  const float* dy = args.in[0].f32();
  float* dx = args.out.f32();
  const std::int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  ForEachPlane(g, out_plane * g.k * g.k + in_plane, [&](std::int64_t c) HWY_ATTR {
    const float* dyc = dy + c * out_plane;
    float* dxc = dx + c * in_plane;
    if (g.k == 2 && g.s == 2 && g.p == 0) {
      AvgPoolGradPlane2x2(dyc, dxc, g);
    } else if (g.s == 1) {
      AvgPoolGradPlane<1>(dyc, dxc, g);
    } else if (g.s == 2) {
      AvgPoolGradPlane<2>(dyc, dxc, g);
    } else {
      AvgPoolGradPlane<0>(dyc, dxc, g);
    }
  });
}

} // namespace pool_detail

/// maxpool2d: x [N,C,H,W] -> [N,C,OH,OW], padding counts as -inf.
inline void MaxPool2dKernel(const KernelArgs& args) { pool_detail::PoolForward<true>(args); }

/// maxpool2d_grad: (x, dy) -> dx; dy goes to the first maximum of its window.
inline void MaxPool2dGradKernel(const KernelArgs& args) { pool_detail::MaxPoolGrad(args); }

/// avgpool2d: window sum / (kernel*kernel), padding included as zeros.
inline void AvgPool2dKernel(const KernelArgs& args) { pool_detail::PoolForward<false>(args); }

/// avgpool2d_grad: dy -> dx of out.shape, dy/(kernel*kernel) spread over each window.
inline void AvgPool2dGradKernel(const KernelArgs& args) { pool_detail::AvgPoolGrad(args); }

/// Puts this target's pooling kernels and their gradients into the table.
inline void RegisterPoolKernels(KernelTable& table) {
  table.run[op_index(Op::MaxPool2d)] = &MaxPool2dKernel;
  table.run[op_index(Op::MaxPool2dGrad)] = &MaxPool2dGradKernel;
  table.run[op_index(Op::AvgPool2d)] = &AvgPool2dKernel;
  table.run[op_index(Op::AvgPool2dGrad)] = &AvgPool2dGradKernel;
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
