// eliminate_common_subexpressions: merges nodes that compute the same value from the same inputs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace detail {

inline std::size_t hash_mix(std::size_t h, std::size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

inline std::size_t hash_shape(std::size_t h, const Shape& s) {
  for (std::int64_t d : s) h = hash_mix(h, std::hash<std::int64_t>{}(d));
  return h;
}

/// Consistent with Attrs' operator== (+0 and -0 compare equal, so they hash alike). Only the
/// attributes of input-less nodes (fill, dropout_mask) need to spread well: other nodes are
/// already told apart by their inputs.
inline std::size_t hash_attrs(const Attrs& attrs) {
  const auto f = [](float v) { return std::hash<float>{}(v == 0.0f ? 0.0f : v); };
  return std::visit(
      [&](const auto& a) -> std::size_t {
        using A = std::decay_t<decltype(a)>;
        const std::size_t h = attrs.index();
        if constexpr (std::is_same_v<A, ScalarAttrs>)
          return hash_mix(h, f(a.value));
        else if constexpr (std::is_same_v<A, ShapeAttrs>)
          return hash_shape(h, a.shape);
        else if constexpr (std::is_same_v<A, FillAttrs>)
          return hash_shape(hash_mix(h, f(a.value)), a.shape);
        else if constexpr (std::is_same_v<A, DropoutAttrs>)
          return hash_shape(hash_mix(hash_mix(h, f(a.p)), std::hash<std::uint64_t>{}(a.seed)),
                            a.shape);
        else
          return h;
      },
      attrs);
}

/// What two nodes must share to be candidates for merging; their attrs are then compared.
struct CseKey {
  Op op = Op::Input;
  std::vector<ValueId> inputs;
  std::uint32_t reads_after_assign = 0; ///< bit i: input i is read after its storage's assign
  std::size_t attrs_hash = 0;
  friend bool operator==(const CseKey&, const CseKey&) = default;
};

struct CseKeyHash {
  std::size_t operator()(const CseKey& k) const {
    std::size_t h = hash_mix(static_cast<std::size_t>(k.op), k.attrs_hash);
    for (ValueId in : k.inputs) h = hash_mix(h, std::hash<ValueId>{}(in));
    return hash_mix(h, k.reads_after_assign);
  }
};

} // namespace detail

/// Merges each node into the first earlier node with the same op, the same inputs (after
/// earlier merges, in either order for add and mul) and equal attributes: its uses read the
/// earlier value. Inputs and params stay distinct (they are values by identity) and nodes
/// with side effects (assigns, fused stores) stay; dropout_mask is a pure function of its
/// attributes and the run counter, so equal masks merge. Two reads of a param's storage on either
/// side of its assign see different contents and are not merged. Expected O(n) with hashing.
inline PassResult eliminate_common_subexpressions(Graph& g, PassContext&) {
  const auto n = static_cast<std::size_t>(g.size());
  const std::vector<ValueId> overwritten = overwritten_at(g);
  std::vector<ValueId> forward(n);
  std::iota(forward.begin(), forward.end(), ValueId{0});
  std::vector<bool> keep(n, true);
  std::unordered_map<detail::CseKey, std::vector<ValueId>, detail::CseKeyHash> seen;
  std::int64_t merged = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const OpInfo& info = op_info(node.op);
    if (info.is_source() || has_side_effect(node)) continue;
    detail::CseKey key{node.op, {}, 0, detail::hash_attrs(node.attrs)};
    for (ValueId in : node.inputs) key.inputs.push_back(forward[static_cast<std::size_t>(in)]);
    if (info.commutative) std::sort(key.inputs.begin(), key.inputs.end());
    for (std::size_t i = 0; i < key.inputs.size(); ++i)
      if (id > overwritten[static_cast<std::size_t>(key.inputs[i])])
        key.reads_after_assign |= 1u << i;
    std::vector<ValueId>& same = seen[std::move(key)];
    const auto match = std::find_if(same.begin(), same.end(), [&](ValueId earlier) {
      return g.node(earlier).attrs == node.attrs && g.node(earlier).type == node.type;
    });
    if (match == same.end()) {
      same.push_back(id);
      continue;
    }
    forward[static_cast<std::size_t>(id)] = *match;
    keep[static_cast<std::size_t>(id)] = false;
    ++merged;
  }
  if (merged > 0) compact(g, keep, std::move(forward));
  PassResult r;
  r.count("nodes_merged", merged);
  return r;
}

} // namespace kiln
