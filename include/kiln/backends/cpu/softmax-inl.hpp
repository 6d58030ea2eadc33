// Per-target softmax kernels; re-included once per Highway target by implementation.hpp.
#if defined(KILN_CPU_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_SOFTMAX_INL_H_
#undef KILN_CPU_SOFTMAX_INL_H_
#else
#define KILN_CPU_SOFTMAX_INL_H_
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <hwy/highway.h>

#include "hwy/contrib/math/math-inl.h"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/rows.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace softmax_detail {

/// Elements a parallel task should at least touch to pay for its scheduling.
inline constexpr std::int64_t kMinTaskElements = 16384;

/// Calls f(row) for every row, in parallel.
template <class F> inline void ForEachRow(Rows r, const F& f) {
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinTaskElements / std::max<std::int64_t>(1, r.cols));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, r.rows, grain),
                    [&](const tbb::blocked_range<std::int64_t>& b) HWY_ATTR {
                      for (std::int64_t i = b.begin(); i != b.end(); ++i) f(i);
                    });
}

/// Applies f(d, offset) over [0, n): full vectors, then one lane at a time, so tails run
/// the same arithmetic as the body without reading past the row.
template <class F> HWY_INLINE void ForEachChunk(std::int64_t n, const F& f) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) f(d, i);
  for (; i < n; ++i) f(d1, i);
}

inline float RowMax(const float* x, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto m = hn::Set(d, neg_inf);
  auto m1 = hn::Set(d1, neg_inf);
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::LoadU(d, x + i));
  for (; i < n; ++i) m1 = hn::Max(m1, hn::LoadU(d1, x + i));
  return std::max(hn::GetLane(hn::MaxOfLanes(d, m)), hn::GetLane(m1));
}

inline float RowSum(const float* x, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  auto s = hn::Zero(d);
  auto s1 = hn::Zero(d1);
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) s = hn::Add(s, hn::LoadU(d, x + i));
  for (; i < n; ++i) s1 = hn::Add(s1, hn::LoadU(d1, x + i));
  return hn::GetLane(hn::SumOfLanes(d, s)) + hn::GetLane(s1);
}

/// log(sum(exp(x))) of one row, shifted by the row max so exp cannot overflow.
inline float RowLogSumExp(const float* x, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const float m = RowMax(x, n);
  auto s = hn::Zero(d);
  auto s1 = hn::Zero(d1);
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N)
    s = hn::Add(s, hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), hn::Set(d, m))));
  for (; i < n; ++i) s1 = hn::Add(s1, hn::Exp(d1, hn::Sub(hn::LoadU(d1, x + i), hn::Set(d1, m))));
  return m + std::log(hn::GetLane(hn::SumOfLanes(d, s)) + hn::GetLane(s1));
}

inline void LogSoftmax(const KernelArgs& args) {
  const Rows r = rows_of(args.in[0].shape);
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  ForEachRow(r, [&](std::int64_t i) HWY_ATTR {
    const float* xr = x + i * r.cols;
    float* yr = y + i * r.cols;
    const float lse = RowLogSumExp(xr, r.cols);
    ForEachChunk(r.cols, [&](auto d, std::int64_t j) HWY_ATTR {
      hn::StoreU(hn::Sub(hn::LoadU(d, xr + j), hn::Set(d, lse)), d, yr + j);
    });
  });
}

inline void LogSoftmaxGrad(const KernelArgs& args) {
  const Rows r = rows_of(args.in[0].shape);
  const float* y = args.in[0].f32();
  const float* dy = args.in[1].f32();
  float* dx = args.out.f32();
  ForEachRow(r, [&](std::int64_t i) HWY_ATTR {
    const float* yr = y + i * r.cols;
    const float* dyr = dy + i * r.cols;
    float* dxr = dx + i * r.cols;
    const float sum = RowSum(dyr, r.cols);
    ForEachChunk(r.cols, [&](auto d, std::int64_t j) HWY_ATTR {
      const auto p = hn::Exp(d, hn::LoadU(d, yr + j));
      hn::StoreU(hn::NegMulAdd(p, hn::Set(d, sum), hn::LoadU(d, dyr + j)), d, dxr + j);
    });
  });
}

/// The mean over rows of logsumexp(row) - row[label], written to *loss; on_row(i, lse) runs
/// for every row too. A deterministic reduction: the loss must not depend on the thread
/// count, and the fused and separate kernels give the same bits.
template <class OnRow>
void MeanCrossEntropy(const Rows& r, const float* x, const std::int32_t* labels, float* loss,
                      const OnRow& on_row) {
  if (r.rows == 0) {
    // The mean over no rows is 0/0.
    *loss = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / r.cols);
  const double total = tbb::parallel_deterministic_reduce(
      tbb::blocked_range<std::int64_t>(0, r.rows, grain), 0.0,
      [&](const tbb::blocked_range<std::int64_t>& b, double acc) HWY_ATTR {
        for (std::int64_t i = b.begin(); i != b.end(); ++i) {
          const float* xr = x + i * r.cols;
          const float lse = RowLogSumExp(xr, r.cols);
          acc += static_cast<double>(lse - xr[labels[i]]);
          on_row(i, lse);
        }
        return acc;
      },
      [](double a, double b) { return a + b; });
  *loss = static_cast<float>(total / static_cast<double>(r.rows));
}

