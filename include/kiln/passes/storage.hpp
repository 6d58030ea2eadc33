// Which values share memory: the storage rules that the scheduler, the inplace pass and
// lowering all follow, so that they agree on what a buffer is and when it dies.
#pragma once

#include <cstddef>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

/// Where every value's elements live: the value whose buffer holds them (its storage root)
/// and the byte offset into that buffer. A view lives in its input 0 (a part at its offset),
/// an update in its param, a node the inplace pass annotated in the input it took over, and
/// the value an in-place update assigns in the param it is assigned to.
struct StorageMap {
  std::vector<ValueId> root;
  std::vector<std::size_t> offset;

  [[nodiscard]] ValueId root_of(ValueId v) const { return root[static_cast<std::size_t>(v)]; }
};

/// The input whose memory node `n`'s value uses instead of a buffer of its own, or -1.
inline int aliased_input(const Node& n) {
  if (op_info(n.op).aliases_input()) return 0;
  return n.in_place_of;
}

/// Whether node `n` runs a kernel: it computes, and is not an update whose value was already
/// computed into its param.
inline bool runs_kernel(const Node& n) {
  const OpInfo& info = op_info(n.op);
  return info.computes() && !(info.role == OpRole::update && n.in_place_of >= 0);
}

/// Step index of each node that runs a kernel (graph order), -1 for the others.
inline std::vector<int> number_steps(const Graph& g) {
  std::vector<int> step_of(static_cast<std::size_t>(g.size()), -1);
  int steps = 0;
  for (ValueId id = 0; id < g.size(); ++id)
    if (runs_kernel(g.node(id))) step_of[static_cast<std::size_t>(id)] = steps++;
  return step_of;
}

inline StorageMap storage_map(const Graph& g) {
  const auto count = static_cast<std::size_t>(g.size());
  std::vector<ValueId> parent(count);
  std::vector<std::size_t> relative(count, 0); // bytes into the parent's memory
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    const auto at = static_cast<std::size_t>(id);
    parent[at] = id;
    if (const int k = aliased_input(n); k >= 0) {
      parent[at] = n.inputs[static_cast<std::size_t>(k)];
      if (const auto* part = std::get_if<PartAttrs>(&n.attrs))
        relative[at] = static_cast<std::size_t>(part->offset) * dtype_size(n.type.dtype);
    }
    // The assigned value was computed in the param: it is the param's memory from the start.
    if (op_info(n.op).role == OpRole::update && n.in_place_of >= 0)
      parent[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(n.in_place_of)])] =
          n.inputs[0];
  }
  StorageMap map{std::vector<ValueId>(count), std::vector<std::size_t>(count, 0)};
  for (std::size_t v = 0; v < count; ++v) {
    auto at = static_cast<ValueId>(v);
    while (parent[static_cast<std::size_t>(at)] != at) {
      map.offset[v] += relative[static_cast<std::size_t>(at)];
      at = parent[static_cast<std::size_t>(at)];
    }
    map.root[v] = at;
  }
  return map;
}

/// Whether value `v` is the root of an arena buffer that a kernel allocates: it runs a kernel
/// and no other value's memory holds it (not a graph input, a param or an alias).
inline bool allocates(const Graph& g, const StorageMap& storage, ValueId v) {
  return storage.root_of(v) == v && runs_kernel(g.node(v)) &&
         op_info(g.node(v).op).role != OpRole::update;
}

/// Bytes of a value's elements.
inline std::size_t value_bytes(const Node& n) {
  return static_cast<std::size_t>(n.type.shape.numel()) * dtype_size(n.type.dtype);
}

} // namespace kiln
