// The sizes of one convolution call, read from the shapes of conv2d or either gradient in
// whichever layout it runs: what every backend's convolution kernels and their rules start from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <variant>

#include "kiln/plan/backend.hpp"

namespace kiln {

/// Sizes of one convolution, whichever of conv2d / its gradients is being run.
struct ConvGeometry {
  std::size_t batch = 0, c = 0, h = 0, w = 0; // input x
  std::size_t o = 0, kh = 0, kw = 0;          // weight [O, C, KH, KW]
  std::size_t oh = 0, ow = 0;                 // output y
  std::size_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool channels_last = false; // activations [N, H, W, C]; see Conv2dAttrs

  /// Rows of the column matrix: one per (input channel, kernel row, kernel column).
  [[nodiscard]] std::size_t ckk() const { return c * kh * kw; }
  /// Output pixels per image: the columns of the column matrix.
  [[nodiscard]] std::size_t pixels() const { return oh * ow; }
  /// 1x1, stride 1, no padding: the column matrix is the image itself.
  [[nodiscard]] bool pointwise() const {
    return kh == 1 && kw == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
  }
};

/// Reads the geometry from the shapes of a Conv2d, Conv2dGradInput or Conv2dGradWeight call
/// (a KernelArgs or a KernelQuery).
template <class Call> ConvGeometry conv_geometry(Op op, const Call& args) {
  ConvGeometry g;
  const auto* attrs = args.attrs ? std::get_if<Conv2dAttrs>(args.attrs) : nullptr;
  if (attrs) {
    g.channels_last = attrs->channels_last;
    g.stride_h = static_cast<std::size_t>(attrs->stride_h);
    g.stride_w = static_cast<std::size_t>(attrs->stride_w);
    g.pad_h = static_cast<std::size_t>(attrs->pad_h);
    g.pad_w = static_cast<std::size_t>(attrs->pad_w);
  }
  const auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  // x / dx, the weight / its gradient, and y / dy, wherever this op keeps them.
  const Shape& x = op == Op::Conv2dGradInput ? args.out.shape : args.in[0].shape;
  const Shape& w = op == Op::Conv2dGradWeight ? args.out.shape : args.in[1].shape;
  const Shape& y = op == Op::Conv2d            ? args.out.shape
                   : op == Op::Conv2dGradInput ? args.in[0].shape
                                               : args.in[1].shape;
  g.batch = u(x[0]);
  if (g.channels_last) {
    g.h = u(x[1]);
    g.w = u(x[2]);
    g.c = u(x[3]);
    g.oh = u(y[1]);
    g.ow = u(y[2]);
    g.o = u(y[3]);
    // Pre-packed [KH, KW, ...] weights, or the OIHW weight gradient.
    g.kh = u(op == Op::Conv2dGradWeight ? w[2] : w[0]);
    g.kw = u(op == Op::Conv2dGradWeight ? w[3] : w[1]);
    return g;
  }
  g.c = u(x[1]);
  g.h = u(x[2]);
  g.w = u(x[3]);
  g.o = u(w[0]);
  g.kh = u(w[2]);
  g.kw = u(w[3]);
  g.oh = u(y[2]);
  g.ow = u(y[3]);
  return g;
}

} // namespace kiln
