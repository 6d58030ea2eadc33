// fuse_epilogue: folds the elementwise consumer of a conv2d / conv2d gradient / matmul into
// that anchor as an epilogue, run over the anchor's output while it is still in cache.
#pragma once

#include <algorithm>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/rewrite.hpp"

namespace kiln {

namespace detail {

/// An anchor that can still take an epilogue.
inline bool is_open_anchor(const Node& n) {
  const Epilogue* e = epilogue_of(n.attrs);
  return e != nullptr && e->empty() && op_info(n.op).kind == FusionKind::anchor;
}

/// An elementwise consumer as a program over its inputs: a fused node's own, or one step.
struct ConsumerProgram {
  std::vector<FusedInstruction> program;
  std::vector<FusedStore> stores;
};

inline bool consumer_program(const Node& n, ConsumerProgram& out) {
  if (const auto* fused = std::get_if<FusedAttrs>(&n.attrs)) {
    out = {fused->program, fused->stores};
    return true;
  }
  if (!op_info(n.op).is_elementwise || n.inputs.empty() || n.inputs.size() > 2) return false;
  FusedInstruction f;
  f.op = n.op;
  f.a = -1;
  f.b = n.inputs.size() > 1 ? std::int8_t{-2} : std::int8_t{-1};
  if (const auto* s = std::get_if<ScalarAttrs>(&n.attrs)) f.scalar = s->value;
  out = {{f}, {}};
  return true;
}

} // namespace detail

/// For every elementwise node (fused or single) that reads a conv2d, conv2d_grad_input,
/// conv2d_grad_weight or matmul result of its own shape which nothing else reads, moves the
/// anchor into the consumer's place and makes the consumer's program its epilogue: bias +
/// relu (+ residual add) after a forward conv or linear layer, the relu gradient's mask after
/// a grad-input GEMM, the optimizer update after a weight gradient. When the consumer's value
/// is only assigned to a param that nothing later reads, the epilogue stores it there and the
/// assign goes, unless the anchor itself reads that param. A fusion the context's decisions
/// keep "apart" (epilogue_decision_key) is left undone. Every anchor that feeds an elementwise
/// node gets a decision in ctx.report.fusion.
inline PassResult fuse_epilogue(Graph& g, PassContext& ctx) {
  const auto n = static_cast<std::size_t>(g.size());
  const auto users = consumers(g);
  const std::vector<bool> is_output = graph_outputs(g);
  std::vector<bool> keep(n, true);
  PassResult result;

  const auto decide = [&](ValueId producer, ValueId consumer, FusionReason reason) {
    ctx.decide("fuse_epilogue", g, producer, consumer, reason);
  };
  for (ValueId id = 0; id < g.size(); ++id) {
    detail::ConsumerProgram consumer;
    if (!detail::consumer_program(g.node(id), consumer)) continue;
    const Node c = g.node(id);
    bool taken = false;
    for (std::size_t k = 0; k < c.inputs.size(); ++k) {
      const ValueId p = c.inputs[k];
      const auto pu = static_cast<std::size_t>(p);
      const Node& anchor = g.node(p);
      if (!detail::is_open_anchor(anchor) || !keep[pu]) continue;
      if (taken) {
        decide(p, id, FusionReason::consumer_taken);
        continue;
      }
      if (is_output[pu]) {
        decide(p, id, FusionReason::graph_output);
        continue;
      }
      if (std::any_of(users[pu].begin(), users[pu].end(), [&](ValueId u) { return u != id; })) {
        decide(p, id, FusionReason::several_consumers);
        continue;
      }
      if (!(anchor.type.shape == c.type.shape)) {
        decide(p, id, FusionReason::would_duplicate_work);
        continue;
      }
      if (updated_between(g, anchor, p, id)) {
        decide(p, id, FusionReason::state_hazard);
        continue;
      }
      // Epilogue inputs: the anchor's result, then the consumer's other inputs in order.
      std::vector<ValueId> extra;
      for (ValueId in : c.inputs)
        if (in != p && std::find(extra.begin(), extra.end(), in) == extra.end())
          extra.push_back(in);
      // An assign of the consumer's value becomes a store, as fuse_elementwise does.
      ValueId absorbed = -1;
      const auto& readers = users[static_cast<std::size_t>(id)];
      if (readers.size() == 1 && !is_output[static_cast<std::size_t>(id)]) {
        const Node& a = g.node(readers[0]);
        if (a.inputs.size() == 2 && a.inputs[1] == id &&
            assign_can_become_store(g, users, readers[0], id)) {
          absorbed = readers[0];
          if (std::find(extra.begin(), extra.end(), a.inputs[0]) == extra.end())
            extra.push_back(a.inputs[0]);
        }
      }
      if (static_cast<int>(extra.size()) + anchor_arity > max_op_inputs) {
        decide(p, id, FusionReason::too_many_inputs);
        continue;
      }
      const auto operand = [&](ValueId v) -> std::int8_t {
        if (v == p) return -1;
        return static_cast<std::int8_t>(-2 -
                                        (std::find(extra.begin(), extra.end(), v) - extra.begin()));
      };
      Epilogue epilogue;
      for (FusedInstruction f : consumer.program) {
        if (f.a < 0) f.a = operand(c.inputs[static_cast<std::size_t>(-(f.a + 1))]);
        if (f.b < 0) f.b = operand(c.inputs[static_cast<std::size_t>(-(f.b + 1))]);
        epilogue.program.push_back(f);
      }
      const auto store_input = [&](ValueId param) {
        return static_cast<std::int8_t>(-(operand(param) + 1));
      };
      for (const FusedStore& s : consumer.stores)
        epilogue.stores.push_back(
            {s.step, store_input(c.inputs[static_cast<std::size_t>(s.input)])});
      if (absorbed >= 0) {
        const auto last = static_cast<std::int8_t>(epilogue.program.size() - 1);
        epilogue.stores.push_back({last, store_input(g.node(absorbed).inputs[0])});
      }
      // The GEMM reads its operands whole while the epilogue writes tile by tile: a param the
      // anchor reads must not be one it stores.
      const bool stores_own_operand =
          std::any_of(epilogue.stores.begin(), epilogue.stores.end(), [&](const FusedStore& s) {
            const ValueId target = extra[static_cast<std::size_t>(s.input - 1)];
            return std::find(anchor.inputs.begin(), anchor.inputs.end(), target) !=
                   anchor.inputs.end();
          });
      if (stores_own_operand) {
        decide(p, id, FusionReason::state_hazard);
        continue;
      }
      if (const std::string* choice = ctx.decisions.find(epilogue_decision_key(p, id));
          choice && *choice == "apart") {
        decide(p, id, FusionReason::measured_apart);
        continue;
      }
      if (absorbed >= 0) {
        keep[static_cast<std::size_t>(absorbed)] = false;
        result.count("assigns_absorbed");
      }
      Node merged = anchor;
      merged.inputs.resize(anchor_arity);
      merged.inputs.insert(merged.inputs.end(), extra.begin(), extra.end());
      *epilogue_of(merged.attrs) = std::move(epilogue);
      merged.type = c.type;
      decide(p, id, FusionReason::fused);
      g.node(id) = std::move(merged);
      keep[pu] = false;
      taken = true;
      result.count("epilogues");
      result.count(std::string(op_name(anchor.op)) + "_epilogues");
    }
  }
  if (result.changed) compact(g, keep);
  return result;
}

} // namespace kiln
