// choose_layouts: picks NCHW or NHWC for each group of activations that convolutions read or
// write, weighing the column matrices channels-last kernels avoid against the reorders a
// group needs at its edges, then rewrites the graph to match: channels-last convolutions
// with their weights pre-packed once per step, pools and elementwise ops in the group's
// layout, and a transpose wherever a value crosses from one layout to the other. What an op
// can do in either layout is its OpDef's layout rule; which convolutions the device runs
// channels-last is the target's answer.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace layout_detail {

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

/// The activations a convolution's channels-last form keeps NHWC: inputs and output as its
/// OpDef's ChannelsLastForm names them.
inline std::vector<ValueId> nhwc_ports(const Node& n, ValueId id) {
  const ChannelsLastForm& form = op_info(n.op).channels_last_form;
  std::vector<ValueId> ports;
  for (std::size_t k = 0; k < form.nhwc_inputs.size(); ++k)
    if (form.nhwc_inputs[k]) ports.push_back(n.inputs[k]);
  if (form.nhwc_output) ports.push_back(id);
  return ports;
}

/// Whether the target has a kernel for the channels-last form of convolution `n`: its
/// activations NHWC, its weight pre-packed.
inline bool has_channels_last_kernel(const Target& target, const Graph& g, const Node& n) {
  const OpInfo& info = op_info(n.op);
  const Attrs attrs = info.channels_last_attrs(n.attrs);
  const Epilogue* epilogue = epilogue_of(n.attrs);
  if (target.channels_last_multiple == 0 || attrs == n.attrs || (epilogue && !epilogue->empty()))
    return false;
  const ChannelsLastForm& form = info.channels_last_form;
  const auto nhwc = [](TensorType t) {
    t.shape = permuted(t.shape, nchw_to_nhwc);
    return t;
  };
  std::array<TensorType, 2> in{g.node(n.inputs[0]).type, g.node(n.inputs[1]).type};
  for (std::size_t k = 0; k < in.size(); ++k) {
    if (form.nhwc_inputs[k]) in[k] = nhwc(in[k]);
    if (form.packed_weight == static_cast<int>(k))
      in[k].shape = permuted(in[k].shape, form.weight_pack);
  }
  const TensorType out = form.nhwc_output ? nhwc(n.type) : n.type;
  return target.runs(KernelQuery{n.op, &attrs, in, out});
}

/// What convolution `n`'s channels-last kernel saves: its NCHW kernel's column matrix.
inline std::int64_t column_matrix_bytes(const Graph& g, const Node& n) {
  std::array<Shape, max_op_inputs> shapes{};
  for (std::size_t i = 0; i < n.inputs.size(); ++i) shapes[i] = g.node(n.inputs[i]).type.shape;
  return op_info(n.op).column_matrix_bytes(
      CostContext{std::span<const Shape>(shapes.data(), n.inputs.size()), n.type.shape, n.attrs});
}

/// Ops whose rank-4 output shares its layout with their rank-4 inputs (LayoutRule elementwise,
/// or a pool not yet channels-last): they run unchanged, or with a flag, in either layout.
inline bool follows_layout(const Node& n) {
  if (n.type.shape.rank() != 4 || n.type.dtype != DType::f32) return false;
  const OpInfo& info = op_info(n.op);
  if (info.layout == LayoutRule::pool) return !(info.channels_last_attrs(n.attrs) == n.attrs);
  return info.layout == LayoutRule::elementwise;
}

/// Whether follower n joins input `in`'s layout group (rather than adapting it as a
/// broadcast operand): a pool's rank-4 input always, an elementwise op's of its own shape.
inline bool joins(const Graph& g, const Node& n, ValueId in) {
  const Shape& s = g.node(in).type.shape;
  if (s.rank() != 4) return false;
  return op_info(n.op).layout == LayoutRule::pool || s == n.type.shape;
}

