// Sources and state: graph inputs, parameters, constants, and assign (the state update).
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

struct SourceOp : OpDefaults {
  static constexpr int arity = 0;
  static constexpr FusionKind kind = FusionKind::opaque;
  /// Moves data, computes nothing.
  static std::int64_t flops(const CostContext&) { return 0; }
  static constexpr GradFn grad = nullptr;
};

/// Inputs and params are typed when created (Graph::input, Graph::param).
template <> struct OpDef<Op::Input> : SourceOp {
  static constexpr OpRole role = OpRole::input;
  static TensorType infer(const InferContext& c) {
    c.fail(errc::graph, "use Graph::input to add an input");
  }
};

template <> struct OpDef<Op::Param> : SourceOp {
  static constexpr OpRole role = OpRole::param;
  static TensorType infer(const InferContext& c) {
    c.fail(errc::graph, "use Graph::param to add a param");
  }
};

template <> struct OpDef<Op::Fill> : SourceOp {
  static constexpr OpRole role = OpRole::constant;
  static constexpr FusionKind kind = FusionKind::injective;
  static TensorType infer(const InferContext& c) {
    return TensorType{c.attr<FillAttrs>().shape, DType::f32};
  }
};

/// assign(target, value): at this point of the step, the param `target` takes `value`.
/// Its result aliases the param's storage; optimizers and batchnorm statistics use it.
template <> struct OpDef<Op::Assign> : OpDefaults {
  static constexpr OpRole role = OpRole::update;
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::opaque;
  /// Moves data, computes nothing.
  static std::int64_t flops(const CostContext&) { return 0; }
  static TensorType infer(const InferContext& c) {
    if (c.graph.node(c.inputs[0]).op != Op::Param)
      c.fail(errc::graph, "assign target must be a param");
    if (!(c.in(0) == c.in(1)))
      c.fail(errc::shape, c.in(0).shape.str() + " vs " + c.in(1).shape.str());
    return c.in(0);
  }
  static constexpr GradFn grad = nullptr;
};

inline Value fill(Graph& g, Shape shape, float value) {
  return append(g, Op::Fill, {}, FillAttrs{value, shape});
}

inline Value assign(Value target, Value new_value) {
  if (!target.valid() || !new_value.valid() || target.graph != new_value.graph)
    fail(errc::argument, "assign: values must belong to one graph");
  return append(*target.graph, Op::Assign, {target.id, new_value.id});
}

} // namespace kiln
