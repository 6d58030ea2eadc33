// custom_trainer: the README's "write your own trainer" example, compiled so it cannot rot.
#include <cstdio>
#include <vector>

#include <kiln/kiln.hpp>
// Exactly one .cpp file of a program includes the CPU kernels.
#include <kiln/backends/cpu/implementation.hpp>

int main(int argc, char** argv) try {
  const char* dir = argc > 1 ? argv[1] : "data/mnist";
  const char* device = argc > 2 ? argv[2] : "cpu"; // "cuda" where kiln::cuda is linked
  auto train = kiln::data::load_mnist(dir, kiln::data::Split::train);

  // 1. Describe the network and the loss as a graph.
  using namespace kiln::nn;
  Sequential net{Conv2d(1, 16, 3), ReLU(), MaxPool2d(2), Flatten(), Linear(16 * 13 * 13, 10)};
  kiln::Graph g;
  auto x = g.input("x", {64, 1, 28, 28});
  auto y = g.input("y", {64}, kiln::i32);
  auto loss = kiln::softmax_cross_entropy(net(x), y);

  // 2. Append backward + optimizer update, and compile the whole step.
  kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
  kiln::Executor step = kiln::compile(g, kiln::backend_named(device), {.threads = 2});

  // 3. Feed batches and read the loss.
  kiln::data::BatchLoader batches(train, {.batch_size = 64,
                                          .seed = 1,
                                          .drop_last = true,
                                          .normalization = kiln::data::mnist_normalization});
  std::vector<float> images(batches.batch_image_elements());
  std::vector<std::int32_t> labels(64);
  for (std::int64_t b = 0; b < 100; ++b) {
    batches.fill(b, images, labels);
    step.set_input("x", images);
    step.set_input("y", labels);
    step.run();
    if (b % 20 == 19)
      std::printf("step %3lld  loss %.4f\n", static_cast<long long>(b + 1), step.scalar(loss));
  }
  return 0;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