/// A sum to a rank-4 shape, which reads and writes NHWC as well as NCHW.
inline bool sums_to_rank4(const Node& n) {
  return op_info(n.op).layout == LayoutRule::reduction &&
         std::get<ShapeAttrs>(n.attrs).shape.rank() == 4;
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

/// The groups of activations that must share one layout, and what touches them: followers
/// (joined to their inputs), convolutions with a channels-last kernel on the target
/// (eligible), groups a convolution reads or writes.
struct Analysis {
  Groups groups;
  std::vector<bool> follower, eligible, touches_conv, is_output;
  std::vector<std::vector<ValueId>> users;

  [[nodiscard]] bool at(const std::vector<bool>& v, ValueId id) const {
    return v[static_cast<std::size_t>(id)];
  }
  /// A value is made NHWC when its producer runs in the group's layout: a follower, or a
  /// channels-last convolution writing it. Everything else makes NCHW.
  [[nodiscard]] bool made_nhwc(const Graph& g, ValueId v) const {
    return at(follower, v) ||
           (at(eligible, v) && op_info(g.node(v).op).channels_last_form.nhwc_output);
  }
  /// Whether consumer `c` reads `v` in v's group layout.
  [[nodiscard]] bool reads_in_layout(const Graph& g, ValueId v, ValueId c) const {
    const Node& n = g.node(c);
    if (at(follower, c)) return joins(g, n, v);
    if (at(eligible, c)) {
      const std::vector<ValueId> ports = nhwc_ports(n, c);
      return std::find(ports.begin(), ports.end(), v) != ports.end();
    }
    return sums_to_rank4(n);
  }
};

inline Analysis analyse(const Graph& g, const Target& target) {
  const auto count = static_cast<std::size_t>(g.size());
  Analysis a{Groups(count),
             std::vector<bool>(count, false),
             std::vector<bool>(count, false),
             std::vector<bool>(count, false),
             std::vector<bool>(count, false),
             consumers(g)};
  for (ValueId o : g.outputs()) a.is_output[static_cast<std::size_t>(o)] = true;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (follows_layout(n)) {
      a.follower[static_cast<std::size_t>(id)] = true;
      for (ValueId in : n.inputs)
        if (joins(g, n, in)) a.groups.join(in, id);
    }
    if (op_info(n.op).layout == LayoutRule::convolution)
      a.eligible[static_cast<std::size_t>(id)] = has_channels_last_kernel(target, g, n);
  }
  for (ValueId id = 0; id < g.size(); ++id)
    if (op_info(g.node(id).op).layout == LayoutRule::convolution)
      for (ValueId port : nhwc_ports(g.node(id), id))
        a.touches_conv[static_cast<std::size_t>(a.groups.find(port))] = true;
  return a;
}

/// The layout of each group, with the bytes its last weighing in which it had something to
/// save quoted for it (what the report shows for a group that stays NCHW), and the layout a
/// forced decision asked for (-1: none, 0: NCHW, 1: NHWC).
struct Weighing {
  std::vector<bool> nhwc;
  std::vector<std::int64_t> saved, cost;
  std::vector<std::int8_t> wanted;
};

/// Each group's first value that a convolution's layout concerns (rank 4, in a group a
/// convolution touches), by group; -1 for the others. Decisions and the report name groups so.
inline std::vector<ValueId> first_values(const Graph& g, Analysis& a) {
  std::vector<ValueId> first(static_cast<std::size_t>(g.size()), -1);
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto group = static_cast<std::size_t>(a.groups.find(id));
    if (a.touches_conv[group] && g.node(id).type.shape.rank() == 4 && first[group] < 0)
      first[group] = id;
  }
  return first;
}

/// Bytes each group would save (column matrices) and pay (reorders at its edges) as NHWC.
inline std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>
bytes_for_nhwc(const Graph& g, Analysis& a) {
  const auto count = static_cast<std::size_t>(g.size());
  std::vector<std::int64_t> saved(count, 0), cost(count, 0);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (a.at(a.eligible, id)) {
      const std::int64_t bytes = column_matrix_bytes(g, n);
      for (ValueId port : nhwc_ports(n, id))
        saved[static_cast<std::size_t>(a.groups.find(port))] += bytes / 2;
    }
    const auto group = static_cast<std::size_t>(a.groups.find(id));
    if (!a.touches_conv[group] || n.type.shape.rank() != 4) continue;
    const std::int64_t reorder = reorder_bytes(n.type.shape, nchw_to_nhwc);
    bool read_as_nchw = a.at(a.is_output, id);
    for (ValueId c : a.users[static_cast<std::size_t>(id)])
      read_as_nchw = read_as_nchw || !a.reads_in_layout(g, id, c);
    if (!a.made_nhwc(g, id)) cost[group] += reorder;
    if (read_as_nchw) cost[group] += reorder;
  }
  return {std::move(saved), std::move(cost)};
}

/// Makes a group NHWC where that saves more than it costs, or as `decisions` force it where it
/// has something to save; a convolution whose activations did not all go NHWC stays NCHW, and
/// then the groups are weighed again.
inline Weighing weigh(const Graph& g, Analysis& a, const Decisions& decisions) {
  const auto count = static_cast<std::size_t>(g.size());
  Weighing w{std::vector<bool>(count, false), std::vector<std::int64_t>(count, 0),
             std::vector<std::int64_t>(count, 0), std::vector<std::int8_t>(count, -1)};
  const std::vector<ValueId> first = first_values(g, a);
  for (bool settled = false; !settled;) {
    const auto [saved, cost] = bytes_for_nhwc(g, a);
    for (std::size_t v = 0; v < count; ++v) {
      w.nhwc[v] = saved[v] > cost[v];
      const std::string* choice =
          first[v] >= 0 && saved[v] > 0 ? decisions.find(layout_decision_key(first[v])) : nullptr;
      if (choice) {
        w.wanted[v] = *choice == "NHWC" ? 1 : 0;
        w.nhwc[v] = w.wanted[v] == 1;
      }
      if (saved[v] > 0) {
        w.saved[v] = saved[v];
        w.cost[v] = cost[v];
      }
    }
    settled = true;
    for (ValueId id = 0; id < g.size(); ++id) {
      if (!a.at(a.eligible, id)) continue;
      for (ValueId port : nhwc_ports(g.node(id), id)) {
        if (!w.nhwc[static_cast<std::size_t>(a.groups.find(port))]) {
          a.eligible[static_cast<std::size_t>(id)] = false;
          settled = false;
        }
      }
    }
  }
  return w;
}

