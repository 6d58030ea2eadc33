// The pass framework: a pass is a named, stateless function over the graph; the context
// says which passes are off, whether to dump IR, and collects the compile report.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/ops/effects.hpp"
#include "kiln/ops/verifier.hpp"
#include "kiln/passes/decisions.hpp"
#include "kiln/passes/report.hpp"
#include "kiln/passes/target.hpp"

namespace kiln {

/// What one run of a pass did: whether the graph changed, and the pass's own counters.
struct PassResult {
  bool changed = false;
  std::vector<std::pair<std::string, std::int64_t>> stats;

  void count(const std::string& what, std::int64_t n = 1) {
    for (auto& [name, value] : stats)
      if (name == what) {
        value += n;
        return;
      }
    stats.emplace_back(what, n);
    changed = changed || n != 0;
  }
};

/// What passes share during one compilation.
struct PassContext {
  std::set<std::string, std::less<>> disabled; ///< pass names to skip
  std::ostream* dump_ir = nullptr;             ///< when set, the IR after every pass goes here
#ifdef NDEBUG
  bool verify_each_pass = false;
#else
  bool verify_each_pass = true; ///< debug builds check the graph after every pass
#endif
  /// The device compiled for; passes that depend on it (layout) read it here.
  Target target;
  /// What convolutions and matmuls may multiply in (CompileOptions::precision).
  Precision precision = Precision::f32;
  /// Choices measured by a tuner, which replace the passes' rules where given.
  Decisions decisions;
  CompileReport report;

  [[nodiscard]] bool enabled(std::string_view name) const { return !disabled.contains(name); }

  /// Records that `pass` did or did not merge producer into consumer, and why.
  void decide(std::string_view pass, const Graph& g, ValueId producer, ValueId consumer,
              FusionReason reason) {
    report.fusion.push_back({producer, consumer, std::string(op_name(g.node(producer).op)),
                             std::string(op_name(g.node(consumer).op)), reason, std::string(pass)});
  }
};

using PassFn = PassResult (*)(Graph&, PassContext&);

/// A pass: its stable name (what `disable` takes) and its function.
struct Pass {
  std::string_view name;
  PassFn run = nullptr;
};

/// Runs `pipeline` over `g` in order, honouring the context's switches and recording each
/// pass in the report. A disabled name that no pass has is an error (likely a typo).
inline void run_passes(Graph& g, std::span<const Pass> pipeline, PassContext& ctx) {
  for (const std::string& name : ctx.disabled) {
    bool known = false;
    for (const Pass& p : pipeline) known = known || p.name == name;
    if (!known) {
      std::string names;
      for (const Pass& p : pipeline) names += (names.empty() ? "" : ", ") + std::string(p.name);
      fail(errc::argument, "no pass named '" + name + "' (passes: " + names + ")");
    }
  }
  for (const Pass& p : pipeline) {
    PassRecord record;
    record.name = p.name;
    record.nodes_before = record.nodes_after = g.size();
    if (ctx.enabled(p.name)) {
      const auto t0 = std::chrono::steady_clock::now();
      PassResult r = p.run(g, ctx);
      record.milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      record.ran = true;
      record.changed = r.changed;
      record.stats = std::move(r.stats);
      record.nodes_after = g.size();
      if (ctx.verify_each_pass) verify(g);
      if (ctx.dump_ir) *ctx.dump_ir << "// after " << p.name << "\n" << to_text(g);
    }
    ctx.report.passes.push_back(std::move(record));
  }
}

} // namespace kiln
