// fuse_loss: softmax cross-entropy and its gradient from one kernel that reads the logits once.
#pragma once

#include <algorithm>
#include <vector>

#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

/// Where a training step has both softmax_cross_entropy(logits, labels) and
/// softmax_cross_entropy_grad(logits, labels, dloss), computes them as one
/// softmax_cross_entropy_with_grad node at the gradient's place; part views name its two
/// results. Needs every reader of the loss to come after the gradient (in a training step
/// the loss is only read as an output). Each pair gets a decision in ctx.report.fusion.
inline PassResult fuse_loss(Graph& g, PassContext& ctx) {
  const auto users = consumers(g);
  const auto n = static_cast<std::size_t>(g.size());
  std::vector<ValueId> loss_of(n, -1); // for a gradient node: the loss node it absorbs
  std::vector<bool> absorbed(n, false);
  for (ValueId grad = 0; grad < g.size(); ++grad) {
    const Node& gn = g.node(grad);
    if (gn.op != Op::SoftmaxCrossEntropyGrad) continue;
    for (ValueId loss : users[static_cast<std::size_t>(gn.inputs[0])]) {
      const Node& ln = g.node(loss);
      if (ln.op != Op::SoftmaxCrossEntropy || ln.inputs[1] != gn.inputs[1] ||
          absorbed[static_cast<std::size_t>(loss)])
        continue;
      const auto& readers = users[static_cast<std::size_t>(loss)];
      const bool later =
          std::all_of(readers.begin(), readers.end(), [&](ValueId r) { return r > grad; });
      ctx.decide("fuse_loss", g, loss, grad,
                 later ? FusionReason::fused : FusionReason::read_too_early);
      if (!later) continue;
      loss_of[static_cast<std::size_t>(grad)] = loss;
      absorbed[static_cast<std::size_t>(loss)] = true;
      break;
    }
  }
  PassResult result;
  if (std::none_of(absorbed.begin(), absorbed.end(), [](bool a) { return a; })) return result;
  GraphRebuild rebuild(g);
  for (ValueId id = 0; id < g.size(); ++id) {
    if (absorbed[static_cast<std::size_t>(id)]) continue;
    const ValueId loss = loss_of[static_cast<std::size_t>(id)];
    if (loss < 0) {
      rebuild.keep(g, id);
      continue;
    }
    const Node& grad = g.node(id);
    std::vector<ValueId> inputs;
    for (ValueId in : grad.inputs) inputs.push_back(rebuild.renumber(in));
    const std::int64_t elements = grad.type.shape.numel();
    const ValueId both = rebuild.push(Node{Op::SoftmaxCrossEntropyWithGrad, std::move(inputs),
                                           NoAttrs{}, TensorType{Shape{elements + 1}, DType::f32}});
    rebuild.map(id, rebuild.push(Node{Op::Part, {both}, PartAttrs{0, grad.type.shape}, grad.type}));
    rebuild.map(loss, rebuild.push(
                          Node{Op::Part, {both}, PartAttrs{elements, Shape{}}, g.node(loss).type}));
    result.count("losses_fused");
  }
  rebuild.finish(g);
  return result;
}

} // namespace kiln