/// Records the decision for every group a convolution touches.
inline void record_decisions(const Graph& g, Analysis& a, const Weighing& w, PassContext& ctx,
                             PassResult& result) {
  std::vector<std::int32_t> decision_of(static_cast<std::size_t>(g.size()), -1);
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto group = static_cast<std::size_t>(a.groups.find(id));
    if (!a.touches_conv[group] || g.node(id).type.shape.rank() != 4) continue;
    if (decision_of[group] < 0) {
      decision_of[group] = static_cast<std::int32_t>(ctx.report.layouts.size());
      const bool as_wanted = w.wanted[group] == (w.nhwc[group] ? 1 : 0);
      const LayoutReason reason = as_wanted            ? LayoutReason::measured
                                  : w.nhwc[group]      ? LayoutReason::channels_last
                                  : w.saved[group] > 0 ? LayoutReason::reorders_cost_more
                                                       : LayoutReason::not_eligible;
      ctx.report.layouts.push_back(
          {{}, w.nhwc[group] ? "NHWC" : "NCHW", reason, w.saved[group], w.cost[group]});
      if (w.nhwc[group]) result.count("nhwc_groups");
    }
    ctx.report.layouts[static_cast<std::size_t>(decision_of[group])].values.push_back(id);
  }
}

/// Builds the rewritten graph. Each old value gets its NCHW and/or NHWC form in the new
/// graph; the form its producer does not make is made on first demand by a transpose (a
/// reshape when free), and every such reorder is recorded.
class Rewriter {
public:
  Rewriter(const Graph& g, Analysis& a, const Weighing& w, PassContext& ctx, PassResult& result)
      : g_(g), a_(a), w_(w), ctx_(ctx), result_(result),
        as_nchw_(static_cast<std::size_t>(g.size()), -1),
        as_nhwc_(static_cast<std::size_t>(g.size()), -1) {}

  void rewrite(ValueId id) {
    const Node& n = g_.node(id);
    const auto at = static_cast<std::size_t>(id);
    if (a_.at(a_.follower, id) && w_.nhwc[static_cast<std::size_t>(a_.groups.find(id))]) {
      std::vector<ValueId> inputs;
      for (ValueId in : n.inputs)
        inputs.push_back(joins(g_, n, in) ? nhwc(in, reader(id)) : broadcast_operand(in, id));
      as_nhwc_[at] =
          append(out_, n.op, std::move(inputs), op_info(n.op).channels_last_attrs(n.attrs)).id;
    } else if (a_.at(a_.eligible, id)) {
      rewrite_convolution(id);
    } else if (sums_to_rank4(n) && as_nchw_[static_cast<std::size_t>(n.inputs[0])] < 0) {
      // Summing an NHWC value: sum in NHWC, then view the result as the NCHW shape.
      const ValueId summed = append(out_, n.op, {as_nhwc_[static_cast<std::size_t>(n.inputs[0])]},
                                    op_info(n.op).channels_last_attrs(n.attrs))
                                 .id;
      as_nchw_[at] = reorder(id, summed, nhwc_to_nchw, "NHWC", "NCHW", reader(id));
    } else {
      Node copy = n;
      for (ValueId& in : copy.inputs) in = nchw(in, reader(id));
      as_nchw_[at] = out_.push(std::move(copy)).id;
    }
  }