inline void SoftmaxCrossEntropy(const KernelArgs& args) {
  MeanCrossEntropy(rows_of(args.in[0].shape), args.in[0].f32(), args.in[1].i32(), args.out.f32(),
                   [](std::int64_t, float) {});
}

/// One row of the gradient: (softmax(x) - onehot(label)) * scale, given the row's lse.
HWY_INLINE void CrossEntropyGradRow(const float* xr, std::int64_t cols, float lse,
                                    std::int32_t label, float scale, float* dxr) {
  ForEachChunk(cols, [&](auto d, std::int64_t j) HWY_ATTR {
    const auto p = hn::Exp(d, hn::Sub(hn::LoadU(d, xr + j), hn::Set(d, lse)));
    hn::StoreU(hn::Mul(p, hn::Set(d, scale)), d, dxr + j);
  });
  dxr[label] -= scale;
}

inline void SoftmaxCrossEntropyGrad(const KernelArgs& args) {
  const Rows r = rows_of(args.in[0].shape);
  const float* x = args.in[0].f32();
  const std::int32_t* labels = args.in[1].i32();
  const float scale = *args.in[2].f32() / static_cast<float>(std::max<std::int64_t>(1, r.rows));
  float* dx = args.out.f32();
  ForEachRow(r, [&](std::int64_t i) HWY_ATTR {
    const float* xr = x + i * r.cols;
    CrossEntropyGradRow(xr, r.cols, RowLogSumExp(xr, r.cols), labels[i], scale, dx + i * r.cols);
  });
}

/// The gradient rows and the mean loss from one logsumexp per row; the loss is summed in
/// the same deterministic order as SoftmaxCrossEntropy, so both give the same bits.
inline void SoftmaxCrossEntropyWithGrad(const KernelArgs& args) {
  const Rows r = rows_of(args.in[0].shape);
  const float* x = args.in[0].f32();
  const std::int32_t* labels = args.in[1].i32();
  const float scale = *args.in[2].f32() / static_cast<float>(std::max<std::int64_t>(1, r.rows));
  float* dx = args.out.f32();
  MeanCrossEntropy(r, x, labels, dx + r.rows * r.cols, [&](std::int64_t i, float lse) HWY_ATTR {
    CrossEntropyGradRow(x + i * r.cols, r.cols, lse, labels[i], scale, dx + i * r.cols);
  });
}

} // namespace softmax_detail

/// log_softmax over the last dim: x - logsumexp(row).
inline void LogSoftmaxKernel(const KernelArgs& args) { softmax_detail::LogSoftmax(args); }

/// log_softmax_grad: (y, dy) -> dy - exp(y) * sum(dy) per row.
inline void LogSoftmaxGradKernel(const KernelArgs& args) { softmax_detail::LogSoftmaxGrad(args); }

/// softmax_cross_entropy: (logits [N,K], labels [N] i32) -> mean NLL of softmax, rank 0.
inline void SoftmaxCrossEntropyKernel(const KernelArgs& args) {
  softmax_detail::SoftmaxCrossEntropy(args);
}

/// softmax_cross_entropy_grad: (logits, labels, dloss) -> (softmax - onehot) * dloss / N.
inline void SoftmaxCrossEntropyGradKernel(const KernelArgs& args) {
  softmax_detail::SoftmaxCrossEntropyGrad(args);
}

/// softmax_cross_entropy_with_grad: (logits, labels, dloss) -> [gradient..., loss].
inline void SoftmaxCrossEntropyWithGradKernel(const KernelArgs& args) {
  softmax_detail::SoftmaxCrossEntropyWithGrad(args);
}

/// Puts this target's log_softmax and softmax cross-entropy kernels into the table.
inline void RegisterSoftmaxKernels(KernelTable& table) {
  table.add(Op::LogSoftmax, {"log_softmax", &LogSoftmaxKernel});
  table.add(Op::LogSoftmaxGrad, {"log_softmax_grad", &LogSoftmaxGradKernel});
  table.add(Op::SoftmaxCrossEntropy, {"softmax_cross_entropy", &SoftmaxCrossEntropyKernel});
  table.add(Op::SoftmaxCrossEntropyGrad,
            {"softmax_cross_entropy_grad", &SoftmaxCrossEntropyGradKernel});
  table.add(Op::SoftmaxCrossEntropyWithGrad,
            {"softmax_cross_entropy_with_grad", &SoftmaxCrossEntropyWithGradKernel});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
