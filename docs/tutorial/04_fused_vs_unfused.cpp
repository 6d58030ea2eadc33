// Tutorial step 4: your own model compiled with every optimisation and with chosen ones
// switched off by name: the same losses, and the time each configuration takes, measured
// alternately so that both see the same machine.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

int main() try {
  constexpr int batch = 32;
  using namespace kiln::nn;
  manual_seed(3);
  Sequential net{Conv2d(1, 8, 3), ReLU(), MaxPool2d(2), Flatten(), Linear(8 * 13 * 13, 10)};
  kiln::Graph g;
  kiln::Value x = g.input("x", {batch, 1, 28, 28});
  kiln::Value y = g.input("y", {batch}, kiln::i32);
  kiln::Value loss = kiln::softmax_cross_entropy(net(x), y);
  kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.01f});

  struct Configuration {
    const char* name;
    std::vector<std::string> disable;
  };
  const Configuration configurations[] = {
      {"all passes", {}},
      {"fusion off", {"fuse_elementwise", "fuse_epilogue", "fuse_loss"}},
      {"all off", kiln::optimisation_names()}};

  kiln::Rng rng(1);
  std::vector<float> images(static_cast<std::size_t>(batch) * 28 * 28);
  std::vector<std::int32_t> labels(batch);
  for (float& v : images) v = rng.uniform(0.0f, 1.0f);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));

  std::vector<kiln::Executor> steps;
  for (const Configuration& c : configurations)
    steps.push_back(kiln::compile(g, {.threads = 1, .disable = c.disable}));

  // Every executor updates the same parameter tensors, so each first step starts from a copy
  // of the initial weights: their losses must then agree.
  std::vector<std::vector<float>> initial;
  for (const Parameter& p : net.parameters())
    initial.emplace_back(p.tensor->f32().begin(), p.tensor->f32().end());
  const auto restore = [&] {
    std::size_t i = 0;
    for (const Parameter& p : net.parameters())
      std::copy(initial[i].begin(), initial[i].end(), p.tensor->f32().begin()), ++i;
  };
  std::vector<double> seconds(steps.size(), 0.0);
  std::vector<float> first_loss(steps.size());
  for (int round = 0; round < 6; ++round)
    for (std::size_t k = 0; k < steps.size(); ++k) {
      if (round == 0) restore();
      steps[k].set_input("x", images);
      steps[k].set_input("y", labels);
      const auto t0 = std::chrono::steady_clock::now();
      steps[k].run();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round == 0)
        first_loss[k] = steps[k].scalar(loss); // the first run also warms the caches: untimed
      else
        seconds[k] += elapsed;
    }
  for (std::size_t k = 0; k < steps.size(); ++k)
    std::printf("%-11s %3zu kernels  %7.2f ms/step  first loss %.6f\n", configurations[k].name,
                steps[k].plan().steps.size(), 1000.0 * seconds[k] / 5,
                static_cast<double>(first_loss[k]));
  const bool same = std::abs(first_loss[0] - first_loss[2]) <= 1e-4f * std::abs(first_loss[2]);
  std::printf("same loss with and without the passes: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
