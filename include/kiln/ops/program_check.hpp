// Checks of an elementwise program (a fused_elementwise node's, or an anchor's epilogue)
// against the node that carries it.
#pragma once

#include <string>
#include <vector>

#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln::detail {

/// Fails naming the node unless every step reads an earlier step or one of `operands`
/// program inputs, and every store writes a param of `shape` from an existing step.
/// `node_input(k)` is the node input behind program input k, or -1 for one the node makes
/// itself (an anchor's result).
template <class NodeInput>
void check_program(const InferContext& c, const std::vector<FusedInstruction>& program,
                   const std::vector<FusedStore>& stores, int operands, const Shape& shape,
                   const NodeInput& node_input) {
  if (program.empty()) c.fail(errc::attr, "empty program");
  for (std::size_t k = 0; k < program.size(); ++k) {
    const FusedInstruction& f = program[k];
    for (int operand : {static_cast<int>(f.a), static_cast<int>(f.b)})
      if (operand >= static_cast<int>(k) || -(operand + 1) >= operands)
        c.fail(errc::attr, "step " + std::to_string(k) + " reads an operand that does not exist");
  }
  for (const FusedStore& s : stores) {
    if (s.step < 0 || s.step >= static_cast<int>(program.size()) || s.input < 0 ||
        s.input >= operands || node_input(s.input) < 0)
      c.fail(errc::attr, "a store names a step or input that does not exist");
    const int i = node_input(s.input);
    if (c.graph.node(c.inputs[static_cast<std::size_t>(i)]).op != Op::Param ||
        !(c.in(i).shape == shape))
      c.fail(errc::attr, "stores go to params of the fused shape");
  }
}

/// Checks that an anchor node has its two inputs plus one per epilogue input; first thing
/// its shape inference does, before it reads any input.
inline void check_anchor_arity(const InferContext& c, const Epilogue& e) {
  const int extra = e.extra_inputs();
  if (c.arity() != anchor_arity + extra)
    c.fail(errc::arity, "takes " + std::to_string(anchor_arity + extra) + " inputs (" +
                            std::to_string(extra) + " for its epilogue), got " +
                            std::to_string(c.arity()));
}

/// Checks an anchor's epilogue: its extra inputs follow the anchor's own, are f32 and
/// broadcast to the anchor's output `shape`.
inline void check_epilogue(const InferContext& c, const Epilogue& e, const Shape& shape) {
  const int extra = e.extra_inputs();
  if (e.empty()) {
    if (!e.stores.empty()) c.fail(errc::attr, "an epilogue stores without a program");
    return;
  }
  for (int i = anchor_arity; i < c.arity(); ++i) {
    c.expect_dtype(i, DType::f32);
    if (!broadcasts_to(c.in(i).shape, shape))
      c.fail(errc::shape, "epilogue input " + std::to_string(i) + " " + c.in(i).shape.str() +
                              " does not broadcast to " + shape.str());
  }
  check_program(c, e.program, e.stores, extra + 1, shape,
                [](int k) { return k == 0 ? -1 : anchor_arity + k - 1; });
}

} // namespace kiln::detail
