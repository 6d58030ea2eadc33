// Max and average pooling (square windows), their gradients, global average pooling. Both
// also run channels-last (NHWC); average pooling can also read one layout and write the other.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

namespace detail {
/// The pooled shape of x ([N,C,H,W], or [N,H,W,C] when channels_last): [N,C,OH,OW], or
/// [N,OH,OW,C] when the pooled tensor is channels-last.
inline Shape pool_output(const InferContext& c, const Shape& x) {
  const auto& a = c.attr<Pool2dAttrs>();
  if (a.kernel < 1 || a.stride < 1 || a.padding < 0 || 2 * a.padding > a.kernel)
    c.fail(errc::attr, "pooling needs kernel >= 1, stride >= 1, 0 <= padding <= kernel/2");
  const int h = a.channels_last ? 1 : 2;
  if (x[h] + 2 * a.padding < a.kernel || x[h + 1] + 2 * a.padding < a.kernel)
    c.fail(errc::shape,
           "window " + std::to_string(a.kernel) + " is larger than the (padded) input");
  const std::int64_t oh = (x[h] + 2 * a.padding - a.kernel) / a.stride + 1;
  const std::int64_t ow = (x[h + 1] + 2 * a.padding - a.kernel) / a.stride + 1;
  const std::int64_t channels = a.channels_last ? x[3] : x[1];
  return a.pooled_channels_last() ? Shape{x[0], oh, ow, channels} : Shape{x[0], channels, oh, ow};
}
inline TensorType infer_pool(const InferContext& c) {
  c.expect_dtype(0, DType::f32);
  c.expect_rank(0, 4);
  return TensorType{pool_output(c, c.in(0).shape), DType::f32};
}
/// Max pooling reads and writes one layout.
inline void expect_one_layout(const InferContext& c) {
  if (c.attr<Pool2dAttrs>().flip_pooled_layout)
    c.fail(errc::attr, "max pooling reads and writes one layout (flip_pooled_layout is for "
                       "average pooling)");
}
inline Pool2dAttrs pool_attrs(Value x, Pool2dOptions o) {
  Pool2dAttrs a{o.kernel, o.stride > 0 ? o.stride : o.kernel, o.padding, 0, 0, o.channels_last};
  if (x.shape().rank() == 4) {
    a.input_h = x.shape()[o.channels_last ? 1 : 2];
    a.input_w = x.shape()[o.channels_last ? 2 : 3];
  }
  return a;
}
} // namespace detail

/// Max pooling and its gradient run in either layout, flagged in their attributes.
struct MaxPoolDefaults : OpDefaults {
  static constexpr LayoutRule layout = LayoutRule::pool;
  static Attrs channels_last_attrs(const Attrs& attrs) {
    Pool2dAttrs a = std::get<Pool2dAttrs>(attrs);
    a.channels_last = true;
    return a;
  }
};

template <> struct OpDef<Op::MaxPool2d> : MaxPoolDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::reduction;
  static std::int64_t flops(const CostContext& c) {
    const int k = std::get<Pool2dAttrs>(c.attrs).kernel;
    return c.out.numel() * k * k;
  }
  static TensorType infer(const InferContext& c) {
    detail::expect_one_layout(c);
    return detail::infer_pool(c);
  }
  static void grad(GradContext& c) {
    c.dx[0] = max_pool2d_grad(c.in(0), c.dy, c.attr<Pool2dAttrs>());
  }
};

