// eliminate_dead_nodes: removes nodes whose values reach neither an output nor a state update.
#pragma once

#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

/// Keeps the outputs, every assign, and what they read, transitively; drops the rest (for
/// example the gradients of values no parameter depends on). Inputs always stay, so every
/// name the user feeds remains valid.
inline PassResult eliminate_dead_nodes(Graph& g, PassContext&) {
  std::vector<bool> live(static_cast<std::size_t>(g.size()), false);
  for (ValueId o : g.outputs()) live[static_cast<std::size_t>(o)] = true;
  for (ValueId id = g.size() - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (has_side_effect(n) || op_info(n.op).role == OpRole::input)
      live[static_cast<std::size_t>(id)] = true;
    if (!live[static_cast<std::size_t>(id)]) continue;
    for (ValueId in : n.inputs) live[static_cast<std::size_t>(in)] = true;
  }
  PassResult r;
  r.count("nodes_removed", compact(g, live));
  return r;
}

} // namespace kiln
