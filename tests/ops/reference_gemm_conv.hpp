// Scalar reference implementations of matmul and the 2-D convolutions, for the kernel tests.
#pragma once

#include <cstddef>
#include <vector>

namespace kiln::test::ref {

/// out[M,N] = op(A) · op(B); A is stored [K,M] when ta, B is stored [N,K] when tb.
inline std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b,
                                 std::size_t m, std::size_t n, std::size_t k, bool ta, bool tb) {
  std::vector<float> out(m * n);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (std::size_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      out[i * n + j] = static_cast<float>(sum);
    }
  }
  return out;
}

/// Geometry of a test convolution: x [n,c,h,w], w [o,c,kh,kw], y [n,o,oh(),ow()].
struct ConvShape {
  std::size_t n, c, h, w, o, kh, kw;
  std::size_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;

  [[nodiscard]] std::size_t oh() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  [[nodiscard]] std::size_t ow() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
};

/// Calls f(yi, xi, wi), flat indices into y, x and the weight, for every tap of the
/// convolution that reads a real input pixel; taps on the zero padding contribute nothing.
template <class F> void for_each_tap(const ConvShape& s, F&& f) {
  const std::size_t oh = s.oh(), ow = s.ow();
  for (std::size_t n = 0; n < s.n; ++n) {
    for (std::size_t o = 0; o < s.o; ++o) {
      for (std::size_t i = 0; i < oh; ++i) {
        for (std::size_t j = 0; j < ow; ++j) {
          const std::size_t yi = ((n * s.o + o) * oh + i) * ow + j;
          for (std::size_t c = 0; c < s.c; ++c) {
            for (std::size_t ki = 0; ki < s.kh; ++ki) {
              for (std::size_t kj = 0; kj < s.kw; ++kj) {
                const std::size_t ih = i * s.stride_h + ki, iw = j * s.stride_w + kj;
                if (ih < s.pad_h || iw < s.pad_w || ih - s.pad_h >= s.h || iw - s.pad_w >= s.w)
                  continue;
                const std::size_t xi = ((n * s.c + c) * s.h + ih - s.pad_h) * s.w + iw - s.pad_w;
                const std::size_t wi = ((o * s.c + c) * s.kh + ki) * s.kw + kj;
                f(yi, xi, wi);
              }
            }
          }
        }
      }
    }
  }
}

/// y = conv2d(x, w), zero padding, no bias.
inline std::vector<float> conv2d(const ConvShape& s, const std::vector<float>& x,
                                 const std::vector<float>& w) {
  std::vector<double> y(s.n * s.o * s.oh() * s.ow(), 0.0);
  for_each_tap(s, [&](std::size_t yi, std::size_t xi, std::size_t wi) {
    y[yi] += static_cast<double>(x[xi]) * w[wi];
  });
  return {y.begin(), y.end()};
}

/// dx of conv2d given dy and w.
inline std::vector<float> conv2d_grad_input(const ConvShape& s, const std::vector<float>& dy,
                                            const std::vector<float>& w) {
  std::vector<double> dx(s.n * s.c * s.h * s.w, 0.0);
  for_each_tap(s, [&](std::size_t yi, std::size_t xi, std::size_t wi) {
    dx[xi] += static_cast<double>(dy[yi]) * w[wi];
  });
  return {dx.begin(), dx.end()};
}

/// dw of conv2d given x and dy.
inline std::vector<float> conv2d_grad_weight(const ConvShape& s, const std::vector<float>& x,
                                             const std::vector<float>& dy) {
  std::vector<double> dw(s.o * s.c * s.kh * s.kw, 0.0);
  for_each_tap(s, [&](std::size_t yi, std::size_t xi, std::size_t wi) {
    dw[wi] += static_cast<double>(x[xi]) * dy[yi];
  });
  return {dw.begin(), dw.end()};
}

} // namespace kiln::test::ref
