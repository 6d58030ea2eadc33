// compile(): the one call from a built graph to something that runs.
#pragma once

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/backends/cpu/backend.hpp"
#include "kiln/passes/pipeline.hpp"
#include "kiln/plan/lower.hpp"
#include "kiln/runtime/executor.hpp"
#include "kiln/runtime/profiler.hpp"

namespace kiln {

/// Options of kiln::compile.
struct CompileOptions {
  /// Worker threads; 0 = every core.
  int threads = 0;
  /// Record the time of every step (read with Executor::step_times, or profile_steps and
  /// print_profile in runtime/profiler.hpp).
  bool profile = false;
  /// Optimisations to switch off by name: any pass of default_pipeline ("dce",
  /// "fuse_elementwise", "inplace", ...) or a lowering switch ("plan_memory").
  std::vector<std::string> disable{};
  /// When set, the IR after every pass is written here.
  std::ostream* dump_ir = nullptr;
};

/// Every name CompileOptions::disable accepts: the passes of default_pipeline in order, then
/// the lowering switches.
inline std::vector<std::string> optimisation_names() {
  std::vector<std::string> names;
  for (const Pass& p : default_pipeline) names.emplace_back(p.name);
  for (const LoweringSwitch& s : lowering_switches) names.emplace_back(s.name);
  return names;
}

/// Optimises a copy of `graph` with the default pipeline, lowers it and prepares it to run
/// on `backend` (default: the CPU). The user's graph and its Values stay valid: outputs are
/// read from the executor with the Values of `graph`.
inline Executor compile(const Graph& graph, const Backend& backend,
                        const CompileOptions& options = {}) {
  verify(graph);
  PassContext ctx;
  LowerOptions lowering{.threads = options.threads};
  for (const std::string& name : options.disable) {
    const auto lowering_switch =
        std::find_if(lowering_switches.begin(), lowering_switches.end(),
                     [&](const LoweringSwitch& s) { return s.name == name; });
    const bool is_pass = std::any_of(default_pipeline.begin(), default_pipeline.end(),
                                     [&](const Pass& p) { return p.name == name; });
    if (lowering_switch != lowering_switches.end()) {
      lowering.*(lowering_switch->flag) = false;
    } else if (is_pass) {
      ctx.disabled.insert(name);
    } else {
      std::string names;
      for (const std::string& known : optimisation_names())
        names += (names.empty() ? "" : ", ") + known;
      fail(errc::argument, "no pass named '" + name + "' (passes and switches: " + names + ")");
    }
  }
  ctx.dump_ir = options.dump_ir;
  ctx.target = backend.target();
  std::shared_ptr<Graph> optimised = graph.clone();
  run_passes(*optimised, default_pipeline, ctx);
  ctx.report.optimised = optimised;
  Plan plan = lower(*optimised, backend, lowering);
  plan.output_origins = graph.outputs();
  plan.unoptimised_bytes = unshared_bytes(graph);
  Executor exe(std::move(plan), backend, std::move(ctx.report));
  exe.set_profiling(options.profile);
  return exe;
}

inline Executor compile(const Graph& graph, const CompileOptions& options = {}) {
  return compile(graph, cpu_backend(), options);
}

} // namespace kiln