  /// Replaces g's nodes by the rewritten ones; graph outputs are read as NCHW.
  void finish(Graph& g) {
    std::vector<ValueId> outputs;
    for (ValueId o : g_.outputs()) outputs.push_back(nchw(o, "graph output"));
    g.reset(std::move(out_.nodes()), std::move(outputs));
  }

private:
  void rewrite_convolution(ValueId id) {
    const Node& n = g_.node(id);
    const ChannelsLastForm& form = op_info(n.op).channels_last_form;
    std::vector<ValueId> inputs;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (form.nhwc_inputs[k])
        inputs.push_back(nhwc(n.inputs[k], reader(id)));
      else if (form.packed_weight == static_cast<int>(k))
        inputs.push_back(packed_weight(n.inputs[k], id));
      else
        inputs.push_back(nchw(n.inputs[k], reader(id)));
    }
    const ValueId made =
        append(out_, n.op, std::move(inputs), op_info(n.op).channels_last_attrs(n.attrs)).id;
    (form.nhwc_output ? as_nhwc_ : as_nchw_)[static_cast<std::size_t>(id)] = made;
    result_.count("channels_last_convs");
  }

  ValueId reorder(ValueId of, ValueId from, std::span<const int> perm, std::string_view from_name,
                  std::string_view to_name, const std::string& why) {
    const Shape s = out_.node(from).type.shape;
    if (is_free(s, perm))
      return append(out_, Op::Reshape, {from}, ShapeAttrs{permuted(s, perm)}).id;
    result_.count("reorders");
    const ValueId made =
        append(out_, Op::Transpose, {from}, TransposeAttrs{{perm.begin(), perm.end()}}).id;
    ctx_.report.transforms.push_back(
        {of, std::string(from_name), std::string(to_name), s.numel(), why, made, {}});
    return made;
  }
  [[nodiscard]] std::string reader(ValueId c) const {
    return "read by " + std::string(op_name(g_.node(c).op)) + " %" + std::to_string(c);
  }
  ValueId nchw(ValueId v, const std::string& why) {
    ValueId& id = as_nchw_[static_cast<std::size_t>(v)];
    if (id < 0)
      id = reorder(v, as_nhwc_[static_cast<std::size_t>(v)], nhwc_to_nchw, "NHWC", "NCHW", why);
    return id;
  }
  ValueId nhwc(ValueId v, const std::string& why) {
    ValueId& id = as_nhwc_[static_cast<std::size_t>(v)];
    if (id < 0)
      id = reorder(v, as_nchw_[static_cast<std::size_t>(v)], nchw_to_nhwc, "NCHW", "NHWC", why);
    return id;
  }
  /// A broadcast operand of an NHWC elementwise op, brought to rank 4 and reordered.
  ValueId broadcast_operand(ValueId v, ValueId c) {
    ValueId id = nchw(v, reader(c));
    const Shape s = out_.node(id).type.shape;
    if (s.rank() < 4) {
      std::vector<std::int64_t> dims(static_cast<std::size_t>(4 - s.rank()), 1);
      dims.insert(dims.end(), s.begin(), s.end());
      id = append(out_, Op::Reshape, {id}, ShapeAttrs{Shape(dims.begin(), dims.end())}).id;
    }
    return reorder(v, id, nchw_to_nhwc, "NCHW", "NHWC", reader(c));
  }
  /// Weight `w` packed for convolution `conv`'s channels-last form, once per step and packing.
  ValueId packed_weight(ValueId w, ValueId conv) {
    const ChannelsLastForm& form = op_info(g_.node(conv).op).channels_last_form;
    const auto key = std::make_pair(w, form.packed_layout);
    if (const auto it = packed_.find(key); it != packed_.end()) return it->second;
    result_.count("weight_packs");
    const ValueId id =
        reorder(w, nchw(w, reader(conv)), form.weight_pack, "OIHW", form.packed_layout,
                "weight of " + std::string(op_name(g_.node(conv).op)) + " %" +
                    std::to_string(conv) + ", packed once per step");
    packed_.emplace(key, id);
    return id;
  }

  const Graph& g_;
  Analysis& a_;
  const Weighing& w_;
  PassContext& ctx_;
  PassResult& result_;
  Graph out_;
  std::vector<ValueId> as_nchw_, as_nhwc_;
  std::map<std::pair<ValueId, std::string_view>, ValueId> packed_;
};

} // namespace layout_detail

/// The layout pass. Activations joined by elementwise ops and max pools form groups that
/// must share one layout. A group that convolutions read or write becomes NHWC when the
/// column matrices its convolutions' channels-last kernels avoid outweigh the reorders it
/// needs at its edges (values made or read by ops that only know NCHW, graph outputs); a
/// convolution runs channels-last only when all its activations do and the target has a
/// kernel for it. A group the context's decisions name (layout_decision_key of its first value)
/// takes their layout instead, where it has something to save. Every decision and every
/// inserted reorder is recorded in the compile report.
inline PassResult choose_layouts(Graph& g, PassContext& ctx) {
  using namespace layout_detail;
  Analysis analysis = analyse(g, ctx.target);
  const Weighing weighing = weigh(g, analysis, ctx.decisions);
  PassResult result;
  record_decisions(g, analysis, weighing, ctx, result);
  if (result.stats.empty()) return result;
  Rewriter rewriter(g, analysis, weighing, ctx, result);
  for (ValueId id = 0; id < g.size(); ++id) rewriter.rewrite(id);
  rewriter.finish(g);
  return result;
}

} // namespace kiln
