// Naive scalar references of sum_to, pooling, log_softmax and softmax cross-entropy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/core/shape.hpp"
#include "kiln/ir/attrs.hpp"

namespace kiln::test::ref {

/// Output extent of a pooling window sweep over `in` input elements.
inline std::int64_t pool_out(std::int64_t in, const Pool2dAttrs& a) {
  return (in + 2 * a.padding - a.kernel) / a.stride + 1;
}

/// sum_to: sums x (shape `from`) down to `to` (same rank, each dim equal or 1), in double.
inline std::vector<float> sum_to(const std::vector<float>& x, const Shape& from, const Shape& to) {
  std::vector<double> acc(static_cast<std::size_t>(to.numel()), 0.0);
  const int rank = from.rank();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t flat = 0; flat < from.numel(); ++flat) {
    std::int64_t o = 0;
    for (int i = 0; i < rank; ++i)
      o = o * to[i] + (to[i] == 1 ? 0 : idx[static_cast<std::size_t>(i)]);
    acc[static_cast<std::size_t>(o)] += x[static_cast<std::size_t>(flat)];
    for (int i = rank - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < from[i]) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
  return {acc.begin(), acc.end()};
}

/// Calls f(plane, oh, ow, ih, iw) for every in-bounds tap of every window, in row-major
/// window scan order.
template <class F>
void for_each_tap(const Shape& x, const Pool2dAttrs& a, std::int64_t oh_n, std::int64_t ow_n, F f) {
  const std::int64_t planes = x[0] * x[1], H = x[2], W = x[3];
  for (std::int64_t c = 0; c < planes; ++c)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t kh = 0; kh < a.kernel; ++kh)
          for (std::int64_t kw = 0; kw < a.kernel; ++kw) {
            const std::int64_t ih = oh * a.stride - a.padding + kh;
            const std::int64_t iw = ow * a.stride - a.padding + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            f(c, oh, ow, ih, iw);
          }
}

/// maxpool2d; padding is -inf, and a window with a NaN tap is NaN.
inline std::vector<float> maxpool2d(const std::vector<float>& x, const Shape& xs,
                                    const Pool2dAttrs& a) {
  const std::int64_t OH = pool_out(xs[2], a), OW = pool_out(xs[3], a);
  std::vector<float> y(static_cast<std::size_t>(xs[0] * xs[1] * OH * OW),
                       -std::numeric_limits<float>::infinity());
  for_each_tap(xs, a, OH, OW, [&](auto c, auto oh, auto ow, auto ih, auto iw) {
    float& out = y[static_cast<std::size_t>((c * OH + oh) * OW + ow)];
    const float v = x[static_cast<std::size_t>((c * xs[2] + ih) * xs[3] + iw)];
    out = std::isnan(out) || std::isnan(v) ? std::numeric_limits<float>::quiet_NaN()
                                           : std::max(out, v);
  });
  return y;
}

/// maxpool2d_grad: dy goes to the first maximum of its window (among in-bounds taps).
inline std::vector<float> maxpool2d_grad(const std::vector<float>& x, const Shape& xs,
                                         const std::vector<float>& dy, const Pool2dAttrs& a) {
  const std::int64_t OH = pool_out(xs[2], a), OW = pool_out(xs[3], a);
  const auto out_n = static_cast<std::size_t>(xs[0] * xs[1] * OH * OW);
  std::vector<std::int64_t> arg(out_n, -1);
  std::vector<float> best(out_n, 0.0f);
  for_each_tap(xs, a, OH, OW, [&](auto c, auto oh, auto ow, auto ih, auto iw) {
    const auto o = static_cast<std::size_t>((c * OH + oh) * OW + ow);
    const std::int64_t at = (c * xs[2] + ih) * xs[3] + iw;
    const float v = x[static_cast<std::size_t>(at)];
    if (arg[o] < 0 || v > best[o]) {
      arg[o] = at;
      best[o] = v;
    }
  });
  std::vector<double> dx(x.size(), 0.0);
  for (std::size_t o = 0; o < out_n; ++o)
    if (arg[o] >= 0) dx[static_cast<std::size_t>(arg[o])] += dy[o];
  return {dx.begin(), dx.end()};
}

