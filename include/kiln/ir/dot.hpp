// Graphviz DOT export of a graph: render with `dot -Tsvg graph.dot -o graph.svg`.
#pragma once

#include <string>

#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"

namespace kiln {

/// The graph in DOT: one box per node labelled with op and type; inputs, params and
/// outputs are coloured so the training step's structure is visible.
inline std::string to_dot(const Graph& g) {
  std::string s =
      "digraph kiln {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    std::string label = "%" + std::to_string(id) + " " + std::string(op_name(n.op));
    if (const auto* in = std::get_if<InputAttrs>(&n.attrs)) label += " " + in->name;
    if (const auto* p = std::get_if<ParamAttrs>(&n.attrs)) label += " " + p->name;
    label += "\\n" + type_text(n.type);
    std::string style;
    if (n.op == Op::Input)
      style = ", style=filled, fillcolor=\"#cde4ff\"";
    else if (n.op == Op::Param)
      style = ", style=filled, fillcolor=\"#e8e8e8\"";
    else if (n.op == Op::Assign)
      style = ", style=filled, fillcolor=\"#ffe0b3\"";
    for (ValueId o : g.outputs())
      if (o == id) style = ", style=filled, fillcolor=\"#c8f0c8\"";
    s += "  n" + std::to_string(id) + " [label=\"" + label + "\"" + style + "];\n";
    for (ValueId in : n.inputs)
      s += "  n" + std::to_string(in) + " -> n" + std::to_string(id) + ";\n";
  }
  return s + "}\n";
}

} // namespace kiln
