// The op table: each op's definition gathered from its family header, indexed by Op.
// Generic stages (verifier, autodiff, lowering) consult this table instead of switching.
#pragma once

#include <array>

#include "kiln/ops/collective.hpp"
#include "kiln/ops/conv.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/fused.hpp"
#include "kiln/ops/loss.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/pool.hpp"
#include "kiln/ops/reduce.hpp"
#include "kiln/ops/shape.hpp"
#include "kiln/ops/state.hpp"

namespace kiln {

/// Everything generic code needs to know about an op, without templates: the properties of
/// its OpDef (see OpDefaults for what each means).
struct OpInfo {
  std::string_view name;
  int arity = 0;
  FusionKind kind = FusionKind::opaque;
  OpRole role = OpRole::compute;
  bool is_view = false;
  bool is_elementwise = false;
  bool overwrites_any_input = false;
  bool commutative = false;
  bool fusable_sum = false;
  LayoutRule layout = LayoutRule::nchw;
  SchedulePriority schedule = SchedulePriority::by_memory;
  ChannelsLastForm channels_last_form{};
  JointKernel joint{};
  InferFn infer = nullptr;
  GradFn grad = nullptr; ///< nullptr: not differentiable
  int (*overwritable_input)(const Attrs&) = nullptr;
  Attrs (*channels_last_attrs)(const Attrs&) = nullptr;
  Attrs (*port_layout_attrs)(const Attrs&, int port, bool channels_last) = nullptr;
  FlopsFn flops = nullptr;
  FlopsFn column_matrix_bytes = nullptr;

  /// Whether its attributes store the rank-4 activation at `port` (an input, or -1 for the
  /// output) channels-last, by port_layout_attrs.
  [[nodiscard]] bool port_channels_last(const Attrs& attrs, int port) const {
    return port_layout_attrs(attrs, port, true) == attrs &&
           !(port_layout_attrs(attrs, port, false) == attrs);
  }
  /// Its value lives in input 0's memory: a view, or an update's param.
  [[nodiscard]] bool aliases_input() const { return is_view || role == OpRole::update; }
  /// Has no inputs and is typed when made: a graph input or a param.
  [[nodiscard]] bool is_source() const { return role == OpRole::input || role == OpRole::param; }
  /// Runs a kernel unless an analysis proves it needs none (an update done in place).
  [[nodiscard]] bool computes() const {
    return (role == OpRole::compute || role == OpRole::constant || role == OpRole::update) &&
           !is_view;
  }
};

namespace detail {
template <Op op> constexpr OpInfo make_op_info() {
  using D = OpDef<op>;
  OpInfo info;
  info.name = op_name(op);
  info.arity = D::arity;
  info.kind = D::kind;
  info.role = D::role;
  info.is_view = D::is_view;
  info.is_elementwise = D::is_elementwise;
  info.overwrites_any_input = D::overwrites_any_input;
  info.commutative = D::commutative;
  info.fusable_sum = D::fusable_sum;
  info.layout = D::layout;
  info.schedule = D::schedule;
  info.channels_last_form = D::channels_last_form;
  info.joint = D::joint;
  info.infer = &D::infer;
  info.grad = D::grad;
  info.overwritable_input = &D::overwritable_input;
  info.channels_last_attrs = &D::channels_last_attrs;
  info.port_layout_attrs = &D::port_layout_attrs;
  info.flops = &D::flops;
  info.column_matrix_bytes = &D::column_matrix_bytes;
  return info;
}
} // namespace detail

/// The definition of `op`.
inline const OpInfo& op_info(Op op) {
  static constexpr std::array<OpInfo, op_count> table = {
#define KILN_OP_INFO(name, spelling) detail::make_op_info<Op::name>(),
      KILN_OP_LIST(KILN_OP_INFO)
#undef KILN_OP_INFO
  };
  return table[op_index(op)];
}

/// The output type of a node of `op` about to be added as node `id`, from the op's definition;
/// throws kiln::Error naming the node.
inline TensorType infer_type(const Graph& graph, ValueId id, Op op,
                             const std::vector<ValueId>& inputs, const Attrs& attrs) {
  const InferContext ctx{graph, id, op, inputs, attrs};
  const OpInfo& info = op_info(op);
  if (info.arity >= 0 && ctx.arity() != info.arity)
    ctx.fail(errc::arity,
             "takes " + std::to_string(info.arity) + " inputs, got " + std::to_string(ctx.arity()));
  return info.infer(ctx);
}

inline Value append(Graph& g, Op op, std::vector<ValueId> inputs, Attrs attrs) {
  const ValueId id = g.size();
  for (ValueId in : inputs)
    if (in < 0 || in >= id)
      fail(errc::graph, "node %" + std::to_string(id) + " " + std::string(op_name(op)) +
                            ": input %" + std::to_string(in) + " does not exist");
  TensorType type = infer_type(g, id, op, inputs, attrs);
  check_shape(type.shape, dtype_size(type.dtype),
              "node %" + std::to_string(id) + " " + std::string(op_name(op)));
  return g.push(Node{op, std::move(inputs), std::move(attrs), type});
}

} // namespace kiln