/// dx = max_pool2d_grad(x, dy): dy routed to the first maximum of each window (in row-major
/// window order). x and dx are [N,C,H,W], or [N,H,W,C] when channels_last.
template <> struct OpDef<Op::MaxPool2dGrad> : MaxPoolDefaults {
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::opaque;
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    c.expect_dtype(1, DType::f32);
    c.expect_rank(0, 4);
    detail::expect_one_layout(c);
    const Shape want = detail::pool_output(c, c.in(0).shape);
    if (!(c.in(1).shape == want))
      c.fail(errc::shape,
             "dy is " + c.in(1).shape.str() + ", the pooled shape of x is " + want.str());
    return c.in(0);
  }
  static constexpr GradFn grad = nullptr;
  /// Windows that tile the plane (2x2, stride 2, no padding) are each read, then written,
  /// once, in either layout: dx can overwrite x.
  static int overwritable_input(const Attrs& attrs) {
    const auto* a = std::get_if<Pool2dAttrs>(&attrs);
    return a && a->kernel == 2 && a->stride == 2 && a->padding == 0 ? 0 : -1;
  }
};

/// Average pooling and its gradient store each side in either layout: the unpooled tensor
/// (x, dx) at port kUnpooled, the pooled one (y, dy) at the other.
template <int kUnpooled> struct AvgPoolDefaults : OpDefaults {
  static Attrs port_layout_attrs(const Attrs& attrs, int port, bool channels_last) {
    Pool2dAttrs a = std::get<Pool2dAttrs>(attrs);
    bool pooled = a.pooled_channels_last();
    (port == kUnpooled ? a.channels_last : pooled) = channels_last;
    a.flip_pooled_layout = a.channels_last != pooled;
    return a;
  }
};

template <> struct OpDef<Op::AvgPool2d> : AvgPoolDefaults<0> {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::reduction;
  static std::int64_t flops(const CostContext& c) {
    const int k = std::get<Pool2dAttrs>(c.attrs).kernel;
    return c.out.numel() * k * k;
  }
  static TensorType infer(const InferContext& c) { return detail::infer_pool(c); }
  static void grad(GradContext& c) { c.dx[0] = avg_pool2d_grad(c.dy, c.attr<Pool2dAttrs>()); }
};

/// dx = avg_pool2d_grad(dy): each dy / kernel² spread over its window.
template <> struct OpDef<Op::AvgPool2dGrad> : AvgPoolDefaults<-1> {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::opaque;
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    c.expect_rank(0, 4);
    const auto& a = c.attr<Pool2dAttrs>();
    const Shape& dy = c.in(0).shape;
    const std::int64_t channels = a.pooled_channels_last() ? dy[3] : dy[1];
    const Shape dx = a.channels_last ? Shape{dy[0], a.input_h, a.input_w, channels}
                                     : Shape{dy[0], channels, a.input_h, a.input_w};
    return TensorType{dx, DType::f32};
  }
  /// The same window pools the unpooled-side gradient back into dy's layout.
  static void grad(GradContext& c) {
    c.dx[0] = append(c.graph, Op::AvgPool2d, {c.dy.id}, c.attr<Pool2dAttrs>());
  }
};

inline Value max_pool2d(Value x, Pool2dOptions options) {
  return append(*x.graph, Op::MaxPool2d, {x.id}, detail::pool_attrs(x, options));
}
inline Value max_pool2d_grad(Value x, Value dy, const Pool2dAttrs& attrs) {
  return append(*x.graph, Op::MaxPool2dGrad, {x.id, dy.id}, attrs);
}
inline Value avg_pool2d(Value x, Pool2dOptions options) {
  return append(*x.graph, Op::AvgPool2d, {x.id}, detail::pool_attrs(x, options));
}
inline Value avg_pool2d_grad(Value dy, const Pool2dAttrs& attrs) {
  return append(*dy.graph, Op::AvgPool2dGrad, {dy.id}, attrs);
}

/// [N,C,H,W] -> [N,C]: the mean over each plane, built from sum_to and a scale.
inline Value global_avg_pool2d(Value x) {
  const Shape s = x.shape();
  if (s.rank() != 4)
    fail(errc::shape,
         "global_avg_pool2d: %" + std::to_string(x.id) + ":" + s.str() + " is not NCHW");
  const Value summed = sum_to(x, Shape{s[0], s[1], 1, 1});
  return reshape(mul_scalar(summed, 1.0f / static_cast<float>(s[2] * s[3])), Shape{s[0], s[1]});
}

} // namespace kiln
