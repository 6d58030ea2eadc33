// choose_layouts: picks NCHW or NHWC for each group of activations that convolutions read or
// write, weighing the column matrices channels-last kernels avoid against the reorders a
// group needs at its edges, then rewrites the graph to match: channels-last convolutions
// with their weights pre-packed once per step, pools and elementwise ops in the group's
// layout, and a transpose wherever a value crosses from one layout to the other.
#pragma once

#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kiln/ops/conv.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace layout_detail {

inline constexpr std::array<int, 4> nchw_to_nhwc{0, 2, 3, 1};
inline constexpr std::array<int, 4> nhwc_to_nchw{0, 3, 1, 2};
/// Pre-packed conv2d weights: OIHW to [KH, KW, C, O], and to [KH, KW, O, C] for the input
/// gradient (see Conv2dAttrs::channels_last).
inline constexpr std::array<int, 4> forward_weight_pack{2, 3, 1, 0};
inline constexpr std::array<int, 4> backward_weight_pack{2, 3, 0, 1};

/// True when `perm` only moves axes of size 1: the reorder is then a reshape, a free view.
inline bool is_free(const Shape& s, std::span<const int> perm) {
  int last = -1;
  for (const int axis : perm) {
    if (s[axis] == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

inline std::int64_t reorder_bytes(const Shape& s, std::span<const int> perm) {
  return is_free(s, perm) ? 0 : 2 * s.numel() * static_cast<std::int64_t>(sizeof(float));
}

inline bool is_conv(Op op) {
  return op == Op::Conv2d || op == Op::Conv2dGradInput || op == Op::Conv2dGradWeight;
}

/// The activations a convolution reads or writes, which a channels-last kernel keeps NHWC:
/// its input 0 and output, or both inputs of the weight gradient.
inline std::array<ValueId, 2> activation_ports(const Node& n, ValueId id) {
  if (n.op == Op::Conv2dGradWeight) return {n.inputs[0], n.inputs[1]};
  return {n.inputs[0], id};
}

/// Whether the target has a kernel for the channels-last form of this convolution: its
/// activations NHWC, its weight pre-packed (the weight gradient stays OIHW).
inline bool has_channels_last_kernel(const Target& target, const Graph& g, const Node& n) {
  const auto& a = std::get<Conv2dAttrs>(n.attrs);
  if (target.channels_last_multiple == 0 || a.channels_last || !a.epilogue.empty()) return false;
  Attrs attrs = n.attrs;
  std::get<Conv2dAttrs>(attrs).channels_last = true;
  const auto type = [&](ValueId v) { return g.node(v).type; };
  const auto nhwc = [](TensorType t) {
    t.shape = permuted(t.shape, nchw_to_nhwc);
    return t;
  };
  std::array<TensorType, 2> in{nhwc(type(n.inputs[0])), type(n.inputs[1])};
  TensorType out = n.type;
  if (n.op == Op::Conv2dGradWeight) {
    in[1] = nhwc(in[1]);
  } else {
    in[1].shape =
        permuted(in[1].shape, n.op == Op::Conv2d ? std::span<const int>(forward_weight_pack)
                                                 : std::span<const int>(backward_weight_pack));
    out = nhwc(out);
  }
  return target.runs(KernelQuery{n.op, &attrs, in, out});
}

/// What the channels-last kernel of a convolution saves: its NCHW kernel's column matrix.
inline std::int64_t column_matrix_bytes(const Graph& g, const Node& n, ValueId id) {
  const Shape& x = n.op == Op::Conv2dGradInput ? n.type.shape : g.node(n.inputs[0]).type.shape;
  const ValueId y = n.op == Op::Conv2d            ? id
                    : n.op == Op::Conv2dGradInput ? n.inputs[0]
                                                  : n.inputs[1];
  return kiln::column_matrix_bytes(std::get<Conv2dAttrs>(n.attrs), x, g.node(y).type.shape);
}

/// Ops whose rank-4 output shares its layout with its rank-4 inputs of the same shape (all
/// of them for pools): they run unchanged, or with a flag, in either layout. A dropout mask
/// depends on element order, so it is not one of them.
inline bool follows_layout(const Node& n) {
  if (n.type.shape.rank() != 4 || n.type.dtype != DType::f32) return false;
  if (n.op == Op::MaxPool2d || n.op == Op::MaxPool2dGrad)
    return !std::get<Pool2dAttrs>(n.attrs).channels_last;
  return op_info(n.op).is_elementwise && n.op != Op::DropoutMask;
}

/// Whether follower n joins input `in`'s layout group (rather than adapting it as a
/// broadcast operand).
inline bool joins(const Graph& g, const Node& n, ValueId in) {
  const Shape& s = g.node(in).type.shape;
  if (s.rank() != 4) return false;
  return n.op == Op::MaxPool2d || n.op == Op::MaxPool2dGrad || s == n.type.shape;
}

/// Union-find over values.
struct Groups {
  std::vector<ValueId> parent;
  explicit Groups(std::size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  ValueId find(ValueId v) {
    while (parent[static_cast<std::size_t>(v)] != v) {
      parent[static_cast<std::size_t>(v)] =
          parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(v)])];
      v = parent[static_cast<std::size_t>(v)];
    }
    return v;
  }
  void join(ValueId a, ValueId b) { parent[static_cast<std::size_t>(find(a))] = find(b); }
};

} // namespace layout_detail

