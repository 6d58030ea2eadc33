// step_bench: milliseconds per training step of a reference network (the default MNIST CNN,
// batch 64) on each of several thread counts (1 and 2 unless --threads says), measured
// alternately in one run, or on the GPU (--device cuda); prints a scaling table and writes JSON.
// `step_bench --help` lists its flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

struct Setup {
  kiln::nn::Sequential net;
  kiln::Graph graph;
  kiln::Value loss;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};

std::unique_ptr<Setup> make_step(const std::string& model, int batch) {
  using namespace kiln::nn;
  manual_seed(1);
  auto s = std::make_unique<Setup>();
  s->net = bench::reference_network(model);
  auto x = s->graph.input("x", {batch, 1, 28, 28});
  auto y = s->graph.input("y", {batch}, kiln::i32);
  s->loss = kiln::softmax_cross_entropy(s->net(x), y);
  (void)kiln::train_step(s->loss, s->net.parameters(),
                         kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
  kiln::Rng rng(2);
  s->images.resize(static_cast<std::size_t>(batch) * 784);
  s->labels.resize(static_cast<std::size_t>(batch));
  for (float& v : s->images) v = rng.uniform(-0.4f, 2.8f);
  for (auto& l : s->labels) l = static_cast<std::int32_t>(rng.below(10));
  return s;
}

int run(const std::string& model, const std::string& device, std::vector<int> thread_counts,
        int batch, int rounds, int steps, const std::string& json_path) {
  const kiln::tools::JsonOutput json(json_path);
  auto setup = make_step(model, batch);
  const kiln::Backend& backend = kiln::backend_named(device);
  // A GPU runs the step on one stream: one executor.
  if (device != "cpu") thread_counts = {1};
  std::vector<kiln::Executor> exes;
  for (int t : thread_counts) {
    exes.push_back(kiln::compile(setup->graph, backend, {.threads = t}));
    exes.back().set_input("x", setup->images);
    exes.back().set_input("y", setup->labels);
    exes.back().run(); // warm-up
  }
  const bench::Timing timing = bench::time_alternately(exes, rounds, steps);

  double flops = 0.0; // of one step, as every op's definition counts them
  for (const kiln::PlanStep& s : exes[0].plan().steps) flops += kiln::step_flops(s);
  const double gflop = flops * 1e-9;
  const std::string& target = exes[0].plan().target.isa;
  std::printf("%s training step on %s, batch %d, target %s, %d rounds x %d steps\n", model.c_str(),
              device.c_str(), batch, target.c_str(), rounds, steps);
  std::printf("%-8s %12s %22s %12s %10s %9s %11s\n", "threads", "ms/step", "min..max", "images/s",
              "GFLOP/s", "speedup", "efficiency");
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k = 0; k < exes.size(); ++k) {
    const bench::Spread& t = timing.per_executor[k];
    // Against the first thread count: speedup, and the share of the ideal (linear) speedup.
    const double speedup = timing.speedup(k, 0);
    const double efficiency = speedup * thread_counts[0] / static_cast<double>(thread_counts[k]);
    std::printf("%-8d %12.2f %10.2f..%-10.2f %12.0f %10.1f %8.2fx %10.0f%%\n", thread_counts[k],
                t.median, t.min, t.max, 1000.0 * batch / t.median, gflop / (t.median / 1000.0),
                speedup, 100.0 * efficiency);
    rows.push_back({{"threads", thread_counts[k]},
                    {"ms_per_step", t.median},
                    {"min", t.min},
                    {"max", t.max},
                    {"speedup", speedup},
                    {"efficiency", efficiency}});
  }
  bench::print_neighbours(timing);
  json.write({{"benchmark", "step_bench"},
              {"network", model},
              {"device", device},
              {"batch", batch},
              {"target", target},
              {"build_type", KILN_BUILD_TYPE},
              {"results", rows},
              {"other_cores_busy", timing.other_cores},
              {"core_distance", bench::core_distance_json(timing)}});
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times a reference network's training step on several thread counts, "
               "alternately in one run, or on the GPU.",
               "step_bench");
  bench::StepFlags flags;
  flags.rounds = 7;
  flags.steps = 10;
  bench::add_step_flags(app, flags, /*threads_flag=*/false);
  std::string model = "mnist_cnn", device = "cpu";
  std::vector<int> thread_counts{1, 2};
  app.add_option("-t,--threads", thread_counts,
                 "thread counts to time, comma-separated (e.g. 1,2,4,8,16); the first is the "
                 "baseline of the speedup column")
      ->delimiter(',')
      ->check(kiln::tools::integer_in(1, 1024));
  bench::add_model_flag(app, model);
  app.add_option(
         "--device", device,
         "where the steps run: cpu (on each --threads count), or cuda in a build with kiln's "
         "CUDA backend")
      ->check(kiln::tools::one_of({"cpu", "cuda"}, "device"));
  return kiln::tools::run(app, argc, argv, [&] {
    return run(model, device, thread_counts, flags.batch, flags.rounds, flags.steps, flags.json);
  });
}
