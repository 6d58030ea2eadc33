// Reductions: sum_to (sum over broadcast axes, the gradient of broadcasting), sum, mean.
#pragma once

#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

/// sum_to(x, shape): sums x over the axes where `shape` has 1, keeping the rank.
template <> struct OpDef<Op::SumTo> : OpDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::reduction;
  static constexpr LayoutRule layout = LayoutRule::reduction;
  static constexpr bool fusable_sum = true;
  /// The target shape, permuted to NHWC.
  static Attrs channels_last_attrs(const Attrs& attrs) {
    return ShapeAttrs{permuted(std::get<ShapeAttrs>(attrs).shape, nchw_to_nhwc)};
  }
  static std::int64_t flops(const CostContext& c) { return c.in[0].numel(); }
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    const Shape& to = c.attr<ShapeAttrs>().shape;
    const Shape& from = c.in(0).shape;
    if (!sums_down_to(from, to))
      c.fail(errc::shape, "cannot sum " + from.str() + " to " + to.str());
    return TensorType{to, DType::f32};
  }
  static void grad(GradContext& c) { c.dx[0] = broadcast_to(c.dy, c.in(0).shape()); }
};

/// Sums x down to `shape`, which x must broadcast from (fewer dimensions allowed).
inline Value sum_to(Value x, Shape shape) {
  if (x.shape() == shape) return x;
  const Shape from = x.shape();
  if (!broadcasts_to(shape, from))
    fail(errc::shape, "sum_to: %" + std::to_string(x.id) + ":" + from.str() +
                          " cannot be summed to " + shape.str());
  const Value summed =
      append(*x.graph, Op::SumTo, {x.id}, ShapeAttrs{pad_rank(shape, from.rank())});
  return reshape(summed, shape);
}

/// Sum of all elements, as a scalar (rank 0).
inline Value sum(Value x) {
  Shape ones;
  for (int i = 0; i < x.shape().rank(); ++i) ones.push_back(1);
  return reshape(append(*x.graph, Op::SumTo, {x.id}, ShapeAttrs{ones}), Shape{});
}

/// Mean of all elements, as a scalar (rank 0).
inline Value mean(Value x) {
  return mul_scalar(sum(x), 1.0f / static_cast<float>(x.shape().numel()));
}

} // namespace kiln