/// The layout pass. Activations joined by elementwise ops and max pools form groups that
/// must share one layout. A group that convolutions read or write becomes NHWC when the
/// column matrices its convolutions' channels-last kernels avoid outweigh the reorders it
/// needs at its edges (values made or read by ops that only know NCHW, graph outputs); a
/// convolution runs channels-last only when all its activations do. Every decision and
/// every inserted reorder is recorded in the compile report.
inline PassResult choose_layouts(Graph& g, PassContext& ctx) {
  using namespace layout_detail;
  const auto count = static_cast<std::size_t>(g.size());
  const auto users = consumers(g);
  std::vector<bool> is_output(count, false);
  for (ValueId o : g.outputs()) is_output[static_cast<std::size_t>(o)] = true;

  Groups groups(count);
  std::vector<bool> follower(count, false), eligible(count, false), touches_conv(count, false);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (follows_layout(n)) {
      follower[static_cast<std::size_t>(id)] = true;
      for (ValueId in : n.inputs)
        if (joins(g, n, in)) groups.join(in, id);
    }
    if (is_conv(n.op))
      eligible[static_cast<std::size_t>(id)] = has_channels_last_kernel(ctx.target, g, n);
  }
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (is_conv(n.op))
      for (ValueId port : activation_ports(n, id))
        touches_conv[static_cast<std::size_t>(groups.find(port))] = true;
  }

  // A value is made NHWC when its producer runs in the group's layout: a follower, or a
  // channels-last convolution writing it. Everything else makes NCHW.
  const auto made_nhwc = [&](ValueId v) {
    const Node& n = g.node(v);
    return follower[static_cast<std::size_t>(v)] ||
           (eligible[static_cast<std::size_t>(v)] && n.op != Op::Conv2dGradWeight);
  };
  // Whether consumer `c` reads `v` in v's group layout.
  const auto reads_in_layout = [&](ValueId v, ValueId c) {
    const Node& n = g.node(c);
    if (follower[static_cast<std::size_t>(c)]) return joins(g, n, v);
    if (eligible[static_cast<std::size_t>(c)]) {
      const auto ports = activation_ports(n, c);
      return ports[0] == v || ports[1] == v;
    }
    return n.op == Op::SumTo && std::get<ShapeAttrs>(n.attrs).shape.rank() == 4;
  };

  // saved/cost: this weighing; weighed_*: the last weighing in which a group had something
  // to save, which is what the report quotes for a group that stays NCHW.
  std::vector<std::int64_t> saved(count), cost(count), weighed_saved(count, 0),
      weighed_cost(count, 0);
  std::vector<bool> nhwc(count, false);
  for (bool settled = false; !settled;) {
    std::fill(saved.begin(), saved.end(), 0);
    std::fill(cost.begin(), cost.end(), 0);
    for (ValueId id = 0; id < g.size(); ++id) {
      const Node& n = g.node(id);
      if (eligible[static_cast<std::size_t>(id)]) {
        const std::int64_t bytes = column_matrix_bytes(g, n, id);
        for (ValueId port : activation_ports(n, id))
          saved[static_cast<std::size_t>(groups.find(port))] += bytes / 2;
      }
      const ValueId group = groups.find(id);
      if (!touches_conv[static_cast<std::size_t>(group)] || n.type.shape.rank() != 4) continue;
      const std::int64_t reorder = reorder_bytes(n.type.shape, nchw_to_nhwc);
      bool read_as_nchw = is_output[static_cast<std::size_t>(id)];
      for (ValueId c : users[static_cast<std::size_t>(id)])
        read_as_nchw = read_as_nchw || !reads_in_layout(id, c);
      if (!made_nhwc(id)) cost[static_cast<std::size_t>(group)] += reorder;
      if (read_as_nchw) cost[static_cast<std::size_t>(group)] += reorder;
    }
    for (std::size_t v = 0; v < count; ++v) {
      nhwc[v] = saved[v] > cost[v];
      if (saved[v] > 0) {
        weighed_saved[v] = saved[v];
        weighed_cost[v] = cost[v];
      }
    }
    // A convolution whose activations did not all go NHWC stays NCHW; then weigh again.
    settled = true;
    for (ValueId id = 0; id < g.size(); ++id) {
      if (!eligible[static_cast<std::size_t>(id)]) continue;
      for (ValueId port : activation_ports(g.node(id), id)) {
        if (!nhwc[static_cast<std::size_t>(groups.find(port))]) {
          eligible[static_cast<std::size_t>(id)] = false;
          settled = false;
        }
      }
    }
  }

  PassResult result;
  // Record the decision for every group a convolution touches.
  std::vector<std::int32_t> decision_of(count, -1);
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto group = static_cast<std::size_t>(groups.find(id));
    if (!touches_conv[group] || g.node(id).type.shape.rank() != 4) continue;
    if (decision_of[group] < 0) {
      decision_of[group] = static_cast<std::int32_t>(ctx.report.layouts.size());
      const LayoutReason reason = nhwc[group]                ? LayoutReason::channels_last
                                  : weighed_saved[group] > 0 ? LayoutReason::reorders_cost_more
                                                             : LayoutReason::not_eligible;
      ctx.report.layouts.push_back(
          {{}, nhwc[group] ? "NHWC" : "NCHW", reason, weighed_saved[group], weighed_cost[group]});
      if (nhwc[group]) result.count("nhwc_groups");
    }
    ctx.report.layouts[static_cast<std::size_t>(decision_of[group])].values.push_back(id);
  }
  if (result.stats.empty()) return result;

  // Rewrite. Each old value gets its NCHW and/or NHWC form in the new graph; the form its
  // producer does not make is made on first demand by a transpose (a reshape when free).
  Graph out;
  std::vector<ValueId> as_nchw(count, -1), as_nhwc(count, -1), packed_forward(count, -1),
      packed_backward(count, -1);
  const auto push_copy = [&](Node node) {
    out.nodes().push_back(std::move(node));
    return static_cast<ValueId>(out.size() - 1);
  };
  const auto reorder = [&](ValueId of, ValueId from, std::span<const int> perm,
                           const char* from_name, const char* to_name, const std::string& why) {
    const Shape& s = out.node(from).type.shape;
    if (is_free(s, perm)) return append(out, Op::Reshape, {from}, ShapeAttrs{permuted(s, perm)}).id;
    ctx.report.transforms.push_back({of, from_name, to_name, s.numel(), why});
    result.count("reorders");
    return append(out, Op::Transpose, {from}, TransposeAttrs{{perm.begin(), perm.end()}}).id;
  };
  const auto reader = [&](ValueId c) {
    return "read by " + std::string(op_name(g.node(c).op)) + " %" + std::to_string(c);
  };
  const auto nchw = [&](ValueId v, const std::string& why) {
    ValueId& id = as_nchw[static_cast<std::size_t>(v)];
    if (id < 0)
      id = reorder(v, as_nhwc[static_cast<std::size_t>(v)], nhwc_to_nchw, "NHWC", "NCHW", why);
    return id;
  };
  const auto nhwc_of = [&](ValueId v, const std::string& why) {
    ValueId& id = as_nhwc[static_cast<std::size_t>(v)];
    if (id < 0)
      id = reorder(v, as_nchw[static_cast<std::size_t>(v)], nchw_to_nhwc, "NCHW", "NHWC", why);
    return id;
  };
  // A broadcast operand of an NHWC elementwise op, brought to rank 4 and reordered.
  const auto broadcast_operand = [&](ValueId v, ValueId c) {
    ValueId id = nchw(v, reader(c));
    const Shape s = out.node(id).type.shape;
    if (s.rank() < 4) {
      std::vector<std::int64_t> dims(static_cast<std::size_t>(4 - s.rank()), 1);
      dims.insert(dims.end(), s.begin(), s.end());
      id = append(out, Op::Reshape, {id}, ShapeAttrs{Shape(dims.begin(), dims.end())}).id;
    }
    return reorder(v, id, nchw_to_nhwc, "NCHW", "NHWC", reader(c));
  };
  const auto packed_weight = [&](ValueId w, ValueId conv, bool forward) {
    ValueId& id = (forward ? packed_forward : packed_backward)[static_cast<std::size_t>(w)];
    if (id < 0) {
      result.count("weight_packs");
      id = reorder(w, nchw(w, reader(conv)), forward ? forward_weight_pack : backward_weight_pack,
                   "OIHW", forward ? "HWIO" : "HWOI",
                   "weight of " + std::string(op_name(g.node(conv).op)) + " %" +
                       std::to_string(conv) + ", packed once per step");
    }
    return id;
  };

  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    const auto at = static_cast<std::size_t>(id);
    const bool group_nhwc = nhwc[static_cast<std::size_t>(groups.find(id))];
    if (follower[at] && group_nhwc) {
      std::vector<ValueId> inputs;
      for (ValueId in : n.inputs)
        inputs.push_back(joins(g, n, in) ? nhwc_of(in, reader(id)) : broadcast_operand(in, id));
      Attrs attrs = n.attrs;
      if (auto* pool = std::get_if<Pool2dAttrs>(&attrs)) pool->channels_last = true;
      if (auto* target = std::get_if<ShapeAttrs>(&attrs)) // broadcast_to
        target->shape = permuted(target->shape, nchw_to_nhwc);
      as_nhwc[at] = append(out, n.op, std::move(inputs), std::move(attrs)).id;
      continue;
    }
    if (eligible[at]) {
      auto attrs = std::get<Conv2dAttrs>(n.attrs);
      attrs.channels_last = true;
      std::vector<ValueId> inputs{nhwc_of(n.inputs[0], reader(id))};
      if (n.op == Op::Conv2dGradWeight)
        inputs.push_back(nhwc_of(n.inputs[1], reader(id)));
      else
        inputs.push_back(packed_weight(n.inputs[1], id, n.op == Op::Conv2d));
      const ValueId made = append(out, n.op, std::move(inputs), attrs).id;
      (n.op == Op::Conv2dGradWeight ? as_nchw : as_nhwc)[at] = made;
      result.count("channels_last_convs");
      continue;
    }
    const ValueId in0 = n.inputs.empty() ? -1 : n.inputs[0];
    if (n.op == Op::SumTo && as_nchw[static_cast<std::size_t>(in0)] < 0 &&
        std::get<ShapeAttrs>(n.attrs).shape.rank() == 4) {
      // Summing an NHWC value: sum in NHWC, then view the result as the NCHW shape.
      const Shape to = permuted(std::get<ShapeAttrs>(n.attrs).shape, nchw_to_nhwc);
      const ValueId summed =
          append(out, Op::SumTo, {as_nhwc[static_cast<std::size_t>(in0)]}, ShapeAttrs{to}).id;
      as_nchw[at] = reorder(id, summed, nhwc_to_nchw, "NHWC", "NCHW", reader(id));
      continue;
    }
    Node copy = n;
    for (ValueId& in : copy.inputs) in = nchw(in, reader(id));
    as_nchw[at] = push_copy(std::move(copy));
  }
  std::vector<ValueId> outputs;
  for (ValueId o : g.outputs()) outputs.push_back(nchw(o, "graph output"));
  g.reset(std::move(out.nodes()), std::move(outputs));
  return result;
}

} // namespace kiln
