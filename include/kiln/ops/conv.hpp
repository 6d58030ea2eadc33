// 2-D convolution (NCHW input, OIHW weight) and its two gradients; their channels-last
// forms, which only the layout pass builds.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/ops/program_check.hpp"

namespace kiln {

/// Bytes of column matrix an NCHW convolution kernel writes and reads back: for every image,
/// C x KH x KW rows of OH x OW pixels (none for channels-last kernels, which read the image
/// in place). `x` is the image (dx for the input gradient), `y` the output (dy for the
/// gradients); the layout pass weighs this, and fusion_bench counts it as traffic.
inline std::int64_t column_matrix_bytes(const Conv2dAttrs& a, const Shape& x, const Shape& y) {
  if (a.channels_last) return 0;
  const std::int64_t columns = x[0] * x[1] * a.kernel_h * a.kernel_w * y[2] * y[3];
  return 2 * columns * static_cast<std::int64_t>(sizeof(float));
}

namespace detail {
/// A convolution whose kernel writes each image's output once, after its GEMM (see
/// EpilogueRunner::result_target), may take over the memory of its epilogue's first operand
/// (the relu mask's activation after an input gradient, a residual).
inline int epilogue_operand_overwritable(const Attrs& attrs) {
  const auto* a = std::get_if<Conv2dAttrs>(&attrs);
  return a && !a->epilogue.empty() ? anchor_arity : -1;
}

/// What conv2d and both its gradients share: an anchor with a channels-last form.
struct ConvolutionDefaults : OpDefaults {
  static constexpr int arity = -1; // 2, plus its epilogue's inputs
  static constexpr FusionKind kind = FusionKind::anchor;
  static constexpr LayoutRule layout = LayoutRule::convolution;
  static Attrs channels_last_attrs(const Attrs& attrs) {
    Conv2dAttrs a = std::get<Conv2dAttrs>(attrs);
    a.channels_last = true;
    return a;
  }
};

/// Multiply-adds of a convolution or either gradient, times two: every element of y (dy) meets
/// C x KH x KW weights, all of w's elements but one output channel's worth.
inline std::int64_t conv_flops(const CostContext& c, const Shape& y, const Shape& w) {
  const std::int64_t out_channels = std::get<Conv2dAttrs>(c.attrs).channels_last ? y[3] : y[1];
  if (out_channels == 0) return 0;
  return 2 * y.numel() * (w.numel() / out_channels) + epilogue_flops(c);
}

inline std::int64_t conv_out_size(std::int64_t in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}
inline void check_conv_geometry(const InferContext& c, const Conv2dAttrs& a) {
  if (a.stride_h < 1 || a.stride_w < 1 || a.pad_h < 0 || a.pad_w < 0)
    c.fail(errc::attr, "stride must be >= 1 and padding >= 0");
}
/// Logical NCHW sizes of a channels-last [N, H, W, C] shape (identity otherwise).
inline Shape nchw_of(const Shape& s, bool channels_last) {
  return channels_last ? Shape{s[0], s[3], s[1], s[2]} : s;
}
inline Shape stored_as(const Shape& nchw, bool channels_last) {
  return channels_last ? Shape{nchw[0], nchw[2], nchw[3], nchw[1]} : nchw;
}
/// OIHW sizes of a conv2d weight input: OIHW itself, or pre-packed [KH, KW, C, O].
inline Shape oihw_of_forward_weight(const Shape& w, bool channels_last) {
  return channels_last ? Shape{w[3], w[2], w[0], w[1]} : w;
}
/// OIHW sizes of a conv2d_grad_input weight input: OIHW itself, or pre-packed [KH, KW, O, C].
inline Shape oihw_of_backward_weight(const Shape& w, bool channels_last) {
  return channels_last ? Shape{w[2], w[3], w[0], w[1]} : w;
}
} // namespace detail

template <> struct OpDef<Op::Conv2d> : detail::ConvolutionDefaults {
  /// x and y NHWC; the weight packed to [KH, KW, C, O].
  static constexpr ChannelsLastForm channels_last_form{
      {true, false}, true, 1, {2, 3, 1, 0}, "HWIO"};
  static std::int64_t column_matrix_bytes(const CostContext& c) {
    return kiln::column_matrix_bytes(std::get<Conv2dAttrs>(c.attrs), c.in[0], c.out);
  }
  static std::int64_t flops(const CostContext& c) { return detail::conv_flops(c, c.out, c.in[1]); }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_dtype(0, DType::f32);
    c.expect_dtype(1, DType::f32);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    detail::check_conv_geometry(c, a);
    const Shape x = detail::nchw_of(c.in(0).shape, a.channels_last);
    const Shape w = detail::oihw_of_forward_weight(c.in(1).shape, a.channels_last);
    if (x[1] != w[1])
      c.fail(errc::shape, "input has " + std::to_string(x[1]) + " channels, weight expects " +
                              std::to_string(w[1]));
    const std::int64_t oh =
        detail::conv_out_size(x[2], static_cast<int>(w[2]), a.stride_h, a.pad_h);
    const std::int64_t ow =
        detail::conv_out_size(x[3], static_cast<int>(w[3]), a.stride_w, a.pad_w);
    if (oh < 1 || ow < 1)
      c.fail(errc::shape, "kernel " + w.str() + " is larger than the padded input");
    const Shape y = detail::stored_as(Shape{x[0], w[0], oh, ow}, a.channels_last);
    detail::check_epilogue(c, a.epilogue, y);
    return TensorType{y, DType::f32};
  }
  static void grad(GradContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    if (!a.epilogue.empty() || a.channels_last)
      fail(errc::graph, "conv2d with a fused epilogue or a channels-last layout has no gradient "
                        "(passes run after autodiff)");
    if (c.wants(0)) c.dx[0] = conv2d_grad_input(c.dy, c.in(1), a);
    if (c.wants(1)) c.dx[1] = conv2d_grad_weight(c.in(0), c.dy, a);
  }
  static int overwritable_input(const Attrs& attrs) {
    return detail::epilogue_operand_overwritable(attrs);
  }
};

