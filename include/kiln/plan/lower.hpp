// Lowering: Graph -> Plan. Picks a kernel per node, resolves views and state aliases, and
// places every activation and gradient in one arena by liveness.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/ops/verifier.hpp"
#include "kiln/plan/backend.hpp"
#include "kiln/plan/memory_planner.hpp"
#include "kiln/plan/plan.hpp"

namespace kiln {

struct LowerOptions {
  /// Worker threads the plan will run with; 0 = every core.
  int threads = 0;
  /// Share arena memory between buffers whose lifetimes do not overlap.
  bool share_memory = true;
  /// Let an elementwise update write straight into the parameter it is assigned to.
  bool inplace_updates = true;
};

namespace detail {

/// The value whose memory `v` uses, following the alias links in `root` (views, assigns,
/// in-place steps).
inline ValueId storage_root(const std::vector<ValueId>& root, ValueId v) {
  while (root[static_cast<std::size_t>(v)] != v) v = root[static_cast<std::size_t>(v)];
  return v;
}

/// Whether assign node `a` can be dropped by computing its value directly in the param's
/// storage: the value comes from an elementwise kernel (which reads element i of its
/// same-shaped inputs before writing element i), and nothing between that kernel and the
/// assign reads the param's old value.
inline bool can_update_in_place(const Graph& g, ValueId a, const std::vector<ValueId>& root) {
  const Node& assign = g.node(a);
  const ValueId target = storage_root(root, assign.inputs[0]);
  const ValueId source = assign.inputs[1];
  const Node& producer = g.node(source);
  if (storage_root(root, source) != source) return false;
  if (!op_info(producer.op).is_elementwise && producer.op != Op::FusedElementwise) return false;
  for (ValueId in : producer.inputs)
    if (storage_root(root, in) == target && !(g.node(in).type.shape == producer.type.shape))
      return false;
  for (ValueId k = source + 1; k < a; ++k)
    for (ValueId in : g.node(k).inputs)
      if (storage_root(root, in) == target) return false;
  return true;
}

/// Chooses, for each elementwise step (and each step whose op names an overwritable input),
/// an input whose memory it can take over: same type, arena-owned (not a graph input, a
/// param or an output), and dead after this step, views of it included. Rewrites `root` (union-find
/// parents) and returns how many steps reuse memory.
inline std::int32_t reuse_dying_inputs(const Graph& g, const std::vector<int>& step_of,
                                       std::vector<ValueId>& root) {
  const auto n = static_cast<std::size_t>(g.size());
  const auto find = [&root](ValueId v) { return storage_root(root, v); };
  // The last step reading each value, directly or through its views.
  std::vector<int> last_use(n, -1);
  for (ValueId id = 0; id < g.size(); ++id)
    for (ValueId in : g.node(id).inputs)
      last_use[static_cast<std::size_t>(in)] =
          std::max(last_use[static_cast<std::size_t>(in)], step_of[static_cast<std::size_t>(id)]);
  for (ValueId id = g.size() - 1; id >= 0; --id)
    if (op_info(g.node(id).op).is_view) {
      const auto src = static_cast<std::size_t>(g.node(id).inputs[0]);
      last_use[src] = std::max(last_use[src], last_use[static_cast<std::size_t>(id)]);
    }
  std::vector<int> class_last(n, -1);
  std::vector<bool> pinned(n, false); // inputs, params, outputs: memory that must survive
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto r = static_cast<std::size_t>(find(id));
    class_last[r] = std::max(class_last[r], last_use[static_cast<std::size_t>(id)]);
    const Op op = g.node(id).op;
    if (op == Op::Input || op == Op::Param) pinned[r] = true;
  }
  for (ValueId o : g.outputs()) pinned[static_cast<std::size_t>(find(o))] = true;

