// fuse_loss: a gradient and its forward op from one kernel that reads their inputs once (the
// softmax cross-entropy and its gradient), where the op list declares such a joint kernel.
#pragma once

#include <algorithm>
#include <vector>

#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace detail {
/// Whether forward node `f` reads the leading inputs of gradient node `grad`, in order.
inline bool reads_leading_inputs(const Node& f, const Node& grad) {
  return f.inputs.size() <= grad.inputs.size() &&
         std::equal(f.inputs.begin(), f.inputs.end(), grad.inputs.begin());
}
} // namespace detail

/// Where a step computes both a gradient op with a joint kernel (OpDef::joint) and its forward
/// op over the same leading inputs, computes them as one node of the joint op at the
/// gradient's place; part views name its two results (the gradient first, then the forward
/// value). Needs every reader of the forward value to come after the gradient (in a training
/// step the loss is only read as an output). Each pair gets a decision in ctx.report.fusion.
inline PassResult fuse_loss(Graph& g, PassContext& ctx) {
  const auto users = consumers(g);
  const auto n = static_cast<std::size_t>(g.size());
  std::vector<ValueId> forward_of(n, -1); // for a gradient node: the forward node it absorbs
  std::vector<bool> absorbed(n, false);
  for (ValueId grad = 0; grad < g.size(); ++grad) {
    const Node& gn = g.node(grad);
    const JointKernel joint = op_info(gn.op).joint;
    if (!joint.exists || gn.inputs.empty()) continue;
    for (ValueId f : users[static_cast<std::size_t>(gn.inputs[0])]) {
      const Node& fn = g.node(f);
      if (fn.op != joint.forward || !detail::reads_leading_inputs(fn, gn) ||
          absorbed[static_cast<std::size_t>(f)])
        continue;
      const auto& readers = users[static_cast<std::size_t>(f)];
      const bool later =
          std::all_of(readers.begin(), readers.end(), [&](ValueId r) { return r > grad; });
      ctx.decide("fuse_loss", g, f, grad,
                 later ? FusionReason::fused : FusionReason::read_too_early);
      if (!later) continue;
      forward_of[static_cast<std::size_t>(grad)] = f;
      absorbed[static_cast<std::size_t>(f)] = true;
      break;
    }
  }
  PassResult result;
  if (std::none_of(absorbed.begin(), absorbed.end(), [](bool a) { return a; })) return result;
  GraphRebuild rebuild(g);
  for (ValueId id = 0; id < g.size(); ++id) {
    if (absorbed[static_cast<std::size_t>(id)]) continue;
    const ValueId f = forward_of[static_cast<std::size_t>(id)];
    if (f < 0) {
      rebuild.keep(g, id);
      continue;
    }
    const Node& grad = g.node(id);
    std::vector<ValueId> inputs;
    for (ValueId in : grad.inputs) inputs.push_back(rebuild.renumber(in));
    const std::int64_t gradient_elements = grad.type.shape.numel();
    const std::int64_t elements = gradient_elements + g.node(f).type.shape.numel();
    const ValueId both = rebuild.push(Node{op_info(grad.op).joint.both, std::move(inputs),
                                           NoAttrs{}, TensorType{Shape{elements}, DType::f32}});
    rebuild.map(id, rebuild.push(Node{Op::Part, {both}, PartAttrs{0, grad.type.shape}, grad.type}));
    rebuild.map(
        f,
        rebuild.push(Node{
            Op::Part, {both}, PartAttrs{gradient_elements, g.node(f).type.shape}, g.node(f).type}));
    result.count("losses_fused");
  }
  rebuild.finish(g);
  return result;
}

} // namespace kiln
