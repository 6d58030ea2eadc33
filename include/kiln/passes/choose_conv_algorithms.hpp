// The winograd pass: has each convolution multiply in the Winograd domain where the target has
// a kernel for it and its own account of the work (Target::kernel_work) predicts that kernel
// faster than the direct one at the compilation's precision.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <variant>

#include "kiln/passes/cost_model.hpp"
#include "kiln/passes/pass.hpp"

namespace kiln {

/// The rule weighs compute alone, as both kernels read and write the same operands: FLOPs
/// over the share of the peak each reaches. The Winograd kernel has to win by this much, as
/// it also rounds differently from the direct one.
inline constexpr double winograd_required_gain = 1.05;

/// The time of `work` in units of peak FLOPs, for comparing two kernels of one call.
inline double peak_flops_time(const KernelWork& work) {
  return work.flops / std::max(work.compute_fill, 1e-3);
}

/// Sets Conv2dAttrs::winograd on every convolution whose Winograd kernel the target predicts
/// at least winograd_required_gain faster, unless the context's decisions say otherwise
/// (algorithm_decision_key). Both kernels are asked at the compilation's precision: under
/// bfloat16 the direct one is the bf16 kernel where the target has it, and a Winograd kernel
/// that multiplies in FP32 must beat that.
inline PassResult choose_conv_algorithms(Graph& g, PassContext& ctx) {
  PassResult result;
  if (!ctx.target.kernel_work) return result;
  for (ValueId id = 0; id < g.size(); ++id) {
    Node& n = g.node(id);
    const auto* attrs = std::get_if<Conv2dAttrs>(&n.attrs);
    if (!attrs || attrs->winograd || n.inputs.size() < 2) continue;
    Conv2dAttrs winograd_attrs = *attrs;
    winograd_attrs.winograd = true;
    const Attrs direct = n.attrs, winograd = winograd_attrs;
    const std::array<TensorType, 2> in{g.node(n.inputs[0]).type, g.node(n.inputs[1]).type};
    const KernelQuery direct_query{n.op, &direct, in, n.type, ctx.precision};
    const KernelQuery winograd_query{n.op, &winograd, in, n.type, ctx.precision};
    const double relative = peak_flops_time(ctx.target.kernel_work(winograd_query)) /
                            peak_flops_time(ctx.target.kernel_work(direct_query));
    // A convolution the Winograd kernels do not take costs the same either way.
    if (relative == 1.0) continue;
    bool chosen = relative * winograd_required_gain <= 1.0;
    const std::string* forced = ctx.decisions.find(algorithm_decision_key(id));
    if (forced) chosen = *forced == "winograd";
    ctx.report.algorithms.push_back({id, std::string(op_name(n.op)), chosen ? "winograd" : "direct",
                                     relative, forced != nullptr});
    if (!chosen) continue;
    n.attrs = winograd;
    result.count("winograd_convs");
  }
  return result;
}

} // namespace kiln
