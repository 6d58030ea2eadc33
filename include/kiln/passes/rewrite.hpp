// Graph-rewriting helpers shared by the passes: use lists, and compaction with renumbering.
#pragma once

#include <utility>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln {

/// For every value, whether the graph returns it (the user reads it after the run).
inline std::vector<bool> graph_outputs(const Graph& g) {
  std::vector<bool> is_output(static_cast<std::size_t>(g.size()), false);
  for (ValueId o : g.outputs()) is_output[static_cast<std::size_t>(o)] = true;
  return is_output;
}

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

/// Builds a graph's replacement node by node, for passes that insert nodes: `push` appends a
/// node (its inputs already in new numbering) and returns its new id, `map` records which new
/// value stands for an old one, `renumber` reads that record.
class GraphRebuild {
public:
  explicit GraphRebuild(const Graph& g) : new_id_(static_cast<std::size_t>(g.size()), -1) {}

  ValueId push(Node node) {
    nodes_.push_back(std::move(node));
    return static_cast<ValueId>(nodes_.size() - 1);
  }
  void map(ValueId old_id, ValueId now) { new_id_[static_cast<std::size_t>(old_id)] = now; }
  [[nodiscard]] ValueId renumber(ValueId old_id) const {
    return new_id_[static_cast<std::size_t>(old_id)];
  }
  /// Old node `id` unchanged but for its inputs' numbering.
  void keep(const Graph& g, ValueId id) {
    Node node = g.node(id);
    for (ValueId& in : node.inputs) in = renumber(in);
    map(id, push(std::move(node)));
  }
  /// Replaces g's nodes, its outputs renumbered.
  void finish(Graph& g) {
    std::vector<ValueId> outputs;
    for (ValueId o : g.outputs()) outputs.push_back(renumber(o));
    g.reset(std::move(nodes_), std::move(outputs));
  }

private:
  std::vector<ValueId> new_id_;
  std::vector<Node> nodes_;
};

} // namespace kiln
