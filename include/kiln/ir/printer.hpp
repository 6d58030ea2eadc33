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
inline std::string attr_text(const CollectiveAttrs& a) {
  return " {slot=" + std::to_string(a.slot) + "}";
}
inline std::string attr_text(const PartAttrs& a) {
  return " {offset=" + std::to_string(a.offset) + ", shape=" + a.shape.str() + "}";
}
inline std::string attr_text(const TransposeAttrs& a) {
  return " {perm=" + perm_text(a.perm) + "}";
}
inline std::string attr_text(const FillAttrs& a) {
  return " {value=" + float_text(a.value) + ", shape=" + a.shape.str() + "}";
}
/// "t0=add(in0, in1); t1=relu(t0); store t0 -> in2": `input(k)` names program input k.
template <class InputName>
std::string program_text(const std::vector<FusedInstruction>& program,
                         const std::vector<FusedStore>& stores, const InputName& input) {
  const auto operand = [&](int v) { return v < 0 ? input(-(v + 1)) : "t" + std::to_string(v); };
  std::string s;
  for (std::size_t i = 0; i < program.size(); ++i) {
    const FusedInstruction& f = program[i];
    s += (i ? "; t" : "t") + std::to_string(i) + "=" + std::string(op_name(f.op)) + "(" +
         operand(f.a);
    if (f.b != f.a) s += ", " + operand(f.b);
    if (f.op == Op::MulScalar || f.op == Op::AddScalar) s += ", " + float_text(f.scalar);
    s += ")";
  }
  for (const FusedStore& st : stores)
    s += "; store t" + std::to_string(st.step) + " -> " + input(st.input);
  return s;
}
/// An anchor's epilogue: "acc" is the anchor's own result, inK the node's input K.
inline std::string epilogue_text(const Epilogue& e) {
  if (e.empty()) return "";
  return "; epilogue " + program_text(e.program, e.stores, [](int k) {
           return k == 0 ? std::string("acc") : "in" + std::to_string(anchor_arity + k - 1);
         });
}
inline std::string attr_text(const MatMulAttrs& a) {
  return std::string(" {") + (a.transpose_a ? "ta" : "a") + ", " + (a.transpose_b ? "tb" : "b") +
         epilogue_text(a.epilogue) + "}";
}
inline std::string attr_text(const Conv2dAttrs& a) {
  return " {stride=" + std::to_string(a.stride_h) + "x" + std::to_string(a.stride_w) +
         ", pad=" + std::to_string(a.pad_h) + "x" + std::to_string(a.pad_w) +
         (a.channels_last ? ", nhwc" : "") + (a.winograd ? ", winograd" : "") +
         epilogue_text(a.epilogue) + "}";
}
inline std::string attr_text(const Pool2dAttrs& a) {
  return " {kernel=" + std::to_string(a.kernel) + ", stride=" + std::to_string(a.stride) +
         ", pad=" + std::to_string(a.padding) + (a.channels_last ? ", nhwc" : "") +
         (a.flip_pooled_layout ? (a.channels_last ? ", pooled nchw" : ", pooled nhwc") : "") + "}";
}
inline std::string attr_text(const DropoutAttrs& a) {
  return " {p=" + float_text(a.p) + ", seed=" + std::to_string(a.seed) + "}";
}
inline std::string attr_text(const FusedAttrs& a) {
  return " {" + program_text(a.program, a.stores, [](int k) { return "in" + std::to_string(k); }) +
         "}";
}
inline std::string attr_text(const FusedSumAttrs& a) {
  return " {" +
         program_text(a.chain.program, a.chain.stores,
                      [](int k) { return "in" + std::to_string(k); }) +
         "; over " + a.chain.shape.str() + "}";
}
} // namespace detail

/// The type as printed: "f32[64,10]".
inline std::string type_text(const TensorType& t) {
  return std::string(dtype_name(t.dtype)) + t.shape.str();
}

/// One node: "%5 = add(%3, %4) : f32[64,10]", then "inplace(%3)" when the inplace pass let it
/// write over input %3.
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
  s += " : " + type_text(n.type);
  if (n.in_place_of >= 0 && static_cast<std::size_t>(n.in_place_of) < n.inputs.size())
    s += " inplace(%" + std::to_string(n.inputs[static_cast<std::size_t>(n.in_place_of)]) + ")";
  return s;
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
