// Elementwise ops: one arithmetic body per op over a math policy, plus their gradients.
#pragma once

#include <cstdint>

#include "kiln/core/host_device.hpp"
#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

namespace detail {

inline TensorType infer_unary_f32(const InferContext& c) {
  c.expect_dtype(0, DType::f32);
  return c.in(0);
}

inline TensorType infer_binary_broadcast(const InferContext& c) {
  c.expect_dtype(0, DType::f32);
  c.expect_dtype(1, DType::f32);
  const auto shape = broadcast_shapes(c.in(0).shape, c.in(1).shape);
  if (!shape)
    c.fail(errc::shape, c.in(0).shape.str() + " vs " + c.in(1).shape.str() + " do not broadcast");
  return TensorType{*shape, DType::f32};
}

/// Reduces a broadcast gradient back to the shape of the input it flows to.
inline Value unbroadcast(Value grad, Value input) { return sum_to(grad, input.shape()); }

} // namespace detail

/// What every elementwise op shares: element i from element i of its inputs, in any layout.
struct ElementwiseDefaults : OpDefaults {
  static constexpr bool is_elementwise = true;
  static constexpr bool overwrites_any_input = true;
  static constexpr LayoutRule layout = LayoutRule::elementwise;
};

struct UnaryElementwise : ElementwiseDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::elementwise;
  static TensorType infer(const InferContext& c) { return detail::infer_unary_f32(c); }
};

struct BinaryElementwise : ElementwiseDefaults {
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::broadcast;
  static TensorType infer(const InferContext& c) { return detail::infer_binary_broadcast(c); }
};

template <> struct OpDef<Op::Add> : BinaryElementwise {
  static constexpr bool commutative = true;
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V b, V) {
    return m.add(a, b);
  }
  static void grad(GradContext& c) {
    if (c.wants(0)) c.dx[0] = detail::unbroadcast(c.dy, c.in(0));
    if (c.wants(1)) c.dx[1] = detail::unbroadcast(c.dy, c.in(1));
  }
};

template <> struct OpDef<Op::Sub> : BinaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V b, V) {
    return m.sub(a, b);
  }
  static void grad(GradContext& c) {
    if (c.wants(0)) c.dx[0] = detail::unbroadcast(c.dy, c.in(0));
    if (c.wants(1)) c.dx[1] = detail::unbroadcast(neg(c.dy), c.in(1));
  }
};

template <> struct OpDef<Op::Mul> : BinaryElementwise {
  static constexpr bool commutative = true;
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V b, V) {
    return m.mul(a, b);
  }
  static void grad(GradContext& c) {
    if (c.wants(0)) c.dx[0] = detail::unbroadcast(c.dy * c.in(1), c.in(0));
    if (c.wants(1)) c.dx[1] = detail::unbroadcast(c.dy * c.in(0), c.in(1));
  }
};

template <> struct OpDef<Op::Div> : BinaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V b, V) {
    return m.div(a, b);
  }
  static void grad(GradContext& c) {
    if (c.wants(0)) c.dx[0] = detail::unbroadcast(c.dy / c.in(1), c.in(0));
    // d(a/b)/db = -(a/b)/b
    if (c.wants(1)) c.dx[1] = detail::unbroadcast(neg(c.dy * c.out() / c.in(1)), c.in(1));
  }
};

template <> struct OpDef<Op::Neg> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.neg(a);
  }
  static void grad(GradContext& c) { c.dx[0] = neg(c.dy); }
};

template <> struct OpDef<Op::Relu> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.max(a, m.zero());
  }
  // The mask reads the output, not the input: y > 0 exactly where x > 0, and the input
  // can then die right after the forward relu.
  static void grad(GradContext& c) { c.dx[0] = relu_grad(c.out(), c.dy); }
};

template <> struct OpDef<Op::ReluGrad> : ElementwiseDefaults {
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::elementwise;
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    c.expect_dtype(1, DType::f32);
    if (!(c.in(0).shape == c.in(1).shape))
      c.fail(errc::shape, c.in(0).shape.str() + " vs " + c.in(1).shape.str());
    return c.in(1);
  }
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V y, V dy, V) {
    return m.where_positive(y, dy);
  }
  static void grad(GradContext& c) {
    if (c.wants(1)) c.dx[1] = relu_grad(c.in(0), c.dy);
  }
};

template <> struct OpDef<Op::Exp> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.exp(a);
  }
  static void grad(GradContext& c) { c.dx[0] = c.dy * c.out(); }
};

template <> struct OpDef<Op::Log> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.log(a);
  }
  static void grad(GradContext& c) { c.dx[0] = c.dy / c.in(0); }
};

template <> struct OpDef<Op::Sqrt> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.sqrt(a);
  }
  static void grad(GradContext& c) { c.dx[0] = mul_scalar(c.dy / c.out(), 0.5f); }
};

