// Same seed, same thread count, same bits: a training step's weight gradients are summed over
// a fixed split of the batch in a fixed order, so repeated runs agree bit for bit on any
// number of threads, whichever thread happens to take which image.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

struct Network {
  const char* name;
  kiln::nn::Sequential (*make)();
  std::int64_t side;
};

/// Every parameter and optimizer-state value after `steps` steps from the same start, one
/// executor run `repeats` times over.
std::vector<std::vector<float>> train_repeatedly(const Network& network, int threads,
                                                 const std::vector<std::string>& disable,
                                                 int repeats, int steps) {
  kiln::nn::manual_seed(5);
  kiln::nn::Sequential net = network.make();
  kiln::Graph g;
  const std::int64_t batch = 24;
  const auto x = g.input("x", {batch, 1, network.side, network.side});
  const auto y = g.input("y", {batch}, kiln::i32);
  const kiln::TrainStep step =
      kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                       kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
  const std::vector<kiln::nn::Parameter> state = kiln::training_state(net, step);
  std::vector<std::vector<float>> start;
  for (const auto& p : state) start.emplace_back(p.tensor->f32().begin(), p.tensor->f32().end());
  kiln::Executor exe = kiln::compile(g, {.threads = threads, .disable = disable});
  kiln::Rng rng(11);
  std::vector<float> images(static_cast<std::size_t>(batch * network.side * network.side));
  for (float& v : images) v = rng.uniform(-1.0f, 1.0f);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
  exe.set_input("x", images);
  exe.set_input("y", labels);
  std::vector<std::vector<float>> results;
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < state.size(); ++i)
      std::copy(start[i].begin(), start[i].end(), state[i].tensor->f32().begin());
    std::vector<float> all;
    for (int s = 0; s < steps; ++s) {
      exe.run();
      all.push_back(exe.scalar(step.loss));
    }
    for (const auto& p : state)
      all.insert(all.end(), p.tensor->f32().begin(), p.tensor->f32().end());
    results.push_back(std::move(all));
  }
  return results;
}

} // namespace

TEST_CASE("reproducible: repeated runs on 2, 3 and 4 threads give bit-identical losses, weights "
          "and momenta") {
  const Network networks[] = {{"mnist_cnn", &kiln::nn::models::mnist_cnn, 28},
                              {"small_resnet", &kiln::nn::models::small_resnet, 28}};
  const std::vector<std::vector<std::string>> layouts = {{}, {"layout"}};
  for (const Network& network : networks) {
    for (const auto& disable : layouts) {
      for (int threads = 2; threads <= 4; ++threads) {
        const std::string label = std::string(network.name) + ", " + std::to_string(threads) +
                                  " threads" + (disable.empty() ? "" : ", layout pass off");
        INFO(label);
        const auto results = train_repeatedly(network, threads, disable, 5, 2);
        for (std::size_t r = 1; r < results.size(); ++r) {
          INFO("repeat " << r);
          CHECK(results[r] == results[0]);
        }
      }
    }
  }
}
