// fusion_bench: what each optimisation buys on a whole training step. For three networks it
// compiles the step (forward + backward + SGD update) under several configurations, runs
// them alternately in one process, and prints one table per network; --json writes the same
// and --plot draws the speedups. `fusion_bench --help` lists its flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"
#include "kiln_tools/render.hpp"

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

struct Config {
  std::string name;
  std::vector<std::string> disable;
  bool tune = false; ///< every pass, with the tuner's measured decisions (Tune::quick)
  kiln::Precision precision = kiln::Precision::f32;
};

/// The configurations, from the pipeline's own names: every fuse_* pass is fusion, "layout"
/// is the layout pass with the folding of its reorders into pools ("fold_reorders"), "winograd"
/// the choice of Winograd convolutions, memory planning is the "schedule" pass and both
/// lowering switches, every other pass is cleanup, and "all off" is every pass and lowering
/// switch at once. "tuned" is every pass with Tune::quick, tuned afresh in this
/// run; "bf16" is every pass with Precision::bf16, where the device has kernels that multiply in
/// bfloat16.
std::vector<Config> make_configs(const kiln::Target& target) {
  std::vector<std::string> fusion, cleanup, everything;
  for (const kiln::Pass& p : kiln::default_pipeline) {
    if (p.name.starts_with("fuse_"))
      fusion.emplace_back(p.name);
    else if (p.name != "layout" && p.name != "fold_reorders" && p.name != "winograd" &&
             p.name != "schedule" && p.name != "inplace")
      cleanup.emplace_back(p.name);
    everything.emplace_back(p.name);
  }
  for (const kiln::LoweringSwitch& s : kiln::lowering_switches) everything.emplace_back(s.name);
  std::vector<Config> configs = {{"all passes", {}}, {"tuned", {}, true}};
  if (target.bf16_products) configs.push_back({"bf16", {}, false, kiln::Precision::bf16});
  configs.insert(configs.end(), {{"fusion off", fusion},
                                 {"layout off", {"layout", "fold_reorders"}},
                                 {"winograd off", {"winograd"}},
                                 {"memory planning off", {"schedule", "plan_memory", "inplace"}},
                                 {"cleanup off", cleanup},
                                 {"all off", everything}});
  return configs;
}

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

/// What tuning cost: the tuning itself, and a second compile that read its cache.
struct TuningCost {
  double seconds = 0.0, cached_compile_ms = 0.0;
  std::string note;
};

/// Compiles `g` with Tune::quick into a cache file of this run's own, then again from that
/// cache, and returns the second executor with what both compiles took.
kiln::Executor compile_tuned(const kiln::Graph& g, const kiln::Backend& backend, int threads,
                             const std::filesystem::path& cache, TuningCost& cost) {
  std::filesystem::remove(cache);
  const kiln::CompileOptions options{
      .threads = threads, .tune = kiln::Tune::quick, .tune_cache = cache};
  cost.seconds = kiln::compile(g, backend, options).report().tuning.seconds;
  const auto t0 = std::chrono::steady_clock::now();
  kiln::Executor exe = kiln::compile(g, backend, options);
  cost.cached_compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cost.note = exe.report().tuning.note;
  return exe;
}

struct Row {
  std::string config;
  double ms = 0, min = 0, max = 0;
  double speedup = 0; ///< over "all off", paired by round (bench::Timing::speedup)
  std::size_t kernels = 0, bytes = 0, peak = 0;
  double model_ms = 0; ///< the cost model's prediction
};

/// The speedup of every configuration over "all off", one cluster of bars per configuration
/// and one bar per network, as gnuplot draws it.
std::string speedup_chart(const std::vector<Config>& configs,
                          const std::vector<std::string>& networks,
                          const std::vector<std::vector<double>>& speedups,
                          const std::string& title) {
  std::ostringstream script;
  script << "$speedup << EOD\nconfiguration";
  for (const std::string& n : networks) script << ' ' << n;
  script << '\n';
  for (std::size_t c = 0; c < configs.size(); ++c) {
    script << kiln::tools::gnuplot_quoted(configs[c].name);
    for (const auto& per_network : speedups) script << ' ' << per_network[c];
    script << '\n';
  }
  script << "EOD\n"
         << "set title " << kiln::tools::gnuplot_quoted(title) << "\n"
         << "set style data histograms\nset style histogram clustered gap 1\n"
         << "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
         << "set ylabel 'speedup over all optimisations off'\nset yrange [0:*]\n"
         << "set grid ytics\nset key outside top center horizontal\n"
         << "set xtics nomirror rotate by 20 right\n"
         << "plot $speedup using 2:xtic(1) title columnheader";
  for (std::size_t n = 1; n < networks.size(); ++n)
    script << ", '' using " << n + 2 << " title columnheader";
  script << '\n';
  return script.str();
}

