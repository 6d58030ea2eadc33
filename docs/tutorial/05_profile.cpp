// Tutorial step 5: where the time of a training step goes: per-kernel times against the
// machine's measured peak FLOP/s and copy bandwidth.
#include <cstdio>
#include <vector>

#include <kiln/kiln.hpp>

int main() try {
  constexpr int batch = 32;
  kiln::nn::manual_seed(1);
  kiln::nn::Sequential net = kiln::nn::models::lenet5();
  kiln::Graph g;
  kiln::Value x = g.input("x", {batch, 1, 28, 28});
  kiln::Value y = g.input("y", {batch}, kiln::i32);
  kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                   kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});

  // profile = true records every kernel's time; it costs a clock read per kernel.
  kiln::Executor step = kiln::compile(g, {.threads = 2, .profile = true});
  // The peak is measured on this machine, before the steps, with the plan's thread count.
  const kiln::MachinePeak peak = kiln::machine_peak(step.plan());

  kiln::Rng rng(1);
  std::vector<float> images(static_cast<std::size_t>(batch) * 28 * 28);
  std::vector<std::int32_t> labels(batch);
  for (float& v : images) v = rng.uniform(0.0f, 1.0f);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
  step.set_input("x", images);
  step.set_input("y", labels);
  for (int s = 0; s < 20; ++s) step.run();

  kiln::print_profile(stdout, step, peak, 8);
  return 0;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
