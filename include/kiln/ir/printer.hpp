// The stable text form of a graph, one node a line; used in tests and IR dumps.
#pragma once

#include <sstream>
#include <string>
#include <variant>

#include "kiln/ir/graph.hpp"

namespace kiln {

namespace detail {
inline std::string attr_text(const NoAttrs&) { return ""; }
inline std::string attr_text(const InputAttrs& a) {
  return " \"" + a.name + "\"" +
         (a.label_classes ? " {classes=" + std::to_string(a.label_classes) + "}" : "");
}
inline std::string attr_text(const ParamAttrs& a) { return " \"" + a.name + "\""; }
inline std::string float_text(float v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
inline std::string attr_text(const ScalarAttrs& a) {
  return " {value=" + float_text(a.value) + "}";
}
inline std::string attr_text(const ShapeAttrs& a) { return " {shape=" + a.shape.str() + "}"; }
inline std::string attr_text(const FillAttrs& a) {
  return " {value=" + float_text(a.value) + ", shape=" + a.shape.str() + "}";
}
inline std::string attr_text(const MatMulAttrs& a) {
  return std::string(" {") + (a.transpose_a ? "ta" : "a") + ", " + (a.transpose_b ? "tb" : "b") +
         "}";
}
inline std::string attr_text(const Conv2dAttrs& a) {
  return " {stride=" + std::to_string(a.stride_h) + "x" + std::to_string(a.stride_w) +
         ", pad=" + std::to_string(a.pad_h) + "x" + std::to_string(a.pad_w) + "}";
}
inline std::string attr_text(const Pool2dAttrs& a) {
  return " {kernel=" + std::to_string(a.kernel) + ", stride=" + std::to_string(a.stride) +
         ", pad=" + std::to_string(a.padding) + "}";
}
inline std::string attr_text(const DropoutAttrs& a) {
  return " {p=" + float_text(a.p) + ", seed=" + std::to_string(a.seed) + "}";
}
inline std::string attr_text(const FusedAttrs& a) {
  const auto operand = [](int v) {
    return v < 0 ? "in" + std::to_string(-(v + 1)) : "t" + std::to_string(v);
  };
  std::string s = " {";
  for (std::size_t i = 0; i < a.program.size(); ++i) {
    const FusedInstruction& f = a.program[i];
    s += (i ? "; t" : "t") + std::to_string(i) + "=" + std::string(op_name(f.op)) + "(" +
         operand(f.a);
    if (f.b != f.a) s += ", " + operand(f.b);
    if (f.op == Op::MulScalar || f.op == Op::AddScalar) s += ", " + float_text(f.scalar);
    s += ")";
  }
  for (const FusedStore& st : a.stores)
    s += "; store t" + std::to_string(st.step) + " -> in" + std::to_string(st.input);
  return s + "}";
}
} // namespace detail

/// The type as printed: "f32[64,10]".
inline std::string type_text(const TensorType& t) {
  return std::string(dtype_name(t.dtype)) + t.shape.str();
}

/// One node: "%5 = add(%3, %4) : f32[64,10]".
inline std::string node_text(const Graph& g, ValueId id) {
  const Node& n = g.node(id);
  std::string s = "%" + std::to_string(id) + " = " + std::string(op_name(n.op));
  if (!n.inputs.empty()) {
    s += "(";
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      s += (i ? ", %" : "%") + std::to_string(n.inputs[i]);
    s += ")";
  }
  s += std::visit([](const auto& a) { return detail::attr_text(a); }, n.attrs);
  return s + " : " + type_text(n.type);
}

/// The whole graph, then its outputs: stable, so tests compare it as text.
inline std::string to_text(const Graph& g) {
  std::string s;
  for (ValueId id = 0; id < g.size(); ++id) s += node_text(g, id) + "\n";
  s += "outputs:";
  for (ValueId o : g.outputs()) s += " %" + std::to_string(o);
  return s + "\n";
}

} // namespace kiln