int run(const bench::StepFlags& flags, const std::string& device, const std::string& plot) {
  const kiln::Backend& backend = kiln::backend_named(device);
  const std::vector<Config> configs = make_configs(backend.target());
  const kiln::tools::JsonOutput json(flags.json);
  if (!plot.empty()) {
    kiln::tools::require_program("gnuplot", "gnuplot-nox", "--plot");
    kiln::tools::require_writable(plot, "--plot");
  }
  std::vector<std::string> networks;
  std::vector<std::vector<double>> speedups;
  std::string target;
  const auto [threads, batch, rounds, steps, json_path] = flags;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  bench::random_batch(batch, images, labels);

  // The tuned configuration tunes afresh in every run, into a file of its own.
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() /
      ("kiln-fusion-bench-tuning-" + std::to_string(::getpid()) + ".json");
  // Measured before any step runs, for the cost model's predictions.
  const kiln::MachinePeak peak = kiln::machine_peak(backend.target(), threads);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [network, make] : bench::reference_networks) {
    kiln::Graph g;
    bench::build_training_step(g, make, batch, {.lr = 0.01f, .momentum = 0.9f});
    std::vector<kiln::Executor> exes;
    TuningCost tuning;
    for (const Config& c : configs) {
      if (c.tune) {
        exes.push_back(compile_tuned(g, backend, threads, cache, tuning));
      } else {
        exes.push_back(kiln::compile(
            g, backend, {.threads = threads, .disable = c.disable, .precision = c.precision}));
      }
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
      rows.push_back({configs[k].name, t.median, t.min, t.max, timing.speedup(k, exes.size() - 1),
                      plan.steps.size(), bytes_moved(plan), plan.memory.arena_bytes,
                      1000.0 * kiln::predicted_run_seconds(plan, peak)});
    }
    target = exes[0].plan().target.isa;
    networks.push_back(network);
    speedups.emplace_back();
    std::printf("\n%s: training step on %s, batch %d, %d threads, %s, median of %d rounds x %d "
                "steps\n",
                network, device.c_str(), batch, threads, target.c_str(), rounds, steps);
    std::printf("%-20s %9s %17s %8s %8s %12s %12s %9s %6s\n", "configuration", "ms/step",
                "min..max", "speedup", "kernels", "MiB moved", "peak MiB", "model ms", "error");
    for (const Row& r : rows) {
      std::printf("%-20s %9.2f %8.2f..%-8.2f %7.2fx %8zu %12.1f %12.1f %9.2f %+5.0f%%\n",
                  r.config.c_str(), r.ms, r.min, r.max, r.speedup, r.kernels,
                  static_cast<double>(r.bytes) / 1048576.0, static_cast<double>(r.peak) / 1048576.0,
                  r.model_ms, 100.0 * (r.model_ms - r.ms) / r.ms);
      speedups.back().push_back(r.speedup);
      results.push_back({{"network", network},
                         {"config", r.config},
                         {"ms_per_step", r.ms},
                         {"min", r.min},
                         {"max", r.max},
                         {"speedup_vs_all_off", r.speedup},
                         {"kernels", r.kernels},
                         {"bytes_moved", r.bytes},
                         {"planned_peak_bytes", r.peak},
                         {"model_ms_per_step", r.model_ms},
                         {"device", device},
                         {"threads", threads},
                         {"batch", batch},
                         {"target", target},
                         {"build_type", KILN_BUILD_TYPE},
                         {"other_cores_busy", timing.other_cores},
                         {"core_distance", bench::core_distance_json(timing)}});
      if (r.config == "tuned") {
        results.back()["tuning_seconds"] = tuning.seconds;
        results.back()["cached_compile_ms"] = tuning.cached_compile_ms;
      }
    }
    std::printf("tuned: tuning took %.2f s, a second compile read its cache in %.1f ms; %s\n",
                tuning.seconds, tuning.cached_compile_ms, tuning.note.c_str());
    bench::print_neighbours(timing);
  }
  std::filesystem::remove(cache);
  json.write(results);
  if (!plot.empty()) {
    const std::string title = "kiln fusion_bench: training step on " + device + ", batch " +
                              std::to_string(batch) + ", " + std::to_string(threads) +
                              " threads, " + target;
    kiln::tools::plot_svg(speedup_chart(configs, networks, speedups, title), plot, "--plot", 900,
                          440);
    std::printf("wrote %s\n", plot.c_str());
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times the training step of three networks with each optimisation switched off "
               "in turn, the configurations alternating in one run.",
               "fusion_bench");
  bench::StepFlags flags;
  bench::add_step_flags(app, flags);
  std::string plot, device = "cpu";
  app.add_option("--plot", plot, "draw each configuration's speedup as bars in an SVG file");
  app.add_option("--device", device,
                 "where the steps run: cpu, or cuda in a build with kiln's CUDA backend")
      ->check(kiln::tools::one_of({"cpu", "cuda"}, "device"));
  return kiln::tools::run(app, argc, argv, [&] { return run(flags, device, plot); });
}
