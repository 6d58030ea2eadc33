// fused_elementwise and fused_sum_to: a chain of elementwise ops as one node, its result
// stored, or summed down as sum_to sums; made by the fusion passes.
#pragma once

#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/ops/program_check.hpp"

namespace kiln {

namespace detail {
/// Checks a fused chain against the node that carries it: 1 to max_op_inputs f32 inputs, each
/// broadcasting to the chain's shape, and a program over them.
inline void check_chain(const InferContext& c, const FusedAttrs& a) {
  if (c.arity() < 1 || c.arity() > max_op_inputs)
    c.fail(errc::arity, "takes 1 to " + std::to_string(max_op_inputs) + " inputs");
  for (int i = 0; i < c.arity(); ++i) {
    c.expect_dtype(i, DType::f32);
    if (!broadcasts_to(c.in(i).shape, a.shape))
      c.fail(errc::shape, "input " + std::to_string(i) + " does not broadcast to " + a.shape.str());
  }
  check_program(c, a.program, a.stores, c.arity(), a.shape, [](int k) { return k; });
}
} // namespace detail

/// Inputs: up to max_op_inputs tensors, each broadcasting to attrs.shape. Its
/// program may only use elementwise ops (those with OpDef<op>::is_elementwise).
template <> struct OpDef<Op::FusedElementwise> : OpDefaults {
  static constexpr int arity = -1; // variadic: 1..max_op_inputs
  static constexpr FusionKind kind = FusionKind::elementwise;
  static constexpr bool overwrites_any_input = true;
  static std::int64_t flops(const CostContext& c) {
    return static_cast<std::int64_t>(std::get<FusedAttrs>(c.attrs).program.size()) * c.out.numel();
  }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<FusedAttrs>();
    detail::check_chain(c, a);
    return TensorType{a.shape, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

/// Inputs: up to max_op_inputs tensors, each broadcasting to attrs.chain.shape. The chain's
/// result is summed over the axes where attrs.to has extent 1, so it is never stored.
template <> struct OpDef<Op::FusedSumTo> : OpDefaults {
  static constexpr int arity = -1; // variadic: 1..max_op_inputs
  static constexpr FusionKind kind = FusionKind::reduction;
  /// The chain's steps and the sum's one addition per element.
  static std::int64_t flops(const CostContext& c) {
    const auto& a = std::get<FusedSumAttrs>(c.attrs);
    return static_cast<std::int64_t>(a.chain.program.size() + 1) * a.chain.shape.numel();
  }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<FusedSumAttrs>();
    if (!a.chain.stores.empty()) c.fail(errc::attr, "a summed chain stores nothing");
    detail::check_chain(c, a.chain);
    if (!sums_down_to(a.chain.shape, a.to))
      c.fail(errc::shape, "cannot sum " + a.chain.shape.str() + " to " + a.to.str());
    return TensorType{a.to, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

} // namespace kiln
