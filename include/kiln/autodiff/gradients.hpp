// Reverse-mode differentiation over the graph: appends gradient nodes to the same graph.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

/// For every v in `wrt`, whether `out` is computed from it (through any path of inputs).
inline std::vector<bool> reaches(Value out, std::span<const Value> wrt) {
  Graph& g = *out.graph;
  g.check_owned(out, "reaches");
  std::vector<bool> needed(static_cast<std::size_t>(out.id + 1), false);
  needed.back() = true;
  for (ValueId id = out.id; id >= 0; --id)
    if (needed[static_cast<std::size_t>(id)])
      for (ValueId in : g.node(id).inputs) needed[static_cast<std::size_t>(in)] = true;
  std::vector<bool> result;
  for (const Value& v : wrt) {
    g.check_owned(v, "reaches");
    result.push_back(v.id <= out.id && needed[static_cast<std::size_t>(v.id)]);
  }
  return result;
}

/// Appends to `loss`'s graph the nodes computing d loss / d v for every v in `wrt`, and
/// returns those gradient values in the same order. `loss` must hold one element. Only the
/// nodes on a path from `wrt` to `loss` are differentiated, so e.g. the input gradient of a
/// network's first layer is never built.
inline std::vector<Value> gradients(Value loss, std::span<const Value> wrt) {
  if (!loss.valid()) fail(errc::argument, "gradients: empty loss value");
  Graph& g = *loss.graph;
  if (loss.shape().numel() != 1)
    fail(errc::shape, "gradients: loss %" + std::to_string(loss.id) + " has shape " +
                          loss.shape().str() + ", expected one element");
  const auto count = static_cast<std::size_t>(loss.id + 1);

  // Forward: which values depend on a wrt value (only those need gradients).
  std::vector<bool> depends(count, false);
  for (const Value& v : wrt) {
    g.check_owned(v, "gradients");
    if (v.id <= loss.id) depends[static_cast<std::size_t>(v.id)] = true;
  }
  for (std::size_t id = 0; id < count; ++id)
    for (ValueId in : g.node(static_cast<ValueId>(id)).inputs)
      if (depends[static_cast<std::size_t>(in)]) depends[id] = true;

  // Backward: accumulate each value's gradient, then push it through its op's rule.
  std::vector<Value> grad(count);
  grad[count - 1] = fill(g, loss.shape(), 1.0f);
  for (ValueId id = loss.id; id >= 0; --id) {
    const Value dy = grad[static_cast<std::size_t>(id)];
    if (!dy.valid()) continue;
    const Node node = g.node(id);
    if (node.inputs.empty()) continue;
    GradContext ctx{g, id, node, dy, {}, {}};
    bool any = false;
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      ctx.needs[i] = depends[static_cast<std::size_t>(node.inputs[i])];
      any = any || ctx.needs[i];
    }
    if (!any) continue;
    const OpInfo& info = op_info(node.op);
    if (!info.grad)
      fail(errc::graph,
           "node %" + std::to_string(id) + " " + std::string(info.name) + " has no gradient");
    info.grad(ctx);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      if (!ctx.needs[i] || !ctx.dx[i].valid()) continue;
      Value& acc = grad[static_cast<std::size_t>(node.inputs[i])];
      acc = acc.valid() ? add(acc, ctx.dx[i]) : ctx.dx[i];
    }
  }

  std::vector<Value> result;
  for (const Value& v : wrt) {
    Value gv = v.id <= loss.id ? grad[static_cast<std::size_t>(v.id)] : Value{};
    // A value the loss does not depend on has gradient zero.
    result.push_back(gv.valid() ? gv : fill(g, v.shape(), 0.0f));
  }
  return result;
}

} // namespace kiln
