// fuse_elementwise: merges chains of elementwise ops (broadcasts included) into single
// fused_elementwise kernels, recording why each producer was or was not merged.
#pragma once

#include <algorithm>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace detail {

/// A fusion group: member ids ascending; the last one is the root whose value leaves.
struct FusionGroup {
  std::vector<ValueId> members;
  std::vector<std::pair<ValueId, ValueId>> stores; ///< (member, the assign it absorbs)
};

inline bool fusable(const Node& n) { return op_info(n.op).is_elementwise; }

/// The inputs a group reads from outside itself, in order of first use.
inline std::vector<ValueId> external_inputs(const Graph& g, const FusionGroup& group,
                                            const std::vector<int>& group_of, int gid) {
  std::vector<ValueId> ext;
  const auto add = [&](ValueId v) {
    if (group_of[static_cast<std::size_t>(v)] != gid &&
        std::find(ext.begin(), ext.end(), v) == ext.end())
      ext.push_back(v);
  };
  for (ValueId m : group.members)
    for (ValueId in : g.node(m).inputs) add(in);
  for (const auto& [member, assign] : group.stores) add(g.node(assign).inputs[0]);
  return ext;
}

} // namespace detail

/// Grows a group from every elementwise node not yet claimed, last node first, pulling in
/// each elementwise producer whose value is read only inside the group, is not a graph
/// output, and has the group's full shape (a smaller, broadcast producer would be
/// recomputed for every element). Groups of two or more become one fused_elementwise node.
/// A producer whose value is also assigned to a param joins too when nothing after the
/// fused kernel reads that param: the kernel then stores the value into it (so an SGD
/// momentum update and the weight update it feeds run as one kernel). Every decision goes
/// to ctx.report.fusion.
inline PassResult fuse_elementwise(Graph& g, PassContext& ctx) {
  const auto n = static_cast<std::size_t>(g.size());
  const auto users = consumers(g);
  const std::vector<bool> is_output = graph_outputs(g);
  std::vector<int> group_of(n, -1);
  std::vector<detail::FusionGroup> groups;

  const auto decide = [&](ValueId producer, ValueId consumer, FusionReason reason) {
    ctx.decide("fuse_elementwise", g, producer, consumer, reason);
  };

  for (ValueId root = g.size() - 1; root >= 0; --root) {
    if (group_of[static_cast<std::size_t>(root)] >= 0 || !detail::fusable(g.node(root))) continue;
    const int gid = static_cast<int>(groups.size());
    groups.push_back({{root}, {}});
    group_of[static_cast<std::size_t>(root)] = gid;
    const Shape shape = g.node(root).type.shape;
    std::vector<ValueId> pending{root};
    while (!pending.empty()) {
      const ValueId member = pending.back();
      pending.pop_back();
      for (ValueId p : g.node(member).inputs) {
        const auto pu = static_cast<std::size_t>(p);
        const Node& pn = g.node(p);
        const OpRole role = op_info(pn.op).role;
        if (group_of[pu] == gid || op_info(pn.op).is_source() || role == OpRole::constant) continue;
        if (!detail::fusable(pn)) {
          decide(p, member, FusionReason::not_fusable);
          continue;
        }
        if (group_of[pu] >= 0) { // already the root or member of a later group
          decide(p, member, FusionReason::several_consumers);
          continue;
        }
        if (is_output[pu]) {
          decide(p, member, FusionReason::graph_output);
          continue;
        }
        // Readers outside the group are allowed only as assigns the kernel can take over.
        std::vector<ValueId> absorbed;
        const bool all_inside = std::all_of(users[pu].begin(), users[pu].end(), [&](ValueId u) {
          if (group_of[static_cast<std::size_t>(u)] == gid) return true;
          if (g.node(u).inputs.size() < 2 || g.node(u).inputs[1] != p ||
              !assign_can_become_store(g, users, u, root))
            return false;
          absorbed.push_back(u);
          return true;
        });
        if (!all_inside) {
          decide(p, member, FusionReason::several_consumers);
          continue;
        }
        if (!(pn.type.shape == shape)) {
          decide(p, member, FusionReason::would_duplicate_work);
          continue;
        }
        group_of[pu] = gid;
        auto& group = groups[static_cast<std::size_t>(gid)];
        group.members.push_back(p);
        for (ValueId a : absorbed) group.stores.emplace_back(p, a);
        if (detail::external_inputs(g, group, group_of, gid).size() >
            static_cast<std::size_t>(max_op_inputs)) {
          group.members.pop_back();
          group.stores.resize(group.stores.size() - absorbed.size());
          group_of[pu] = -1;
          decide(p, member, FusionReason::too_many_inputs);
          continue;
        }
        decide(p, member, FusionReason::fused);
        pending.push_back(p);
      }
    }
  }

  PassResult result;
  std::vector<bool> keep(n, true);
  std::vector<Node> replacement(n);
  std::vector<bool> replaced(n, false);
  for (std::size_t gid = 0; gid < groups.size(); ++gid) {
    auto members = groups[gid].members;
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end());
    const ValueId root = members.back();
    const std::vector<ValueId> ext =
        detail::external_inputs(g, groups[gid], group_of, static_cast<int>(gid));
    FusedAttrs attrs;
    attrs.shape = g.node(root).type.shape;
    const auto operand = [&](ValueId v) -> std::int8_t {
      const auto in_group = std::find(members.begin(), members.end(), v);
      if (in_group != members.end()) return static_cast<std::int8_t>(in_group - members.begin());
      return static_cast<std::int8_t>(-1 - (std::find(ext.begin(), ext.end(), v) - ext.begin()));
    };
    for (ValueId m : members) {
      const Node& node = g.node(m);
      FusedInstruction f;
      f.op = node.op;
      f.a = operand(node.inputs[0]);
      f.b = node.inputs.size() > 1 ? operand(node.inputs[1]) : f.a;
      if (const auto* s = std::get_if<ScalarAttrs>(&node.attrs)) f.scalar = s->value;
      attrs.program.push_back(f);
      keep[static_cast<std::size_t>(m)] = m == root;
    }
    for (const auto& [member, assign] : groups[gid].stores) {
      attrs.stores.push_back({operand(member), operand(g.node(assign).inputs[0])});
      const auto input = static_cast<std::size_t>(-(attrs.stores.back().input + 1));
      attrs.stores.back().input = static_cast<std::int8_t>(input);
      keep[static_cast<std::size_t>(assign)] = false;
      result.count("assigns_absorbed");
    }
    replacement[static_cast<std::size_t>(root)] =
        Node{Op::FusedElementwise, ext, attrs, g.node(root).type};
    replaced[static_cast<std::size_t>(root)] = true;
    result.count("groups");
    result.count("nodes_fused", static_cast<std::int64_t>(members.size()));
  }
  if (!result.changed) return result;
  for (std::size_t i = 0; i < n; ++i)
    if (replaced[i]) g.node(static_cast<ValueId>(i)) = replacement[i];
  compact(g, keep);
  return result;
}

} // namespace kiln
