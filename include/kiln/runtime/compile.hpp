// compile(): the one call from a built graph to something that runs.
#pragma once

#include "kiln/backends/cpu/backend.hpp"
#include "kiln/plan/lower.hpp"
#include "kiln/runtime/executor.hpp"

namespace kiln {

/// Options of kiln::compile.
struct CompileOptions {
  /// Worker threads; 0 = every core.
  int threads = 0;
  /// Record the time of every step (read with Executor::step_times).
  bool profile = false;
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
