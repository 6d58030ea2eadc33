// The verifier: re-checks a whole graph (after building or after a pass) against the op
// definitions: arity, operand order, types, and state-update hazards.
#pragma once

#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/ops/effects.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

/// Throws kiln::Error (kiln.verify.*) at the first node that is malformed.
inline void verify(const Graph& g) {
  std::vector<bool> assigned(static_cast<std::size_t>(g.size()), false);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    for (ValueId in : n.inputs) {
      if (in < 0 || in >= id)
        fail(errc::graph, "node %" + std::to_string(id) + " " + std::string(op_name(n.op)) +
                              ": input %" + std::to_string(in) + " is not defined before it");
      if (assigned[static_cast<std::size_t>(in)] &&
          !(op_info(n.op).role == OpRole::update && in == n.inputs[0]))
        fail(errc::graph, "node %" + std::to_string(id) + " " + std::string(op_name(n.op)) +
                              " reads param %" + std::to_string(in) + " after it was assigned");
    }
    if (op_info(n.op).is_source()) {
      if (!n.inputs.empty())
        fail(errc::arity, "node %" + std::to_string(id) + ": a source has inputs");
      continue;
    }
    if (n.in_place_of >= static_cast<int>(n.inputs.size()) ||
        (op_info(n.op).role == OpRole::update && n.in_place_of == 0))
      fail(errc::graph, "node %" + std::to_string(id) + " " + std::string(op_name(n.op)) +
                            ": in place of input " + std::to_string(n.in_place_of) +
                            ", which it cannot take over");
    const TensorType t = infer_type(g, id, n.op, n.inputs, n.attrs);
    if (!(t == n.type))
      fail(errc::shape, "node %" + std::to_string(id) + " " + std::string(op_name(n.op)) +
                            ": recorded type " + type_text(n.type) + " but its inputs give " +
                            type_text(t));
    for (ValueId target : assigned_params(n)) {
      if (assigned[static_cast<std::size_t>(target)])
        fail(errc::graph, "node %" + std::to_string(id) + ": param %" + std::to_string(target) +
                              " is assigned twice");
      assigned[static_cast<std::size_t>(target)] = true;
    }
  }
  for (ValueId o : g.outputs())
    if (o < 0 || o >= g.size())
      fail(errc::graph, "output %" + std::to_string(o) + " does not exist");
}

} // namespace kiln
