// fuse_reductions: folds the elementwise chain that only a sum reads into that sum, so the
// chain's result is summed as it is computed and never stored.
#pragma once

#include <array>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/fuse_epilogue.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

/// For every sum (OpDef::fusable_sum) whose input is an elementwise node, fused or single,
/// that nothing else reads, stores nothing and is not a graph output, replaces the pair by one
/// fused_sum_to over the producer's inputs, where the target runs it. A batchnorm's
/// statistics and gradient sums then read their operands once, without writing the centred
/// square or the products they sum. Runs after the epilogues are fused, so that a chain an
/// anchor computes in its epilogue stays there. Every sum over an elementwise producer gets a
/// decision in ctx.report.fusion.
inline PassResult fuse_reductions(Graph& g, PassContext& ctx) {
  const auto n = static_cast<std::size_t>(g.size());
  const auto users = consumers(g);
  const std::vector<bool> is_output = graph_outputs(g);
  std::vector<bool> keep(n, true);
  PassResult result;
  const auto decide = [&](ValueId producer, ValueId consumer, FusionReason reason) {
    ctx.decide("fuse_reductions", g, producer, consumer, reason);
  };
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& sum = g.node(id);
    if (!op_info(sum.op).fusable_sum) continue;
    const ValueId p = sum.inputs[0];
    const auto pu = static_cast<std::size_t>(p);
    const Node& producer = g.node(p);
    detail::ConsumerProgram chain;
    if (!detail::consumer_program(producer, chain)) continue;
    if (is_output[pu]) {
      decide(p, id, FusionReason::graph_output);
      continue;
    }
    if (users[pu].size() != 1 || !chain.stores.empty()) {
      decide(p, id, FusionReason::several_consumers);
      continue;
    }
    Node fused{Op::FusedSumTo, producer.inputs,
               FusedSumAttrs{FusedAttrs{chain.program, producer.type.shape, {}},
                             std::get<ShapeAttrs>(sum.attrs).shape},
               sum.type};
    std::array<TensorType, max_op_inputs> in{};
    for (std::size_t k = 0; k < fused.inputs.size(); ++k) in[k] = g.node(fused.inputs[k]).type;
    if (!ctx.target.runs(KernelQuery{Op::FusedSumTo, &fused.attrs,
                                     std::span<const TensorType>(in.data(), fused.inputs.size()),
                                     fused.type})) {
      decide(p, id, FusionReason::no_kernel);
      continue;
    }
    decide(p, id, FusionReason::fused);
    g.node(id) = std::move(fused);
    keep[pu] = false;
    result.count("sums_fused");
  }
  if (result.changed) compact(g, keep);
  return result;
}

} // namespace kiln
