// Lowering: Graph -> Plan. Gives each node that runs a kernel the kernel its backend selects,
// resolves where every value lives (views, updates, the inplace pass's decisions), and places
// every activation and gradient in one arena by liveness.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "kiln/ir/printer.hpp"
#include "kiln/ops/verifier.hpp"
#include "kiln/passes/storage.hpp"
#include "kiln/plan/backend.hpp"
#include "kiln/plan/memory_planner.hpp"
#include "kiln/plan/plan.hpp"

namespace kiln {

struct LowerOptions {
  /// Worker threads the plan will run with; 0 = the target's default (every core).
  int threads = 0;
  /// Share arena memory between buffers whose lifetimes do not overlap.
  bool share_memory = true;
  /// The precision convolutions and matmuls may multiply in (CompileOptions::precision); one
  /// the backend has no kernels for is kiln.target.precision, not a silent FP32 plan.
  Precision precision = Precision::f32;
};

/// A switch of lowering that CompileOptions::disable takes by name, as it takes pass names.
struct LoweringSwitch {
  std::string_view name;
  bool LowerOptions::*flag;
};

/// "plan_memory": share arena memory between buffers whose lifetimes do not overlap.
inline constexpr std::array lowering_switches = {
    LoweringSwitch{"plan_memory", &LowerOptions::share_memory}};

/// The yardstick of memory planning: every value of `g` in a buffer of its own (params,
/// updates and views own no memory).
inline std::size_t unshared_bytes(const Graph& g) {
  std::size_t total = 0;
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const OpInfo& info = op_info(node.op);
    if (info.role == OpRole::param || info.aliases_input()) continue;
    total += align_up(value_bytes(node));
  }
  return total;
}

