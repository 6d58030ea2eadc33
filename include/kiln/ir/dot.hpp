// Graphviz DOT export of a graph: render with `dot -Tsvg graph.dot -o graph.svg`.
#pragma once

#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"

namespace kiln {

namespace detail {
/// A program (a fused node's, or an anchor's epilogue) as a cluster of its steps; the last
/// step carries the node's own name so that edges to its consumers attach to it.
/// `source(k)` is the DOT node of program input k; `first_line` opens the cluster's body.
template <class Source>
std::string program_cluster(const Graph& g, ValueId id, const std::string& title,
                            const std::vector<FusedInstruction>& program,
                            const std::vector<FusedStore>& stores, const Source& source,
                            const std::string& first_line = "") {
  const Node& n = g.node(id);
  const std::string base = "n" + std::to_string(id);
  const auto step_name = [&](std::size_t k) {
    return k + 1 == program.size() ? base : base + "_s" + std::to_string(k);
  };
  std::string s = "  subgraph cluster_" + base + " {\n    label=\"%" + std::to_string(id) + " " +
                  title + " " + type_text(n.type) +
                  "\";\n    style=filled; fillcolor=\"#fff4d6\";\n" + first_line;
  for (std::size_t k = 0; k < program.size(); ++k)
    s += "    " + step_name(k) + " [label=\"t" + std::to_string(k) + " " +
         std::string(op_name(program[k].op)) + "\"];\n";
  s += "  }\n";
  for (std::size_t k = 0; k < program.size(); ++k) {
    const FusedInstruction& f = program[k];
    for (const int operand : {static_cast<int>(f.a), static_cast<int>(f.b)}) {
      const std::string from =
          operand >= 0 ? step_name(static_cast<std::size_t>(operand)) : source(-(operand + 1));
      s += "  " + from + " -> " + step_name(k) + ";\n";
      if (f.a == f.b) break;
    }
  }
  for (const FusedStore& st : stores)
    s += "  " + step_name(static_cast<std::size_t>(st.step)) + " -> " + source(st.input) +
         " [style=dashed, label=\"store\"];\n";
  return s;
}

/// A fused node (a fused elementwise chain, or one summed down): its steps read the node's
/// inputs.
inline std::string fused_cluster(const Graph& g, ValueId id, const FusedAttrs& fused) {
  const Node& n = g.node(id);
  return program_cluster(
      g, id, std::string(op_name(n.op)), fused.program, fused.stores,
      [&](int k) { return "n" + std::to_string(n.inputs[static_cast<std::size_t>(k)]); });
}

/// An anchor with an epilogue: the anchor itself (fed by its own two inputs) opens the
/// cluster, and the epilogue's steps follow it in the same kernel.
inline std::string epilogue_cluster(const Graph& g, ValueId id, const Epilogue& e) {
  const Node& n = g.node(id);
  const std::string anchor = "n" + std::to_string(id) + "_acc";
  std::string s = program_cluster(
      g, id, std::string(op_name(n.op)) + " + epilogue", e.program, e.stores,
      [&](int k) {
        return k == 0
                   ? anchor
                   : "n" + std::to_string(n.inputs[static_cast<std::size_t>(anchor_arity + k - 1)]);
      },
      "    " + anchor + " [label=\"" + std::string(op_name(n.op)) + "\"];\n");
  for (int i = 0; i < anchor_arity; ++i)
    s += "  n" + std::to_string(n.inputs[static_cast<std::size_t>(i)]) + " -> " + anchor + ";\n";
  return s;
}
} // namespace detail

/// The graph in DOT: one box per node labelled with op and type; inputs, params and
/// outputs are coloured so the training step's structure is visible, each fused node
/// is drawn as a cluster of the ops it runs in one kernel, and layout transforms (transposes)
/// as pink hexagons.
inline std::string to_dot(const Graph& g) {
  std::string s =
      "digraph kiln {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (const auto* fused = std::get_if<FusedAttrs>(&n.attrs)) {
      s += detail::fused_cluster(g, id, *fused);
      continue;
    }
    if (const auto* summed = std::get_if<FusedSumAttrs>(&n.attrs)) {
      s += detail::fused_cluster(g, id, summed->chain);
      continue;
    }
    if (const Epilogue* e = epilogue_of(n.attrs); e && !e->empty()) {
      s += detail::epilogue_cluster(g, id, *e);
      continue;
    }
    std::string label = "%" + std::to_string(id) + " " + std::string(op_name(n.op));
    if (const auto* in = std::get_if<InputAttrs>(&n.attrs)) label += " " + in->name;
    if (const auto* p = std::get_if<ParamAttrs>(&n.attrs)) label += " " + p->name;
    if (const auto* t = std::get_if<TransposeAttrs>(&n.attrs)) label += detail::attr_text(*t);
    label += "\\n" + type_text(n.type);
    std::string style;
    if (n.op == Op::Input)
      style = ", style=filled, fillcolor=\"#cde4ff\"";
    else if (n.op == Op::Param)
      style = ", style=filled, fillcolor=\"#e8e8e8\"";
    else if (n.op == Op::Assign)
      style = ", style=filled, fillcolor=\"#ffe0b3\"";
    else if (n.op == Op::Transpose) // a layout change the layout pass inserted
      style = ", shape=hexagon, style=filled, fillcolor=\"#f4c2f4\"";
    for (ValueId o : g.outputs())
      if (o == id) style = ", style=filled, fillcolor=\"#c8f0c8\"";
    s += "  n" + std::to_string(id) + " [label=\"" + label + "\"" + style + "];\n";
    for (ValueId in : n.inputs)
      s += "  n" + std::to_string(in) + " -> n" + std::to_string(id) + ";\n";
  }
  return s + "}\n";
}

} // namespace kiln
