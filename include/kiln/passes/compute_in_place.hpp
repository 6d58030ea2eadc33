// compute_in_place: lets a kernel write its result over memory that dies as it runs: an
// optimizer update straight into the parameter it replaces, an activation over its dying input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/passes/pass.hpp"
#include "kiln/passes/storage.hpp"

namespace kiln {

namespace detail {

/// Storage roots that change while the pass decides (union-find parents over the views'
/// and updates' roots): a value moved into a param, or onto a dying input, takes what aliases
/// it along.
struct InPlaceRoots {
  std::vector<ValueId> parent;
  [[nodiscard]] ValueId find(ValueId v) const {
    while (parent[static_cast<std::size_t>(v)] != v) v = parent[static_cast<std::size_t>(v)];
    return v;
  }
};

/// Whether update `u` can be dropped by computing its value in the param's storage: the value
/// comes from a kernel that writes each element after reading it (overwrites_any_input), reads
/// the param (if at all) at its own shape, and nothing between it and the update reads the
/// param's old value.
inline bool can_update_in_place(const Graph& g, ValueId u, const InPlaceRoots& roots) {
  const Node& update = g.node(u);
  const ValueId target = roots.find(update.inputs[0]);
  const ValueId source = update.inputs[1];
  const Node& producer = g.node(source);
  if (roots.find(source) != source || !op_info(producer.op).overwrites_any_input) return false;
  for (ValueId in : producer.inputs)
    if (roots.find(in) == target && !(g.node(in).type.shape == producer.type.shape)) return false;
  for (ValueId k = source + 1; k < u; ++k)
    for (ValueId in : g.node(k).inputs)
      if (roots.find(in) == target) return false;
  return true;
}

/// The last step reading each value, directly or through its views.
inline std::vector<int> last_reads(const Graph& g, const std::vector<int>& step_of) {
  std::vector<int> last(static_cast<std::size_t>(g.size()), -1);
  for (ValueId id = 0; id < g.size(); ++id)
    for (ValueId in : g.node(id).inputs)
      last[static_cast<std::size_t>(in)] =
          std::max(last[static_cast<std::size_t>(in)], step_of[static_cast<std::size_t>(id)]);
  for (ValueId id = g.size() - 1; id >= 0; --id)
    if (op_info(g.node(id).op).is_view) {
      const auto source = static_cast<std::size_t>(g.node(id).inputs[0]);
      last[source] = std::max(last[source], last[static_cast<std::size_t>(id)]);
    }
  return last;
}

/// The input of node `id` (at step `step`) whose memory its output can take over, or -1: same
/// size and type, arena memory (not a graph input, a param or an output) that no later step
/// reads, and every operand in that memory read at the output's own indices (any same-shaped
/// operand for an elementwise kernel; only the input it names for another op).
inline int dying_input(const Graph& g, ValueId id, int step, const InPlaceRoots& roots,
                       const std::vector<int>& class_last, const std::vector<bool>& pinned) {
  const Node& node = g.node(id);
  const OpInfo& info = op_info(node.op);
  const bool any = info.overwrites_any_input;
  const int named = info.overwritable_input(node.attrs);
  const auto same_size = [&](const TensorType& t) {
    return t.dtype == node.type.dtype && t.shape.numel() == node.type.shape.numel();
  };
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    if (!any && static_cast<int>(k) != named) continue;
    const ValueId in = node.inputs[k];
    const ValueId r = roots.find(in);
    if (pinned[static_cast<std::size_t>(r)] || class_last[static_cast<std::size_t>(r)] != step ||
        !same_size(g.node(r).type) || !same_size(g.node(in).type) ||
        (any && !(g.node(in).type == node.type)))
      continue;
    bool aligned = true;
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (roots.find(node.inputs[j]) != r) continue;
      if (any ? !(g.node(node.inputs[j]).type.shape == node.type.shape) : j != k) aligned = false;
    }
    if (aligned) return static_cast<int>(k);
  }
  return -1;
}

} // namespace detail

/// The inplace pass. First every update whose value an elementwise kernel computes is done in
/// place: the kernel writes into the param, and the update moves nothing. Then, in step
/// order, every kernel that may write over an input (OpDef::overwrites_any_input or
/// overwritable_input) takes over the memory of one that dies at it. The decisions are
/// annotations (Node::in_place_of) that lowering follows; run it last, after the schedule has
/// fixed the step order.
inline PassResult compute_in_place(Graph& g, PassContext&) {
  for (Node& n : g.nodes()) n.in_place_of = -1;
  const auto count = static_cast<std::size_t>(g.size());
  detail::InPlaceRoots roots{storage_map(g).root};
  PassResult result;
  for (ValueId id = 0; id < g.size(); ++id) {
    if (op_info(g.node(id).op).role != OpRole::update || !detail::can_update_in_place(g, id, roots))
      continue;
    roots.parent[static_cast<std::size_t>(g.node(id).inputs[1])] = roots.find(id);
    g.node(id).in_place_of = 1;
    result.count("updates_in_place");
  }

  const std::vector<int> step_of = number_steps(g);
  const std::vector<int> last = detail::last_reads(g, step_of);
  std::vector<int> class_last(count, -1); // the last step reading any value of a storage
  std::vector<bool> pinned(count, false); // inputs, params, outputs: memory that must survive
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto r = static_cast<std::size_t>(roots.find(id));
    class_last[r] = std::max(class_last[r], last[static_cast<std::size_t>(id)]);
    if (op_info(g.node(id).op).is_source()) pinned[r] = true;
  }
  for (ValueId o : g.outputs()) pinned[static_cast<std::size_t>(roots.find(o))] = true;
  for (ValueId id = 0; id < g.size(); ++id) {
    const int step = step_of[static_cast<std::size_t>(id)];
    if (step < 0 || roots.find(id) != id) continue;
    const int k = detail::dying_input(g, id, step, roots, class_last, pinned);
    if (k < 0) continue;
    const ValueId r = roots.find(g.node(id).inputs[static_cast<std::size_t>(k)]);
    roots.parent[static_cast<std::size_t>(id)] = r;
    class_last[static_cast<std::size_t>(r)] =
        std::max(class_last[static_cast<std::size_t>(r)], last[static_cast<std::size_t>(id)]);
    g.node(id).in_place_of = static_cast<std::int8_t>(k);
    result.count("activations_in_place");
  }
  return result;
}

} // namespace kiln
