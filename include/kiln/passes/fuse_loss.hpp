// fuse_loss: softmax cross-entropy and its gradient from one kernel that reads the logits once.
#pragma once

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
  std::vector<ValueId> new_id(n, -1);
  std::vector<Node> nodes;
  const auto renumber = [&](ValueId v) { return new_id[static_cast<std::size_t>(v)]; };
  for (ValueId id = 0; id < g.size(); ++id) {
    if (absorbed[static_cast<std::size_t>(id)]) continue;
    Node node = g.node(id);
    for (ValueId& in : node.inputs) in = renumber(in);
    const ValueId loss = loss_of[static_cast<std::size_t>(id)];
    if (loss < 0) {
      new_id[static_cast<std::size_t>(id)] = static_cast<ValueId>(nodes.size());
      nodes.push_back(std::move(node));
      continue;
    }
    const Shape grad_shape = node.type.shape;
    const std::int64_t elements = grad_shape.numel();
    nodes.push_back(Node{Op::SoftmaxCrossEntropyWithGrad, node.inputs, NoAttrs{},
                         TensorType{Shape{elements + 1}, DType::f32}});
    const auto both = static_cast<ValueId>(nodes.size() - 1);
    nodes.push_back(Node{Op::Part, {both}, PartAttrs{0, grad_shape}, node.type});
    new_id[static_cast<std::size_t>(id)] = static_cast<ValueId>(nodes.size() - 1);
    nodes.push_back(Node{Op::Part, {both}, PartAttrs{elements, Shape{}}, g.node(loss).type});
    new_id[static_cast<std::size_t>(loss)] = static_cast<ValueId>(nodes.size() - 1);
    result.count("losses_fused");
  }
  if (!result.changed) return result;
  std::vector<ValueId> outputs;
  for (ValueId o : g.outputs()) outputs.push_back(renumber(o));
  g.reset(std::move(nodes), std::move(outputs));
  return result;
}

} // namespace kiln
