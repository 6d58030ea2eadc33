// fold_constants: computes at compile time the nodes whose inputs are all fills.
#pragma once

#include <cstdint>
#include <variant>

#include "kiln/ops/registry.hpp"
#include "kiln/ops/scalar_body.hpp"
#include "kiln/passes/pass.hpp"

namespace kiln {

/// Replaces by a fill each node whose inputs are all fills and whose value is then one number:
/// an elementwise op (computed with its scalar body; broadcasting keeps every element
/// equal), views and broadcast_to (the same value in the node's shape), and sum_to (the
/// value times the number of elements summed into each output element). Folding runs in
/// graph order, so chains fold in one run. The fills it no longer reads are left for
/// dead-node elimination.
inline PassResult fold_constants(Graph& g, PassContext&) {
  // Folding uses the kernels' reference body, so a folded fill holds what the kernel computes.
  static constexpr auto bodies = scalar_bodies();
  std::int64_t folded = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    if (node.inputs.empty() || node.type.dtype != DType::f32) continue;
    bool constant = true;
    for (ValueId in : node.inputs)
      constant = constant && std::holds_alternative<FillAttrs>(g.node(in).attrs);
    if (!constant) continue;
    const auto input = [&](std::size_t i) {
      return std::get<FillAttrs>(g.node(node.inputs[i]).attrs).value;
    };
    float value = 0.0f;
    if (const ScalarBody body = bodies[op_index(node.op)]) {
      const auto* scalar = std::get_if<ScalarAttrs>(&node.attrs);
      value = body(input(0), node.inputs.size() > 1 ? input(1) : input(0),
                   scalar ? scalar->value : 0.0f);
    } else if (op_info(node.op).is_view) {
      value = input(0);
    } else if (node.op == Op::SumTo) {
      const std::int64_t summed =
          g.node(node.inputs[0]).type.shape.numel() / node.type.shape.numel();
      // In double: the exact product is what an exact sum of the elements would give.
      value = static_cast<float>(static_cast<double>(input(0)) * static_cast<double>(summed));
    } else {
      continue;
    }
    g.node(id) = Node{Op::Fill, {}, FillAttrs{value, node.type.shape}, node.type};
    ++folded;
  }
  PassResult r;
  r.count("nodes_folded", folded);
  return r;
}

} // namespace kiln