template <> struct OpDef<Op::Rsqrt> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.rsqrt(a);
  }
  // d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 y^3
  static void grad(GradContext& c) {
    c.dx[0] = mul_scalar(c.dy * (c.out() * square(c.out())), -0.5f);
  }
};

template <> struct OpDef<Op::Square> : UnaryElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V) {
    return m.mul(a, a);
  }
  static void grad(GradContext& c) { c.dx[0] = mul_scalar(c.dy * c.in(0), 2.0f); }
};

/// Unary ops with a scalar operand in ScalarAttrs.
struct ScalarElementwise : UnaryElementwise {
  static TensorType infer(const InferContext& c) {
    (void)c.attr<ScalarAttrs>();
    return detail::infer_unary_f32(c);
  }
};

template <> struct OpDef<Op::MulScalar> : ScalarElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V s) {
    return m.mul(a, s);
  }
  static void grad(GradContext& c) { c.dx[0] = mul_scalar(c.dy, c.attr<ScalarAttrs>().value); }
};

template <> struct OpDef<Op::AddScalar> : ScalarElementwise {
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M& m, V a, V, V s) {
    return m.add(a, s);
  }
  static void grad(GradContext& c) { c.dx[0] = c.dy; }
};

template <> struct OpDef<Op::BroadcastTo> : UnaryElementwise {
  static constexpr FusionKind kind = FusionKind::broadcast;
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    const Shape& to = c.attr<ShapeAttrs>().shape;
    if (!broadcasts_to(c.in(0).shape, to))
      c.fail(errc::shape, c.in(0).shape.str() + " does not broadcast to " + to.str());
    return TensorType{to, DType::f32};
  }
  template <class M, class V> KILN_HOST_DEVICE static V apply(const M&, V a, V, V) { return a; }
  static void grad(GradContext& c) { c.dx[0] = detail::unbroadcast(c.dy, c.in(0)); }
  /// The target shape, permuted to NHWC.
  static Attrs channels_last_attrs(const Attrs& attrs) {
    return ShapeAttrs{permuted(std::get<ShapeAttrs>(attrs).shape, nchw_to_nhwc)};
  }
};

template <> struct OpDef<Op::DropoutMask> : OpDefaults {
  static constexpr int arity = 0;
  static constexpr FusionKind kind = FusionKind::injective;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<DropoutAttrs>();
    if (!(a.p >= 0.0f && a.p < 1.0f)) c.fail(errc::attr, "dropout probability must be in [0, 1)");
    return TensorType{a.shape, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

namespace detail {
inline Value append_values(Op op, std::initializer_list<Value> inputs, Attrs attrs = NoAttrs{}) {
  Graph* g = inputs.begin()->graph;
  std::vector<ValueId> ids;
  for (const Value& v : inputs) {
    if (!v.valid()) fail(errc::argument, std::string(op_name(op)) + ": empty input value");
    if (v.graph != g)
      fail(errc::argument, std::string(op_name(op)) + ": inputs belong to different graphs");
    ids.push_back(v.id);
  }
  return kiln::append(*g, op, std::move(ids), std::move(attrs));
}
} // namespace detail

inline Value add(Value a, Value b) { return detail::append_values(Op::Add, {a, b}); }
inline Value sub(Value a, Value b) { return detail::append_values(Op::Sub, {a, b}); }
inline Value mul(Value a, Value b) { return detail::append_values(Op::Mul, {a, b}); }
inline Value div(Value a, Value b) { return detail::append_values(Op::Div, {a, b}); }
inline Value neg(Value x) { return detail::append_values(Op::Neg, {x}); }
inline Value relu(Value x) { return detail::append_values(Op::Relu, {x}); }
inline Value relu_grad(Value y, Value dy) { return detail::append_values(Op::ReluGrad, {y, dy}); }
inline Value exp(Value x) { return detail::append_values(Op::Exp, {x}); }
inline Value log(Value x) { return detail::append_values(Op::Log, {x}); }
inline Value sqrt(Value x) { return detail::append_values(Op::Sqrt, {x}); }
inline Value rsqrt(Value x) { return detail::append_values(Op::Rsqrt, {x}); }
inline Value square(Value x) { return detail::append_values(Op::Square, {x}); }
inline Value mul_scalar(Value x, float s) {
  return detail::append_values(Op::MulScalar, {x}, ScalarAttrs{s});
}
inline Value add_scalar(Value x, float s) {
  return detail::append_values(Op::AddScalar, {x}, ScalarAttrs{s});
}
inline Value broadcast_to(Value x, Shape shape) {
  if (x.shape() == shape) return x;
  return detail::append_values(Op::BroadcastTo, {x}, ShapeAttrs{shape});
}
inline Value dropout_mask(Graph& g, Shape shape, float p, std::uint64_t seed) {
  return append(g, Op::DropoutMask, {}, DropoutAttrs{p, seed, shape});
}

} // namespace kiln
