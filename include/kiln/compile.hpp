// compile(): the one call from a built graph to something that runs.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/backends/cpu/backend.hpp"
#if defined(KILN_WITH_CUDA)
#include "kiln/backends/cuda/backend.hpp"
#endif
#include "kiln/passes/pipeline.hpp"
#include "kiln/plan/lower.hpp"
#include "kiln/runtime/executor.hpp"
#include "kiln/runtime/profiler.hpp"
#include "kiln/tuner.hpp"
#include "kiln/tuning_cache.hpp"

namespace kiln {

/// Options of kiln::compile.
struct CompileOptions {
  /// Worker threads; 0 = every core. At most max_threads(): more than the machine runs at once
  /// only wait for each other.
  int threads = 0;
  /// Record the time of every step (read with Executor::step_times, or profile_steps and
  /// print_profile in runtime/profiler.hpp).
  bool profile = false;
  /// Optimisations to switch off by name: any pass of default_pipeline ("dce",
  /// "fuse_elementwise", "inplace", ...) or a lowering switch ("plan_memory").
  std::vector<std::string> disable{};
  /// When set, the IR after every pass is written here.
  std::ostream* dump_ir = nullptr;
  /// Let the device record the step once and replay it (a CUDA graph: one launch per step).
  /// Off, every run launches each kernel, as profilers and debuggers want.
  bool replay = true;
  /// After every run, fail (kiln.runtime.not_finite) when a one-element output, such as the
  /// loss, is NaN or infinite, naming the run: training stops at the first bad step instead of
  /// carrying NaN into every weight.
  bool check_finite = false;
  /// Tune::quick times the decisions the cost model cannot settle (a group's layout, an
  /// epilogue's fusion) on the real shapes and keeps the faster choice; the report's `tuning`
  /// says what it weighed and measured. The result is cached per machine, threads and graph,
  /// so compiling the same step again reads it back. The parameters are left as they were.
  Tune tune = Tune::off;
  /// The most seconds a tuning may take, measuring the machine's peak included.
  double tune_seconds = 2.0;
  /// The tuning cache file; empty: default_tuning_cache() ($KILN_TUNING_CACHE, else under
  /// $XDG_CACHE_HOME or ~/.cache).
  std::filesystem::path tune_cache{};
  /// Precision::bf16 lets convolutions and matmuls multiply in bfloat16 where the backend has
  /// such kernels (Target::bf16_products; asking for it elsewhere is a kiln::Error), FP32
  /// everywhere else: the parameters, optimizer state and every sum stay FP32.
  Precision precision = Precision::f32;
};

/// The most worker threads a compilation takes: four per hardware thread.
inline int max_threads() {
  return 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

/// Every name CompileOptions::disable accepts: the passes of default_pipeline in order, then
/// the lowering switches.
inline std::vector<std::string> optimisation_names() {
  std::vector<std::string> names;
  for (const Pass& p : default_pipeline) names.emplace_back(p.name);
  for (const LoweringSwitch& s : lowering_switches) names.emplace_back(s.name);
  return names;
}

namespace detail {

/// The passes' and lowering's switches of `options`, checked: unknown names are an error.
inline std::pair<PassContext, LowerOptions> compile_switches(const CompileOptions& options) {
  PassContext ctx;
  LowerOptions lowering{.threads = options.threads, .precision = options.precision};
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
  ctx.precision = options.precision;
  return {std::move(ctx), lowering};
}

/// Optimises a copy of `graph` with `decisions` forced on the passes, and lowers it.
inline Lowered optimise_and_lower(const Graph& graph, const Backend& backend,
                                  const CompileOptions& options, const Decisions& decisions) {
  auto [ctx, lowering] = compile_switches(options);
  ctx.target = backend.target();
  ctx.decisions = decisions;
  std::shared_ptr<Graph> optimised = graph.clone();
  run_passes(*optimised, default_pipeline, ctx);
  ctx.report.optimised = optimised;
  Plan plan = lower(*optimised, backend, lowering);
  plan.replay = options.replay;
  plan.check_finite = options.check_finite;
  plan.origin = &graph;
  plan.output_origins = graph.outputs();
  plan.unoptimised_bytes = unshared_bytes(graph);
  return {std::move(plan), std::move(ctx.report)};
}

inline Executor open_lowered(Lowered lowered, const Backend& backend,
                             const CompileOptions& options) {
  Executor exe(std::move(lowered.plan), backend, std::move(lowered.report));
  exe.set_profiling(options.profile);
  return exe;
}

} // namespace detail

/// Optimises a copy of `graph` with the default pipeline, lowers it and prepares it to run
/// on `backend` (default: the CPU). The user's graph and its Values stay valid: outputs are
/// read from the executor with the Values of `graph`. With options.tune, the passes' uncertain
/// decisions are measured first (or read from the tuning cache).
inline Executor compile(const Graph& graph, const Backend& backend,
                        const CompileOptions& options = {}) {
  if (options.threads < 0 || options.threads > max_threads())
    fail(errc::argument, "compile: threads is " + std::to_string(options.threads) +
                             "; it must be 0 (every core) to " + std::to_string(max_threads()) +
                             " (four per hardware thread)");
  if (options.tune != Tune::off && options.tune != Tune::quick)
    fail(errc::argument, "compile: tune is " + std::to_string(static_cast<int>(options.tune)) +
                             "; it must be Tune::off or Tune::quick");
  if (!std::isfinite(options.tune_seconds) || options.tune_seconds <= 0.0 ||
      options.tune_seconds > 3600.0)
    fail(errc::argument, "compile: tune_seconds is " + std::to_string(options.tune_seconds) +
                             "; it must be more than 0 and at most 3600");
  if (options.precision != Precision::f32 && options.precision != Precision::bf16)
    fail(errc::argument, "compile: precision is " +
                             std::to_string(static_cast<int>(options.precision)) +
                             "; it must be Precision::f32 or Precision::bf16");
  check_precision(backend.target(), options.precision);
  verify(graph);
  if (options.tune == Tune::off)
    return detail::open_lowered(detail::optimise_and_lower(graph, backend, options, {}), backend,
                                options);
  const Target& target = backend.target();
  const int threads = options.threads > 0 ? options.threads : target.default_threads;
  std::string disabled;
  for (const std::string& name : options.disable) disabled += (disabled.empty() ? "" : ",") + name;
  const TunerSettings settings{
      options.tune_seconds,
      options.tune_cache.empty() ? default_tuning_cache() : options.tune_cache,
      TuningCache::key(target, threads, graph, disabled, options.precision),
      TuningCache::machine_key(target, threads)};
  CompileOptions trial = options; // the tuner's trials write no IR and time themselves
  trial.dump_ir = nullptr;
  trial.profile = false;
  return compile_tuned(
      settings,
      [&](const Decisions& d) { return detail::optimise_and_lower(graph, backend, trial, d); },
      [&](Lowered l) { return detail::open_lowered(std::move(l), backend, trial); },
      [&](const Decisions& d, TuningReport report) {
        Lowered l = detail::optimise_and_lower(graph, backend, options, d);
        l.report.tuning = std::move(report);
        return detail::open_lowered(std::move(l), backend, options);
      });
}

inline Executor compile(const Graph& graph, const CompileOptions& options = {}) {
  return compile(graph, cpu_backend(), options);
}

/// The backend called `name`: "cpu", or "cuda" in a program built with the CUDA backend (the
/// kiln::cuda target defines KILN_WITH_CUDA). Anything else, or "cuda" without it, is a
/// kiln::Error saying which backends this program has.
inline const Backend& backend_named(std::string_view name) {
  if (name == "cpu") return cpu_backend();
#if defined(KILN_WITH_CUDA)
  if (name == "cuda") return cuda_backend();
  fail(errc::argument, "no backend named '" + std::string(name) + "' (backends: cpu, cuda)");
#else
  if (name == "cuda")
    fail(errc::cuda_unavailable,
         "this program was built without kiln's CUDA backend (configure "
         "with -DKILN_CUDA=ON where nvcc is installed, and link kiln::cuda)");
  fail(errc::argument, "no backend named '" + std::string(name) + "' (backends: cpu)");
#endif
}

} // namespace kiln
