// step_bench: milliseconds per training step of the default MNIST CNN (batch 64) on 1 and
// 2 threads, measured alternately in one run; prints a table and writes JSON.
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

std::unique_ptr<Setup> make_step(int batch) {
  using namespace kiln::nn;
  manual_seed(1);
  auto s = std::make_unique<Setup>();
  s->net = models::mnist_cnn();
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

int run(int batch, int rounds, int steps, const std::string& json_path) {
  const kiln::tools::JsonOutput json(json_path);
  auto setup = make_step(batch);
  const int thread_counts[] = {1, 2};
  std::vector<kiln::Executor> exes;
  for (int t : thread_counts) {
    exes.push_back(kiln::compile(setup->graph, {.threads = t}));
    exes.back().set_input("x", setup->images);
    exes.back().set_input("y", setup->labels);
    exes.back().run(); // warm-up
  }
  const bench::Timing timing = bench::time_alternately(exes, rounds, steps);

  const double gflop = 4.58 * batch / 64.0; // 2·MACs forward + backward of this net, per step
  const std::string& target = exes[0].plan().target.isa;
  std::printf("default MNIST CNN training step, batch %d, target %s, %d rounds x %d steps\n", batch,
              target.c_str(), rounds, steps);
  std::printf("%-8s %12s %22s %12s %10s\n", "threads", "ms/step", "min..max", "images/s",
              "GFLOP/s");
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k = 0; k < exes.size(); ++k) {
    const bench::Spread& t = timing.per_executor[k];
    std::printf("%-8d %12.2f %10.2f..%-10.2f %12.0f %10.1f\n", thread_counts[k], t.median, t.min,
                t.max, 1000.0 * batch / t.median, gflop / (t.median / 1000.0));
    rows.push_back(
        {{"threads", thread_counts[k]}, {"ms_per_step", t.median}, {"min", t.min}, {"max", t.max}});
  }
  bench::print_neighbours(timing);
  json.write({{"benchmark", "step_bench"},
              {"network", "mnist_cnn"},
              {"batch", batch},
              {"target", target},
              {"build_type", KILN_BUILD_TYPE},
              {"results", rows},
              {"other_cores_busy", timing.other_cores}});
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times the default MNIST CNN's training step on 1 and 2 threads, alternately "
               "in one run.",
               "step_bench");
  bench::StepFlags flags;
  flags.rounds = 7;
  flags.steps = 10;
  bench::add_step_flags(app, flags, /*threads_flag=*/false);
  return kiln::tools::run(app, argc, argv,
                          [&] { return run(flags.batch, flags.rounds, flags.steps, flags.json); });
}
