// schedule_for_memory: reorders the step so that buffers die early. Graph order is the order
// autodiff emitted nodes in, which puts every weight gradient after every input gradient;
// a greedy list scheduler instead runs, among the nodes whose inputs are ready, the one that
// frees the most memory for what it allocates, so that (say) a convolution's weight gradient
// runs before its input gradient and the activation both read dies at the second.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"
#include "kiln/passes/storage.hpp"

namespace kiln {

/// The scheduling pass. Besides its inputs, a node that stores into a param (an assign, or
/// a fused kernel's store) waits for every other node reading that param, so every read still
/// sees the old value; so does the value an assign stores. Among ready nodes, views, inputs and
/// params go first (they cost nothing), with the nodes that start overlapping work
/// (SchedulePriority::first, an all-reduce's start); then the node with the largest bytes freed
/// minus bytes allocated; the nodes that wait for overlapping work (SchedulePriority::last) only
/// when nothing else is ready. Ties keep graph order, so a graph whose order is already best
/// is left as it is.
inline PassResult schedule_for_memory(Graph& g, PassContext&) {
  const StorageMap storage = storage_map(g);
  const auto count = static_cast<std::size_t>(g.size());
  const auto at = [](ValueId v) { return static_cast<std::size_t>(v); };

  // Edges: data, then param reads before the param's update.
  std::vector<std::vector<ValueId>> successors(count);
  std::vector<int> waiting(count, 0);
  const auto add_edge = [&](ValueId from, ValueId to) {
    successors[at(from)].push_back(to);
    ++waiting[at(to)];
  };
  const auto users = consumers(g);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    for (ValueId in : n.inputs) add_edge(in, id);
    for (ValueId param : assigned_params(n))
      for (ValueId reader : users[at(param)])
        if (reader != id) add_edge(reader, id);
    // The value an assign stores is best computed straight into the param (lowering's
    // in-place update), which needs the param's other readers to have run by then. Edges
    // that follow graph order cannot close a cycle.
    if (op_info(n.op).role == OpRole::update)
      for (ValueId reader : users[at(n.inputs[0])])
        if (reader < n.inputs[1]) add_edge(reader, n.inputs[1]);
  }

  // Uses left of each storage, counted once per reading node; outputs are never freed.
  std::vector<int> uses_left(count, 0);
  std::vector<bool> pinned(count, false);
  for (ValueId o : g.outputs()) pinned[at(storage.root_of(o))] = true;
  const auto storages_read = [&](ValueId id) {
    std::vector<ValueId> read;
    for (ValueId in : g.node(id).inputs) {
      const ValueId s = storage.root_of(in);
      if (std::find(read.begin(), read.end(), s) == read.end()) read.push_back(s);
    }
    return read;
  };
  std::vector<std::vector<ValueId>> reads(count);
  for (ValueId id = 0; id < g.size(); ++id) {
    if (op_info(g.node(id).op).is_view) continue;
    reads[at(id)] = storages_read(id);
    for (ValueId s : reads[at(id)]) ++uses_left[at(s)];
  }

  const auto bytes_of = [&](ValueId v) {
    return allocates(g, storage, v) ? static_cast<std::int64_t>(value_bytes(g.node(v))) : 0;
  };
  const auto net_freed = [&](ValueId id) {
    std::int64_t net = -bytes_of(id);
    for (ValueId s : reads[at(id)])
      if (uses_left[at(s)] == 1 && !pinned[at(s)]) net += bytes_of(s);
    return net;
  };

  std::vector<ValueId> ready, order;
  order.reserve(count);
  for (ValueId id = 0; id < g.size(); ++id)
    if (waiting[at(id)] == 0) ready.push_back(id);
  while (!ready.empty()) {
    // Rank of each ready node: lower runs first. The first free node found runs at once;
    // within the other ranks, the higher score, then graph order.
    const auto rank_of = [&](ValueId id) {
      const SchedulePriority p = op_info(g.node(id).op).schedule;
      if (p == SchedulePriority::first) return 0;
      if (!allocates(g, storage, id) && p != SchedulePriority::last) return 0;
      return p == SchedulePriority::last ? 2 : 1;
    };
    std::size_t best = 0;
    int best_rank = 3;
    std::int64_t best_score = 0;
    for (std::size_t k = 0; k < ready.size(); ++k) {
      const ValueId id = ready[k];
      const int rank = rank_of(id);
      const std::int64_t score = rank == 1 ? net_freed(id) : 0;
      if (rank < best_rank || (rank == best_rank && rank > 0 && score > best_score) ||
          (rank == best_rank && rank > 0 && score == best_score && id < ready[best])) {
        best = k;
        best_rank = rank;
        best_score = score;
      }
    }
    const ValueId next = ready[best];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    order.push_back(next);
    for (ValueId s : reads[at(next)]) --uses_left[at(s)];
    for (ValueId succ : successors[at(next)])
      if (--waiting[at(succ)] == 0) ready.push_back(succ);
  }

  if (order.size() != count)
    fail(errc::graph, "schedule: " + std::to_string(count - order.size()) +
                          " nodes wait on each other (a param read after its own update?)");
  PassResult result;
  std::int32_t moved = 0;
  for (std::size_t k = 0; k < order.size(); ++k) moved += order[k] != static_cast<ValueId>(k);
  if (moved == 0) return result;
  result.count("nodes_moved", moved);
  GraphRebuild rebuild(g);
  for (ValueId id : order) rebuild.keep(g, id);
  rebuild.finish(g);
  return result;
}

} // namespace kiln