namespace lowering {

/// The arena buffers: one per storage root that is not a param, alive from its first step
/// to its last reader (graph inputs and outputs for the whole run, so a run can be repeated
/// on the same inputs and outputs read after it).
struct Buffers {
  std::vector<BufferRequest> requests;
  std::vector<ValueId> owner; ///< the storage root of each request
};

inline Buffers live_ranges(const Graph& g, const StorageMap& storage,
                           const std::vector<int>& step_of) {
  const auto count = static_cast<std::size_t>(g.size());
  int end = 0; // the last step
  for (int step : step_of) end = std::max(end, step);
  std::vector<int> first(count, -1), last(count, -1);
  for (ValueId id = 0; id < g.size(); ++id) {
    const auto r = static_cast<std::size_t>(storage.root_of(id));
    const int step = step_of[static_cast<std::size_t>(id)];
    if (op_info(g.node(id).op).role == OpRole::input) {
      first[r] = 0;
      last[r] = end;
    } else if (step >= 0 && first[r] < 0) {
      first[r] = last[r] = step;
    }
    if (step < 0) continue;
    for (ValueId in : g.node(id).inputs) {
      const auto ir = static_cast<std::size_t>(storage.root_of(in));
      last[ir] = std::max(last[ir], step);
    }
  }
  for (ValueId o : g.outputs()) last[static_cast<std::size_t>(storage.root_of(o))] = end;
  Buffers buffers;
  for (ValueId id = 0; id < g.size(); ++id) {
    if (storage.root_of(id) != id || op_info(g.node(id).op).role == OpRole::param) continue;
    const auto at = static_cast<std::size_t>(id);
    buffers.requests.push_back({value_bytes(g.node(id)), first[at], last[at]});
    buffers.owner.push_back(id);
  }
  return buffers;
}

/// Where every value lives (arena offset, or a param and the offset into it), the params the
/// plan reads and the inputs it is fed.
inline void bind_values(const Graph& g, const StorageMap& storage, const Buffers& buffers,
                        Plan& plan) {
  const auto count = static_cast<std::size_t>(g.size());
  std::vector<std::size_t> arena_offset(count, 0), param_index(count, 0);
  for (std::size_t i = 0; i < buffers.owner.size(); ++i)
    arena_offset[static_cast<std::size_t>(buffers.owner[i])] = plan.memory.offsets[i];
  plan.values.resize(count);
  for (ValueId id = 0; id < g.size(); ++id) {
    const Node& node = g.node(id);
    const ValueId r = storage.root_of(id);
    BufferRef& b = plan.values[static_cast<std::size_t>(id)];
    b.shape = node.type.shape;
    b.dtype = node.type.dtype;
    b.offset = storage.offset[static_cast<std::size_t>(id)];
    if (const auto* p = std::get_if<ParamAttrs>(&g.node(r).attrs)) {
      if (id == r) {
        param_index[static_cast<std::size_t>(r)] = plan.params.size();
        plan.params.push_back(p->tensor);
      }
      b.storage = BufferRef::Storage::param;
      b.param = param_index[static_cast<std::size_t>(r)];
    } else {
      b.storage = BufferRef::Storage::arena;
      b.offset += arena_offset[static_cast<std::size_t>(r)];
    }
    if (const auto* in = std::get_if<InputAttrs>(&node.attrs))
      plan.inputs.push_back({in->name, id, b, in->label_classes});
  }
}

/// The node as an error names it: its text form and its inputs' types.
inline std::string describe_for_backend(const Graph& g, ValueId id) {
  std::string inputs;
  for (ValueId in : g.node(id).inputs)
    inputs +=
        (inputs.empty() ? "%" : ", %") + std::to_string(in) + ":" + type_text(g.node(in).type);
  return node_text(g, id) + " (inputs " + inputs + ")";
}

/// One plan step per node that runs a kernel, with the kernel `backend` selects for it.
inline void select_kernels(const Graph& g, const std::vector<int>& step_of, const Backend& backend,
                           Plan& plan) {
  for (ValueId id = 0; id < g.size(); ++id) {
    if (step_of[static_cast<std::size_t>(id)] < 0) continue;
    const Node& node = g.node(id);
    PlanStep step;
    step.op = node.op;
    step.node = id;
    step.num_inputs = static_cast<int>(node.inputs.size());
    std::array<TensorType, max_op_inputs> input_types{};
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      step.inputs[i] = plan.values[static_cast<std::size_t>(node.inputs[i])];
      input_types[i] = g.node(node.inputs[i]).type;
    }
    step.output = plan.values[static_cast<std::size_t>(id)];
    step.attrs = node.attrs;
    if (const auto* collective = std::get_if<CollectiveAttrs>(&step.attrs))
      plan.communicator = collective->communicator;
    KernelChoice choice = backend.select(KernelQuery{
        node.op, &step.attrs, std::span<const TensorType>(input_types.data(), node.inputs.size()),
        node.type, plan.precision});
    if (!choice.kernel)
      fail(errc::no_kernel, describe_for_backend(g, id) + ": backend " + plan.target.backend +
                                " has no kernel for it: " + choice.name);
    step.kernel = choice.kernel;
    step.kernel_name = std::move(choice.name);
    step.workspace_per_worker = align_up(choice.workspace_per_worker);
    plan.workspace_per_worker = std::max(plan.workspace_per_worker, step.workspace_per_worker);
    plan.steps.push_back(std::move(step));
  }
}

} // namespace lowering

/// Lowers a verified graph for `backend`. Every node that runs a kernel becomes one step, in
/// graph order; where a value lives follows the storage rules (passes/storage.hpp), the
/// inplace pass's decisions included.
inline Plan lower(const Graph& g, const Backend& backend, const LowerOptions& options = {}) {
  verify(g);
  Plan plan;
  plan.target = backend.target();
  plan.threads = options.threads > 0 ? options.threads : plan.target.default_threads;
  check_precision(plan.target, options.precision);
  plan.precision = options.precision;
  const StorageMap storage = storage_map(g);
  const std::vector<int> step_of = number_steps(g);
  lowering::Buffers buffers = lowering::live_ranges(g, storage, step_of);
  plan.memory =
      options.share_memory ? plan_memory(buffers.requests) : place_separately(buffers.requests);
  plan.memory.naive_bytes = unshared_bytes(g);
  plan.unoptimised_bytes = plan.memory.naive_bytes;
  lowering::bind_values(g, storage, buffers, plan);
  lowering::select_kernels(g, step_of, backend, plan);
  for (const Node& n : g.nodes()) {
    if (n.in_place_of < 0) continue;
    ++(op_info(n.op).role == OpRole::update ? plan.assigns_in_place : plan.activations_in_place);
  }
  plan.outputs = g.outputs();
  plan.output_origins = g.outputs();
  plan.buffers = std::move(buffers.requests);
  return plan;
}

} // namespace kiln
