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

namespace kiln {

/// Options of kiln::compile.
struct CompileOptions {
  /// Worker threads; 0 = every core.
  int threads = 0;
  /// Record the time of every step (read with Executor::step_times).
  bool profile = false;
  /// Optimisations to switch off by name: any pass of default_pipeline ("dce",
  /// "fuse_elementwise", ...) or a lowering switch ("plan_memory", "inplace").
  std::vector<std::string> disable{};
  /// When set, the IR after every pass is written here.
  std::ostream* dump_ir = nullptr;
};

/// Verifies, lowers and prepares `graph` to run on `backend` (default: the CPU).
inline Executor compile(const Graph& graph, const Backend& backend,
                        const CompileOptions& options = {}) {
  Executor exe(lower(graph, backend, LowerOptions{options.threads}));
  exe.set_profiling(options.profile);
  return exe;
}

inline Executor compile(const Graph& graph, const CompileOptions& options = {}) {
  return compile(graph, cpu_backend(), options);
}

} // namespace kiln