  std::int32_t reused = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const int step = step_of[static_cast<std::size_t>(id)];
    const bool elementwise = op_info(node.op).is_elementwise || node.op == Op::FusedElementwise;
    const int overwritable = op_info(node.op).overwritable_input(node.attrs);
    if (step < 0 || find(id) != id || (!elementwise && overwritable < 0)) continue;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (!elementwise && static_cast<int>(k) != overwritable) continue;
      const ValueId in = node.inputs[k];
      const ValueId r = find(in);
      const Node& owner = g.node(r);
      // The memory must be exactly the output's size; an elementwise op also needs its
      // input's shape, other ops answer for how they read the one input they name.
      const auto same_size = [&](const TensorType& t) {
        return t.dtype == node.type.dtype && t.shape.numel() == node.type.shape.numel();
      };
      if (pinned[static_cast<std::size_t>(r)] || class_last[static_cast<std::size_t>(r)] != step ||
          !same_size(owner.type) || !same_size(g.node(in).type) ||
          (elementwise && !(g.node(in).type == node.type)))
        continue;
      // Every operand in that memory must be read at the output's own indices; other ops
      // promise that only for the one input they name.
      bool aligned = true;
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const ValueId other = node.inputs[j];
        if (find(other) != r) continue;
        if (elementwise ? !(g.node(other).type.shape == node.type.shape) : j != k) aligned = false;
      }
      if (!aligned) continue;
      root[static_cast<std::size_t>(id)] = r;
      class_last[static_cast<std::size_t>(r)] =
          std::max(class_last[static_cast<std::size_t>(r)], last_use[static_cast<std::size_t>(id)]);
      ++reused;
      break;
    }
  }
  return reused;
}

} // namespace detail

/// The yardstick of memory planning: every value of `g` in a buffer of its own (params,
/// assigns and views own no memory).
inline std::size_t unshared_bytes(const Graph& g) {
  std::size_t total = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    if (node.op == Op::Param || node.op == Op::Assign || op_info(node.op).is_view) continue;
    total +=
        align_up(static_cast<std::size_t>(node.type.shape.numel()) * dtype_size(node.type.dtype));
  }
  return total;
}

