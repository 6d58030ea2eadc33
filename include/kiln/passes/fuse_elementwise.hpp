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
};

inline bool fusable(const Node& n) { return op_info(n.op).is_elementwise; }

/// The inputs a group reads from outside itself, in order of first use.
inline std::vector<ValueId> external_inputs(const Graph& g, const std::vector<ValueId>& members,
                                            const std::vector<int>& group_of, int group) {
  std::vector<ValueId> ext;
  for (ValueId m : members)
    for (ValueId in : g.node(m).inputs)
      if (group_of[static_cast<std::size_t>(in)] != group && std::find(ext.begin(), ext.end(), in) == ext.end())
        ext.push_back(in);
  return ext;
}

} // namespace detail

/// Grows a group from every elementwise node not yet claimed, last node first, pulling in
/// each elementwise producer whose value is read only inside the group, is not a graph
/// output, and has the group's full shape (a smaller, broadcast producer would be
/// recomputed for every element). Groups of two or more become one fused_elementwise node.
/// Every decision goes to ctx.report.fusion.
inline PassResult fuse_elementwise(Graph& g, PassContext& ctx) {
  const auto n = static_cast<std::size_t>(g.size());
  const auto users = consumers(g);
  std::vector<bool> is_output(n, false);
  for (ValueId o : g.outputs()) is_output[static_cast<std::size_t>(o)] = true;
  std::vector<int> group_of(n, -1);
  std::vector<detail::FusionGroup> groups;

  const auto decide = [&](ValueId producer, ValueId consumer, FusionReason reason) {
    ctx.report.fusion.push_back({producer, consumer, std::string(op_name(g.node(producer).op)),
                                 std::string(op_name(g.node(consumer).op)), reason});
  };

  for (ValueId root = g.size() - 1; root >= 0; --root) {
    if (group_of[static_cast<std::size_t>(root)] >= 0 || !detail::fusable(g.node(root))) continue;
    const int gid = static_cast<int>(groups.size());
    groups.push_back({{root}});
    group_of[static_cast<std::size_t>(root)] = gid;
    const Shape shape = g.node(root).type.shape;
    std::vector<ValueId> pending{root};
    while (!pending.empty()) {
      const ValueId member = pending.back();
      pending.pop_back();
      for (ValueId p : g.node(member).inputs) {
        const auto pu = static_cast<std::size_t>(p);
        const Node& pn = g.node(p);
        if (group_of[pu] == gid || pn.op == Op::Input || pn.op == Op::Param || pn.op == Op::Fill) continue;
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
        const bool all_inside = std::all_of(users[pu].begin(), users[pu].end(), [&](ValueId u) {
          return group_of[static_cast<std::size_t>(u)] == gid;
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
        auto& members = groups[static_cast<std::size_t>(gid)].members;
        members.push_back(p);
        if (detail::external_inputs(g, members, group_of, gid).size() > static_cast<std::size_t>(max_op_inputs)) {
          members.pop_back();
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
    const std::vector<ValueId> ext = detail::external_inputs(g, members, group_of, static_cast<int>(gid));
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
    replacement[static_cast<std::size_t>(root)] = Node{Op::FusedElementwise, ext, attrs, g.node(root).type};
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
