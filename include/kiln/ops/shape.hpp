// Shape ops: reshape and flatten, views that alias their input's memory.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

template <> struct OpDef<Op::Reshape> : OpDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::injective;
  static constexpr bool is_view = true;
  static TensorType infer(const InferContext& c) {
    const Shape& to = c.attr<ShapeAttrs>().shape;
    if (to.numel() != c.in(0).shape.numel())
      c.fail(errc::shape, "cannot reshape " + c.in(0).shape.str() + " to " + to.str());
    return TensorType{to, c.in(0).dtype};
  }
  static void grad(GradContext& c) { c.dx[0] = reshape(c.dy, c.in(0).shape()); }
};

/// part(x, offset, shape): the elements [offset, offset + numel(shape)) of x's memory seen as
/// `shape`. Made by passes to name the results a multi-result kernel writes side by side.
template <> struct OpDef<Op::Part> : OpDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::injective;
  static constexpr bool is_view = true;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<PartAttrs>();
    if (a.offset < 0 || a.offset + a.shape.numel() > c.in(0).shape.numel())
      c.fail(errc::attr, "part at " + std::to_string(a.offset) + " of " + a.shape.str() +
                             " does not fit in " + c.in(0).shape.str());
    return TensorType{a.shape, c.in(0).dtype};
  }
  static constexpr GradFn grad = nullptr;
};

/// Reshapes x; one dimension may be -1 and is then inferred.
inline Value reshape(Value x, Shape shape) {
  int inferred = -1;
  std::int64_t known = 1;
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = i;
    } else if (shape[i] <= 0) {
      fail(errc::shape, "reshape of %" + std::to_string(x.id) + ":" + x.shape().str() + " to " +
                            shape.str() + ": dimensions must be positive (one may be -1)");
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) shape[inferred] = known > 0 ? x.shape().numel() / known : 0;
  if (x.shape() == shape) return x;
  return x.graph->append(Op::Reshape, {x.id}, ShapeAttrs{shape});
}

/// [N, ...] -> [N, rest].
inline Value flatten(Value x) {
  if (x.shape().rank() < 1) fail(errc::shape, "flatten of a scalar %" + std::to_string(x.id));
  return reshape(x, Shape{x.shape()[0], -1});
}

} // namespace kiln
