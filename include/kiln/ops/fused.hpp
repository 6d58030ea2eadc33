// fused_elementwise: a chain of elementwise ops as one node, made by the fusion pass.
#pragma once

#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/runtime/kernel_args.hpp"

namespace kiln {

/// Inputs: up to KernelArgs::max_inputs tensors, each broadcasting to attrs.shape. Its
/// program may only use elementwise ops (those with OpDef<op>::is_elementwise).
template <> struct OpDef<Op::FusedElementwise> : OpDefaults {
  static constexpr int arity = -1; // variadic: 1..KernelArgs::max_inputs
  static constexpr FusionKind kind = FusionKind::elementwise;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<FusedAttrs>();
    if (c.arity() < 1 || c.arity() > KernelArgs::max_inputs)
      c.fail(errc::arity, "takes 1 to " + std::to_string(KernelArgs::max_inputs) + " inputs");
    for (int i = 0; i < c.arity(); ++i) {
      c.expect_dtype(i, DType::f32);
      if (!broadcasts_to(c.in(i).shape, a.shape))
        c.fail(errc::shape,
               "input " + std::to_string(i) + " does not broadcast to " + a.shape.str());
    }
    if (a.program.empty()) c.fail(errc::attr, "empty program");
    for (std::size_t k = 0; k < a.program.size(); ++k) {
      const FusedInstruction& f = a.program[k];
      for (int operand : {static_cast<int>(f.a), static_cast<int>(f.b)})
        if (operand >= static_cast<int>(k) || -(operand + 1) >= c.arity())
          c.fail(errc::attr, "step " + std::to_string(k) + " reads an operand that does not exist");
    }
    for (const FusedStore& s : a.stores) {
      if (s.step < 0 || s.step >= static_cast<int>(a.program.size()) || s.input < 0 ||
          s.input >= c.arity())
        c.fail(errc::attr, "a store names a step or input that does not exist");
      if (c.graph.node(c.inputs[static_cast<std::size_t>(s.input)]).op != Op::Param ||
          !(c.in(s.input).shape == a.shape))
        c.fail(errc::attr, "stores go to params of the fused shape");
    }
    return TensorType{a.shape, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

} // namespace kiln