/// Lowers a verified graph for `backend`. Every node but inputs, params and views becomes
/// one step, in graph order.
inline Plan lower(const Graph& g, const Backend& backend, const LowerOptions& options = {}) {
  verify(g);
  Plan plan;
  plan.target = backend.target();
  plan.threads = options.threads > 0 ? options.threads : plan.target.default_threads;
  const auto n = static_cast<std::size_t>(g.size());

  // Storage roots: a view or an assign shares the memory of what it aliases, a part view
  // from a byte offset into it.
  std::vector<ValueId> root(n);
  std::vector<std::size_t> view_offset(n, 0);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const bool aliases = op_info(node.op).is_view || node.op == Op::Assign;
    const auto u = static_cast<std::size_t>(id);
    root[u] = aliases ? root[static_cast<std::size_t>(node.inputs[0])] : id;
    if (!aliases) continue;
    view_offset[u] = view_offset[static_cast<std::size_t>(node.inputs[0])];
    if (const auto* part = std::get_if<PartAttrs>(&node.attrs))
      view_offset[u] += static_cast<std::size_t>(part->offset) * dtype_size(node.type.dtype);
  }

  const auto find = [&root](ValueId v) { return detail::storage_root(root, v); };

  // In-place updates: the source of such an assign lives in the param, and the assign
  // itself needs no step.
  std::vector<bool> elided(n, false);
  if (options.inplace_updates)
    for (ValueId id = 0; id < g.size(); ++id) {
      if (g.node(id).op != Op::Assign || !detail::can_update_in_place(g, id, root)) continue;
      root[static_cast<std::size_t>(g.node(id).inputs[1])] = find(id);
      elided[static_cast<std::size_t>(id)] = true;
      ++plan.assigns_in_place;
    }

  // Step index of each computing node.
  std::vector<int> step_of(n, -1);
  int step_count = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    if (node.op != Op::Input && node.op != Op::Param && !op_info(node.op).is_view &&
        !elided[static_cast<std::size_t>(id)])
      step_of[static_cast<std::size_t>(id)] = step_count++;
  }

  // In-place activations: an elementwise kernel may write over a same-sized input that no
  // later step reads (it reads element i of each input before writing element i).
  if (options.inplace_updates)
    plan.activations_in_place = detail::reuse_dying_inputs(g, step_of, root);
  for (ValueId id = 0; id < g.size(); ++id) root[static_cast<std::size_t>(id)] = find(id);

  // The live range of each arena root.
  const int end = std::max(step_count - 1, 0);
  std::vector<int> first(n, -1), last(n, -1);
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto r = static_cast<std::size_t>(root[static_cast<std::size_t>(id)]);
    const Node& node = g.node(id);
    if (node.op == Op::Input) {
      first[r] = 0;
      last[r] = end; // fed before the run; kept so a run can be repeated on the same inputs
    } else if (step_of[static_cast<std::size_t>(id)] >= 0 && first[r] < 0) {
      first[r] = step_of[static_cast<std::size_t>(id)];
      last[r] = first[r];
    }
    const int use = step_of[static_cast<std::size_t>(id)];
    if (use >= 0)
      for (ValueId in : node.inputs) {
        const auto ir = static_cast<std::size_t>(root[static_cast<std::size_t>(in)]);
        last[ir] = std::max(last[ir], use);
      }
  }
  for (ValueId o : g.outputs())
    last[static_cast<std::size_t>(root[static_cast<std::size_t>(o)])] = end;

  // Arena placement of every root that is not a param.
  std::vector<BufferRequest> requests;
  std::vector<ValueId> request_root;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    if (root[static_cast<std::size_t>(id)] != id || node.op == Op::Param) continue;
    const auto bytes =
        static_cast<std::size_t>(node.type.shape.numel()) * dtype_size(node.type.dtype);
    requests.push_back(
        {bytes, first[static_cast<std::size_t>(id)], last[static_cast<std::size_t>(id)]});
    request_root.push_back(id);
  }
  plan.memory = options.share_memory ? plan_memory(requests) : place_separately(requests);
  plan.memory.naive_bytes = unshared_bytes(g);
  plan.unoptimised_bytes = plan.memory.naive_bytes;
  const MemoryPlan& memory = plan.memory;

  std::vector<std::size_t> offset_of(n, 0);
  for (std::size_t i = 0; i < requests.size(); ++i)
    offset_of[static_cast<std::size_t>(request_root[i])] = memory.offsets[i];

  plan.values.resize(n);
  std::vector<std::size_t> param_index(n, 0);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const ValueId r = root[static_cast<std::size_t>(id)];
    BufferRef& b = plan.values[static_cast<std::size_t>(id)];
    b.shape = node.type.shape;
    b.dtype = node.type.dtype;
    if (const auto* p = std::get_if<ParamAttrs>(&g.node(r).attrs)) {
      if (id == r) {
        param_index[static_cast<std::size_t>(r)] = plan.params.size();
        plan.params.push_back(p->tensor);
      }
      b.storage = BufferRef::Storage::param;
      b.param = param_index[static_cast<std::size_t>(r)];
      b.offset = view_offset[static_cast<std::size_t>(id)];
    } else {
      b.storage = BufferRef::Storage::arena;
      b.offset = offset_of[static_cast<std::size_t>(r)] + view_offset[static_cast<std::size_t>(id)];
    }
    if (const auto* in = std::get_if<InputAttrs>(&node.attrs))
      plan.inputs.push_back({in->name, id, b, in->label_classes});
  }

  for (ValueId id = 0; id < g.size(); ++id) {
    if (step_of[static_cast<std::size_t>(id)] < 0) continue;
    const Node& node = g.node(id);
    PlanStep step;
    step.op = node.op;
    step.node = id;
    step.num_inputs = static_cast<int>(node.inputs.size());
    std::array<TensorType, max_op_inputs> input_types{};
    for (int i = 0; i < step.num_inputs; ++i) {
      const auto at = static_cast<std::size_t>(i);
      step.inputs[at] = plan.values[static_cast<std::size_t>(node.inputs[at])];
      input_types[at] = TensorType{step.inputs[at].shape, step.inputs[at].dtype};
    }
    step.output = plan.values[static_cast<std::size_t>(id)];
    step.attrs = node.attrs;
    const KernelQuery query{
        node.op, &step.attrs,
        std::span<const TensorType>(input_types.data(), static_cast<std::size_t>(step.num_inputs)),
        node.type};
    KernelChoice choice = backend.select(query);
    if (!choice.kernel) {
      std::string inputs;
      for (ValueId in : node.inputs)
        inputs +=
            (inputs.empty() ? "%" : ", %") + std::to_string(in) + ":" + type_text(g.node(in).type);
      fail(errc::no_kernel, node_text(g, id) + " (inputs " + inputs + "): backend " +
                                plan.target.backend + " has no kernel for it: " + choice.name);
    }
    step.kernel = choice.kernel;
    step.kernel_name = std::move(choice.name);
    step.workspace_per_worker = align_up(choice.workspace_per_worker);
    plan.workspace_per_worker = std::max(plan.workspace_per_worker, step.workspace_per_worker);
    plan.steps.push_back(std::move(step));
  }
  plan.outputs = g.outputs();
  plan.output_origins = g.outputs();
  plan.buffers = std::move(requests);
  return plan;
}

} // namespace kiln
