// fused_elementwise: a chain of elementwise ops as one node, made by the fusion pass.
#pragma once

#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/ops/program_check.hpp"

namespace kiln {

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
    if (c.arity() < 1 || c.arity() > max_op_inputs)
      c.fail(errc::arity, "takes 1 to " + std::to_string(max_op_inputs) + " inputs");
    for (int i = 0; i < c.arity(); ++i) {
      c.expect_dtype(i, DType::f32);
      if (!broadcasts_to(c.in(i).shape, a.shape))
        c.fail(errc::shape,
               "input " + std::to_string(i) + " does not broadcast to " + a.shape.str());
    }
    detail::check_program(c, a.program, a.stores, c.arity(), a.shape, [](int k) { return k; });
    return TensorType{a.shape, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

} // namespace kiln
