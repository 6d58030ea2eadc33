// fusion_bench: what each optimisation buys on a whole training step. For three networks it
// compiles the step (forward + backward + SGD update) under several configurations, runs
// them alternately in one process, and prints one table per network; --json writes the same.
//
//   fusion_bench [--threads N] [--batch N] [--rounds N] [--steps N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

struct Config {
  std::string name;
  std::vector<std::string> disable;
};

/// The configurations, from the pipeline's own names: every fuse_* pass is fusion, "layout"
/// is the layout pass, memory planning is the "schedule" pass and both lowering switches,
/// every other pass is cleanup, and "all off" is every pass and lowering switch at once.
std::vector<Config> make_configs() {
  std::vector<std::string> fusion, cleanup, everything;
  for (const kiln::Pass& p : kiln::default_pipeline) {
    if (p.name.starts_with("fuse_"))
      fusion.emplace_back(p.name);
    else if (p.name != "layout" && p.name != "schedule" && p.name != "inplace")
      cleanup.emplace_back(p.name);
    everything.emplace_back(p.name);
  }
  for (const kiln::LoweringSwitch& s : kiln::lowering_switches) everything.emplace_back(s.name);
  return {
      {"all passes", {}},         {"fusion off", fusion},
      {"layout off", {"layout"}}, {"memory planning off", {"schedule", "plan_memory", "inplace"}},
      {"cleanup off", cleanup},   {"all off", everything}};
}

const std::vector<Config> configs = make_configs();

/// Bytes each step reads and writes, summed: what the plan moves through memory per run
/// (kernels that re-read an input, like convolutions, count it once), plus the column
/// matrices NCHW convolutions write and read back.
std::size_t bytes_moved(const kiln::Plan& plan) {
  std::size_t total = 0;
  for (const kiln::PlanStep& s : plan.steps) {
    if (const auto* conv = std::get_if<kiln::Conv2dAttrs>(&s.attrs)) {
      const auto& [x, y] =
          s.op == kiln::Op::Conv2dGradInput ? std::pair{s.output.shape, s.inputs[0].shape}
          : s.op == kiln::Op::Conv2d        ? std::pair{s.inputs[0].shape, s.output.shape}
                                            : std::pair{s.inputs[0].shape, s.inputs[1].shape};
      total += static_cast<std::size_t>(kiln::column_matrix_bytes(*conv, x, y));
    }
    for (int i = 0; i < s.num_inputs; ++i) {
      const auto& b = s.inputs[static_cast<std::size_t>(i)];
      total += static_cast<std::size_t>(b.shape.numel()) * kiln::dtype_size(b.dtype);
    }
    total += static_cast<std::size_t>(s.output.shape.numel()) * kiln::dtype_size(s.output.dtype);
  }
  return total;
}

struct Row {
  std::string config;
  double ms = 0, min = 0, max = 0;
  std::size_t kernels = 0, bytes = 0, peak = 0;
};

} // namespace

int main(int argc, char** argv) {
  bench::StepFlags flags;
  if (!bench::parse_step_flags(argc, argv, "fusion_bench", flags)) return 2;
  const auto [threads, batch, rounds, steps, json] = flags;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  bench::random_batch(batch, images, labels);

  std::string json_rows;
  for (const auto& [network, make] : bench::reference_networks) {
    kiln::Graph g;
    bench::build_training_step(g, make, batch, {.lr = 0.01f, .momentum = 0.9f});
    std::vector<kiln::Executor> exes;
    for (const Config& c : configs) {
      exes.push_back(kiln::compile(g, {.threads = threads, .disable = c.disable}));
      exes.back().set_input("x", images);
      exes.back().set_input("y", labels);
      exes.back().run(); // warm-up: first touch of the arena, caches
    }
    // Configurations alternate within every round so that they share the machine's state.
    const bench::Timing timing = bench::time_alternately(exes, rounds, steps);
    std::vector<Row> rows;
    for (std::size_t k = 0; k < exes.size(); ++k) {
      const kiln::Plan& plan = exes[k].plan();
      const bench::Spread& t = timing.per_executor[k];
      rows.push_back({configs[k].name, t.median, t.min, t.max, plan.steps.size(), bytes_moved(plan),
                      plan.memory.arena_bytes});
    }
    const double base = rows.back().ms;
    std::printf("\n%s: training step, batch %d, %d threads, %s, median of %d rounds x %d steps\n",
                network, batch, threads, exes[0].plan().target.isa.c_str(), rounds, steps);
    std::printf("%-20s %9s %17s %8s %8s %12s %12s\n", "configuration", "ms/step", "min..max",
                "speedup", "kernels", "MiB moved", "peak MiB");
    for (const Row& r : rows) {
      std::printf("%-20s %9.2f %8.2f..%-8.2f %7.2fx %8zu %12.1f %12.1f\n", r.config.c_str(), r.ms,
                  r.min, r.max, base / r.ms, r.kernels, static_cast<double>(r.bytes) / 1048576.0,
                  static_cast<double>(r.peak) / 1048576.0);
      json_rows +=
          std::string(json_rows.empty() ? "" : ",\n") + "  {\"network\": \"" + network +
          "\", \"config\": \"" + r.config + "\", \"ms_per_step\": " + std::to_string(r.ms) +
          ", \"min\": " + std::to_string(r.min) + ", \"max\": " + std::to_string(r.max) +
          ", \"speedup_vs_all_off\": " + std::to_string(base / r.ms) +
          ", \"kernels\": " + std::to_string(r.kernels) +
          ", \"bytes_moved\": " + std::to_string(r.bytes) +
          ", \"planned_peak_bytes\": " + std::to_string(r.peak) +
          ", \"threads\": " + std::to_string(threads) + ", \"batch\": " + std::to_string(batch) +
          ", \"target\": \"" + exes[0].plan().target.isa + "\", \"build_type\": \"" +
          KILN_BUILD_TYPE + "\", \"other_cores_busy\": " + std::to_string(timing.other_cores) + "}";
    }
    bench::print_neighbours(timing);
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "[\n" << json_rows << "\n]\n";
  }
  return 0;
}
