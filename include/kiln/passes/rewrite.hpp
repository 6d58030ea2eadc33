// Graph-rewriting helpers shared by the passes: use lists, and compaction with renumbering.
#pragma once

#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln {

/// For every value, the nodes that read it (in graph order, a node once per use).
inline std::vector<std::vector<ValueId>> consumers(const Graph& g) {
  std::vector<std::vector<ValueId>> users(static_cast<std::size_t>(g.size()));
  for (ValueId id = 0; id < g.size(); ++id)
    for (ValueId in : g.node(id).inputs) users[static_cast<std::size_t>(in)].push_back(id);
  return users;
}

/// Rebuilds the graph from the nodes with keep[id] set, in order. `forward[id]` may redirect
/// a value to another (kept) value first, e.g. a duplicate to its original. Returns how many
/// nodes were dropped.
inline std::int32_t compact(Graph& g, const std::vector<bool>& keep,
                            std::vector<ValueId> forward = {}) {
  const auto n = static_cast<std::size_t>(g.size());
  if (forward.empty()) {
    forward.resize(n);
    for (std::size_t i = 0; i < n; ++i) forward[i] = static_cast<ValueId>(i);
  }
  std::vector<ValueId> new_id(n, -1);
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    Node node = g.node(static_cast<ValueId>(i));
    for (ValueId& in : node.inputs)
      in = new_id[static_cast<std::size_t>(forward[static_cast<std::size_t>(in)])];
    new_id[i] = static_cast<ValueId>(nodes.size());
    nodes.push_back(std::move(node));
  }
  std::vector<ValueId> outputs;
  for (ValueId o : g.outputs())
    outputs.push_back(new_id[static_cast<std::size_t>(forward[static_cast<std::size_t>(o)])]);
  const auto dropped = static_cast<std::int32_t>(n - nodes.size());
  g.reset(std::move(nodes), std::move(outputs));
  return dropped;
}

} // namespace kiln
