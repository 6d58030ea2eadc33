// What a node does besides computing its value (the params it overwrites), and where that is
// visible: the state rules every pass that moves, merges or fuses nodes obeys.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

/// The params a node overwrites: an update's target, a fused node's or an epilogue's store
/// targets.
inline std::vector<ValueId> assigned_params(const Node& n) {
  std::vector<ValueId> targets;
  if (op_info(n.op).role == OpRole::update) targets.push_back(n.inputs[0]);
  if (const auto* fused = std::get_if<FusedAttrs>(&n.attrs))
    for (const FusedStore& s : fused->stores)
      targets.push_back(n.inputs[static_cast<std::size_t>(s.input)]);
  if (const Epilogue* epilogue = epilogue_of(n.attrs))
    for (const FusedStore& s : epilogue->stores)
      targets.push_back(n.inputs[static_cast<std::size_t>(anchor_arity + s.input - 1)]);
  return targets;
}

/// True for nodes whose effect is not their value: they must stay even when nobody reads them.
inline bool has_side_effect(const Node& n) { return !assigned_params(n).empty(); }

/// overwritten_at() of a value no node overwrites.
inline constexpr ValueId never_overwritten = std::numeric_limits<ValueId>::max();

/// For every value, the position of the node that overwrites its storage (an assign, a fused
/// store), else never_overwritten. A param and the views of it hold the old contents before
/// that node and the new ones after, so a rewrite must not move a read of them across it (the
/// verifier only catches direct reads of the param, not reads through a view).
inline std::vector<ValueId> overwritten_at(const Graph& g) {
  std::vector<ValueId> at(static_cast<std::size_t>(g.size()), never_overwritten);
  for (ValueId id = 0; id < g.size(); ++id)
    for (ValueId param : assigned_params(g.node(id))) at[static_cast<std::size_t>(param)] = id;
  for (ValueId id = 0; id < g.size(); ++id)
    if (op_info(g.node(id).op).is_view)
      at[static_cast<std::size_t>(id)] = at[static_cast<std::size_t>(g.node(id).inputs[0])];
  return at;
}

/// Whether a node strictly between positions `from` and `to` overwrites a param that `reader`
/// reads: moving `reader` from one to the other would change what it sees.
inline bool updated_between(const Graph& g, const Node& reader, ValueId from, ValueId to) {
  for (ValueId k = from + 1; k < to; ++k)
    for (ValueId target : assigned_params(g.node(k)))
      if (std::find(reader.inputs.begin(), reader.inputs.end(), target) != reader.inputs.end())
        return true;
  return false;
}

/// Whether the update `u` (an assign of some value into a param) can become a store of the
/// kernel that ends at position `at`: no reader of the param but u itself comes after `at`,
/// so writing the param there instead of at u changes nothing anyone reads. `users` are the
/// graph's readers of every value (passes/rewrite.hpp's consumers()).
inline bool assign_can_become_store(const Graph& g, const std::vector<std::vector<ValueId>>& users,
                                    ValueId u, ValueId at) {
  const Node& assign = g.node(u);
  if (op_info(assign.op).role != OpRole::update) return false;
  const ValueId param = assign.inputs[0];
  if (op_info(g.node(param).op).role != OpRole::param) return false;
  const auto& readers = users[static_cast<std::size_t>(param)];
  return std::none_of(readers.begin(), readers.end(), [&](ValueId r) { return r != u && r > at; });
}

} // namespace kiln