/// avgpool2d with count_include_pad: window sum / (kernel*kernel).
inline std::vector<float> avgpool2d(const std::vector<float>& x, const Shape& xs,
                                    const Pool2dAttrs& a) {
  const std::int64_t OH = pool_out(xs[2], a), OW = pool_out(xs[3], a);
  std::vector<double> y(static_cast<std::size_t>(xs[0] * xs[1] * OH * OW), 0.0);
  for_each_tap(xs, a, OH, OW, [&](auto c, auto oh, auto ow, auto ih, auto iw) {
    y[static_cast<std::size_t>((c * OH + oh) * OW + ow)] +=
        x[static_cast<std::size_t>((c * xs[2] + ih) * xs[3] + iw)];
  });
  std::vector<float> out(y.size());
  for (std::size_t i = 0; i < y.size(); ++i)
    out[i] = static_cast<float>(y[i] / (a.kernel * a.kernel));
  return out;
}

/// avgpool2d_grad: dy/(kernel*kernel) spread over each window; dx has shape xs.
inline std::vector<float> avgpool2d_grad(const std::vector<float>& dy, const Shape& xs,
                                         const Pool2dAttrs& a) {
  const std::int64_t OH = pool_out(xs[2], a), OW = pool_out(xs[3], a);
  std::vector<double> dx(static_cast<std::size_t>(xs.numel()), 0.0);
  for_each_tap(xs, a, OH, OW, [&](auto c, auto oh, auto ow, auto ih, auto iw) {
    dx[static_cast<std::size_t>((c * xs[2] + ih) * xs[3] + iw)] +=
        static_cast<double>(dy[static_cast<std::size_t>((c * OH + oh) * OW + ow)]) /
        (a.kernel * a.kernel);
  });
  return {dx.begin(), dx.end()};
}

/// logsumexp of one row, in double.
inline double logsumexp(const float* x, std::int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(x[j]));
  double s = 0.0;
  for (std::int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

/// log_softmax over the last dim of a tensor with `cols` elements per row.
inline std::vector<float> log_softmax(const std::vector<float>& x, std::int64_t cols) {
  std::vector<float> y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(cols); ++r) {
    const float* xr = x.data() + r * static_cast<std::size_t>(cols);
    const double lse = logsumexp(xr, cols);
    for (std::int64_t j = 0; j < cols; ++j)
      y[r * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j)] =
          static_cast<float>(xr[j] - lse);
  }
  return y;
}

/// log_softmax_grad: dy - exp(y) * sum(dy) per row.
inline std::vector<float> log_softmax_grad(const std::vector<float>& y,
                                           const std::vector<float>& dy, std::int64_t cols) {
  std::vector<float> dx(y.size());
  const auto n = static_cast<std::size_t>(cols);
  for (std::size_t r = 0; r < y.size() / n; ++r) {
    double s = 0.0;
    for (std::size_t j = 0; j < n; ++j) s += dy[r * n + j];
    for (std::size_t j = 0; j < n; ++j)
      dx[r * n + j] =
          static_cast<float>(dy[r * n + j] - std::exp(static_cast<double>(y[r * n + j])) * s);
  }
  return dx;
}

/// softmax_cross_entropy: mean over rows of logsumexp(row) - row[label].
inline float softmax_cross_entropy(const std::vector<float>& x,
                                   const std::vector<std::int32_t>& labels, std::int64_t cols) {
  double total = 0.0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const float* xr = x.data() + r * static_cast<std::size_t>(cols);
    total += logsumexp(xr, cols) - xr[labels[r]];
  }
  return static_cast<float>(total / static_cast<double>(labels.size()));
}

/// softmax_cross_entropy_grad: (softmax(row) - onehot(label)) * dloss / N.
inline std::vector<float> softmax_cross_entropy_grad(const std::vector<float>& x,
                                                     const std::vector<std::int32_t>& labels,
                                                     std::int64_t cols, float dloss) {
  std::vector<float> dx(x.size());
  const auto n = static_cast<std::size_t>(cols);
  const double scale = static_cast<double>(dloss) / static_cast<double>(labels.size());
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const float* xr = x.data() + r * n;
    const double lse = logsumexp(xr, cols);
    for (std::size_t j = 0; j < n; ++j) {
      const double onehot = static_cast<std::int32_t>(j) == labels[r] ? 1.0 : 0.0;
      dx[r * n + j] = static_cast<float>((std::exp(xr[j] - lse) - onehot) * scale);
    }
  }
  return dx;
}

} // namespace kiln::test::ref