/// dx = conv2d_grad_input(dy, w): the input gradient, of size attrs.input_h x input_w.
template <> struct OpDef<Op::Conv2dGradInput> : detail::ConvolutionDefaults {
  /// dy and dx NHWC; the weight packed to [KH, KW, O, C].
  static constexpr ChannelsLastForm channels_last_form{
      {true, false}, true, 1, {2, 3, 0, 1}, "HWOI"};
  static std::int64_t column_matrix_bytes(const CostContext& c) {
    return kiln::column_matrix_bytes(std::get<Conv2dAttrs>(c.attrs), c.out, c.in[0]);
  }
  static std::int64_t flops(const CostContext& c) {
    return detail::conv_flops(c, c.in[0], c.in[1]);
  }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    const Shape dy = detail::nchw_of(c.in(0).shape, a.channels_last);
    const Shape w = detail::oihw_of_backward_weight(c.in(1).shape, a.channels_last);
    if (dy[1] != w[0]) c.fail(errc::shape, "gradient channels differ from weight outputs");
    const Shape dx = detail::stored_as(Shape{dy[0], w[1], a.input_h, a.input_w}, a.channels_last);
    detail::check_epilogue(c, a.epilogue, dx);
    return TensorType{dx, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
  static int overwritable_input(const Attrs& attrs) {
    return detail::epilogue_operand_overwritable(attrs);
  }
};

/// dw = conv2d_grad_weight(x, dy): the weight gradient, OIHW.
template <> struct OpDef<Op::Conv2dGradWeight> : detail::ConvolutionDefaults {
  /// x and dy NHWC; dW stays OIHW.
  static constexpr ChannelsLastForm channels_last_form{{true, true}, false, -1, {}, ""};
  static std::int64_t column_matrix_bytes(const CostContext& c) {
    return kiln::column_matrix_bytes(std::get<Conv2dAttrs>(c.attrs), c.in[0], c.in[1]);
  }
  static std::int64_t flops(const CostContext& c) { return detail::conv_flops(c, c.in[1], c.out); }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    const Shape x = detail::nchw_of(c.in(0).shape, a.channels_last);
    const Shape dy = detail::nchw_of(c.in(1).shape, a.channels_last);
    if (x[0] != dy[0]) c.fail(errc::shape, "batch sizes differ");
    const Shape dw{dy[1], x[1], a.kernel_h, a.kernel_w};
    detail::check_epilogue(c, a.epilogue, dw);
    return TensorType{dw, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

inline Value conv2d(Value x, Value w, Conv2dOptions options) {
  if (!x.valid() || !w.valid() || x.graph != w.graph)
    fail(errc::argument, "conv2d: values must belong to one graph");
  Conv2dAttrs a;
  a.stride_h = a.stride_w = options.stride;
  a.pad_h = a.pad_w = options.padding;
  if (x.shape().rank() == 4 && w.shape().rank() == 4) {
    a.kernel_h = static_cast<int>(w.shape()[2]);
    a.kernel_w = static_cast<int>(w.shape()[3]);
    a.input_h = x.shape()[2];
    a.input_w = x.shape()[3];
  }
  return append(*x.graph, Op::Conv2d, {x.id, w.id}, a);
}

inline Value conv2d_grad_input(Value dy, Value w, const Conv2dAttrs& attrs) {
  return append(*dy.graph, Op::Conv2dGradInput, {dy.id, w.id}, attrs);
}

inline Value conv2d_grad_weight(Value x, Value dy, const Conv2dAttrs& attrs) {
  return append(*x.graph, Op::Conv2dGradWeight, {x.id, dy.id}, attrs);
}

} // namespace kiln
