// fold_reorders: a layout reorder beside an op that can read or write the other layout itself
// (an average pool) becomes part of that op, which reorders only its own side of the data,
// image by image while it is in cache, instead of a separate pass over memory.
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace fold_detail {

/// Whether `n` reorders a rank-4 activation between NCHW and NHWC, and into which.
struct Reorder {
  bool is = false;
  bool to_channels_last = false;
};

inline Reorder layout_reorder(const Node& n) {
  if (n.op != Op::Transpose || n.type.shape.rank() != 4) return {};
  const auto& perm = std::get<TransposeAttrs>(n.attrs).perm;
  if (std::ranges::equal(perm, nchw_to_nhwc)) return {true, true};
  if (std::ranges::equal(perm, nhwc_to_nchw)) return {true, false};
  return {};
}

/// Whether the target has a kernel for `op` with these attributes, inputs and output type.
inline bool target_runs(const PassContext& ctx, const Graph& g, Op op, const Attrs& attrs,
                        const std::vector<ValueId>& inputs, const TensorType& out) {
  std::vector<TensorType> in;
  for (ValueId v : inputs) in.push_back(g.node(v).type);
  return ctx.target.runs(KernelQuery{op, &attrs, in, out, ctx.precision});
}

} // namespace fold_detail

/// The reorder-folding pass. A reorder whose input only it reads, made by an op whose
/// port_layout_attrs can store that output in the reorder's layout, is dropped and the op
/// writes that layout; else a reorder that only one op reads, once, whose port_layout_attrs
/// can read the reorder's input layout there, is dropped and the op reads its input as it is.
/// Either only where the target has a kernel for the op so changed. Each fold is noted on the
/// layout pass's record of the reorder (CompileReport::transforms).
inline PassResult fold_reorders(Graph& g, PassContext& ctx) {
  using namespace fold_detail;
  PassResult result;
  const auto users = consumers(g);
  const auto is_output = graph_outputs(g);
  const auto n = static_cast<std::size_t>(g.size());
  std::vector<bool> keep(n, true);
  std::vector<ValueId> forward(n);
  std::iota(forward.begin(), forward.end(), ValueId{0});
  const auto note = [&](ValueId reorder, ValueId into) {
    for (LayoutTransform& t : ctx.report.transforms)
      if (t.reorder == reorder)
        t.folded_into = std::string(op_name(g.node(into).op)) + " %" + std::to_string(into);
    keep[static_cast<std::size_t>(reorder)] = false;
    result.count("reorders_folded");
  };
  for (ValueId id = 0; id < g.size(); ++id) {
    const Reorder r = layout_reorder(g.node(id));
    if (!r.is) continue;
    const ValueId from = g.node(id).inputs[0];
    const auto& from_users = users[static_cast<std::size_t>(from)];
    if (from_users.size() == 1 && !is_output[static_cast<std::size_t>(from)]) {
      Node& producer = g.node(from);
      const Attrs attrs =
          op_info(producer.op).port_layout_attrs(producer.attrs, -1, r.to_channels_last);
      if (!(attrs == producer.attrs) &&
          target_runs(ctx, g, producer.op, attrs, producer.inputs, g.node(id).type)) {
        producer.attrs = attrs;
        producer.type = g.node(id).type;
        forward[static_cast<std::size_t>(id)] = from;
        note(id, from);
        continue;
      }
    }
    const auto& readers = users[static_cast<std::size_t>(id)];
    if (readers.size() != 1 || is_output[static_cast<std::size_t>(id)]) continue;
    Node& reader = g.node(readers[0]);
    const auto port =
        static_cast<int>(std::ranges::find(reader.inputs, id) - reader.inputs.begin());
    // The reader sees the reorder's input, in the layout the reorder took it from.
    const Attrs attrs =
        op_info(reader.op).port_layout_attrs(reader.attrs, port, !r.to_channels_last);
    std::vector<ValueId> inputs = reader.inputs;
    inputs[static_cast<std::size_t>(port)] = from;
    if (!(attrs == reader.attrs) && target_runs(ctx, g, reader.op, attrs, inputs, reader.type)) {
      reader.attrs = attrs;
      reader.inputs = std::move(inputs);
      note(id, readers[0]);
    }
  }
  if (result.changed) compact(g, keep, std::move(forward));
  return result;
}

} // namespace kiln
