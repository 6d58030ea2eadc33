// 2-D convolution (NCHW input, OIHW weight) and its two gradients.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/ops/program_check.hpp"

namespace kiln {

namespace detail {
inline std::int64_t conv_out_size(std::int64_t in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}
inline void check_conv_geometry(const InferContext& c, const Conv2dAttrs& a) {
  if (a.stride_h < 1 || a.stride_w < 1 || a.pad_h < 0 || a.pad_w < 0)
    c.fail(errc::attr, "stride must be >= 1 and padding >= 0");
}
} // namespace detail

template <> struct OpDef<Op::Conv2d> : OpDefaults {
  static constexpr int arity = -1; // 2, plus its epilogue's inputs
  static constexpr FusionKind kind = FusionKind::anchor;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_dtype(0, DType::f32);
    c.expect_dtype(1, DType::f32);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    detail::check_conv_geometry(c, a);
    const Shape& x = c.in(0).shape;
    const Shape& w = c.in(1).shape;
    if (x[1] != w[1])
      c.fail(errc::shape, "input has " + std::to_string(x[1]) + " channels, weight expects " +
                              std::to_string(w[1]));
    const std::int64_t oh =
        detail::conv_out_size(x[2], static_cast<int>(w[2]), a.stride_h, a.pad_h);
    const std::int64_t ow =
        detail::conv_out_size(x[3], static_cast<int>(w[3]), a.stride_w, a.pad_w);
    if (oh < 1 || ow < 1)
      c.fail(errc::shape, "kernel " + w.str() + " is larger than the padded input");
    const Shape y{x[0], w[0], oh, ow};
    detail::check_epilogue(c, a.epilogue, y);
    return TensorType{y, DType::f32};
  }
  static void grad(GradContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    if (!a.epilogue.empty()) fail(errc::graph, "conv2d with a fused epilogue has no gradient");
    if (c.wants(0)) c.dx[0] = conv2d_grad_input(c.dy, c.in(1), a);
    if (c.wants(1)) c.dx[1] = conv2d_grad_weight(c.in(0), c.dy, a);
  }
};

/// dx = conv2d_grad_input(dy, w): the input gradient, of size attrs.input_h x input_w.
template <> struct OpDef<Op::Conv2dGradInput> : OpDefaults {
  static constexpr int arity = -1; // 2, plus its epilogue's inputs
  static constexpr FusionKind kind = FusionKind::anchor;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    const Shape& dy = c.in(0).shape;
    const Shape& w = c.in(1).shape;
    if (dy[1] != w[0]) c.fail(errc::shape, "gradient channels differ from weight outputs");
    const Shape dx{dy[0], w[1], a.input_h, a.input_w};
    detail::check_epilogue(c, a.epilogue, dx);
    return TensorType{dx, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

/// dw = conv2d_grad_weight(x, dy): the weight gradient, OIHW.
template <> struct OpDef<Op::Conv2dGradWeight> : OpDefaults {
  static constexpr int arity = -1; // 2, plus its epilogue's inputs
  static constexpr FusionKind kind = FusionKind::anchor;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<Conv2dAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_rank(0, 4);
    c.expect_rank(1, 4);
    const Shape& x = c.in(0).shape;
    const Shape& dy = c.in(1).shape;
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
  return x.graph->append(Op::Conv2d, {x.id, w.id}, a);
}

inline Value conv2d_grad_input(Value dy, Value w, const Conv2dAttrs& attrs) {
  return dy.graph->append(Op::Conv2dGradInput, {dy.id, w.id}, attrs);
}

inline Value conv2d_grad_weight(Value x, Value dy, const Conv2dAttrs& attrs) {
  return x.graph->append(Op::Conv2dGradWeight, {x.id, dy.id}, attrs);
}

} // namespace kiln
