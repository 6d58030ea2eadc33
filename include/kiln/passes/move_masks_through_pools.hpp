// move_masks_through_pools: applies a relu gradient's mask before a max-pool gradient, on the
// pooled (smaller) tensor, so the pool's input is no longer needed once the pool gradient
// has read it.
#pragma once

#include <vector>

#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

/// Rewrites relu_grad(a, maxpool2d_grad(a, dp)) into maxpool2d_grad(a, relu_grad(p, dp)),
/// where p = maxpool2d(a) with the same window is already in the graph. Exact: the pool
/// gradient routes dp of each window to the window's maximum, which equals p there, so the
/// mask a > 0 at that place is the mask p > 0. The mask then runs over a quarter of the
/// elements (2x2 pools), and `a`, last read by the pool gradient, can give it its memory.
inline PassResult move_masks_through_pools(Graph& g, PassContext&) {
  const auto users = consumers(g);
  // For each relu_grad to rewrite: the forward pool whose output carries the mask.
  std::vector<ValueId> pool_of(static_cast<std::size_t>(g.size()), -1);
  bool any = false;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& mask = g.node(id);
    if (mask.op != Op::ReluGrad) continue;
    const ValueId a = mask.inputs[0];
    const Node& pool_grad = g.node(mask.inputs[1]);
    if (pool_grad.op != Op::MaxPool2dGrad || pool_grad.inputs[0] != a ||
        users[static_cast<std::size_t>(mask.inputs[1])].size() != 1)
      continue;
    for (ValueId p : users[static_cast<std::size_t>(a)]) {
      const Node& pool = g.node(p);
      if (pool.op == Op::MaxPool2d && pool.attrs == pool_grad.attrs && p < id) {
        pool_of[static_cast<std::size_t>(id)] = p;
        any = true;
        break;
      }
    }
  }
  PassResult result;
  if (!any) return result;

  GraphRebuild rebuild(g);
  for (ValueId id = 0; id < g.size(); ++id) {
    const ValueId pool = pool_of[static_cast<std::size_t>(id)];
    if (pool < 0) {
      rebuild.keep(g, id);
      continue;
    }
    const Node& pool_grad = g.node(g.node(id).inputs[1]);
    const ValueId dp = pool_grad.inputs[1];
    const ValueId masked = rebuild.push(Node{
        Op::ReluGrad, {rebuild.renumber(pool), rebuild.renumber(dp)}, NoAttrs{}, g.node(dp).type});
    rebuild.map(id, rebuild.push(Node{Op::MaxPool2dGrad,
                                      {rebuild.renumber(pool_grad.inputs[0]), masked},
                                      pool_grad.attrs,
                                      pool_grad.type}));
    result.count("masks_moved");
  }
  rebuild.finish(g);
  return result;
}

} // namespace kiln
