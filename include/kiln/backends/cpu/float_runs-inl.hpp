// Whole-vector copy, zero-fill and add of float runs of any length; re-included per target.
#if defined(KILN_CPU_FLOAT_RUNS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_FLOAT_RUNS_INL_H_
#undef KILN_CPU_FLOAT_RUNS_INL_H_
#else
#define KILN_CPU_FLOAT_RUNS_INL_H_
#endif

#include <cstddef>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Copies n floats with whole vectors; a ragged end is covered by one more vector that
/// overlaps the previous one and rewrites a few floats with the same values. (Masked stores
/// would be the other way, but are slow on AMD cores.)
HWY_INLINE void CopyFloats(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  if (n < lanes) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::LoadU(d, src + i), d, dst + i);
  if (i < n) hn::StoreU(hn::LoadU(d, src + n - lanes), d, dst + n - lanes);
}

/// Sets n floats to zero, like CopyFloats.
HWY_INLINE void ZeroFloats(float* HWY_RESTRICT dst, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  if (n < lanes) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = 0.0f;
    return;
  }
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Zero(d), d, dst + i);
  if (i < n) hn::StoreU(hn::Zero(d), d, dst + n - lanes);
}

/// dst[i] += src[i] for n floats: full vectors, then 128-bit ones, then scalars.
HWY_INLINE void AddFloats(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, std::size_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 4> d4;
  const std::size_t lanes = hn::Lanes(d), lanes4 = hn::Lanes(d4);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, dst + i), hn::LoadU(d, src + i)), d, dst + i);
  }
  for (; i + lanes4 <= n; i += lanes4) {
    hn::StoreU(hn::Add(hn::LoadU(d4, dst + i), hn::LoadU(d4, src + i)), d4, dst + i);
  }
  for (; i < n; ++i) dst[i] += src[i];
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
