// A program outside kiln's tree, as a user writes it: trains a small MLP on two separable
// blobs and fails unless the loss falls. Built by each way of consuming kiln.
#include <cstdio>
#include <vector>

#include <kiln/kiln.hpp>

int main() try {
  constexpr int batch = 32;
  kiln::nn::manual_seed(1);
  kiln::nn::Sequential net{kiln::nn::Linear(2, 8), kiln::nn::ReLU(), kiln::nn::Linear(8, 2)};
  kiln::Graph g;
  auto x = g.input("x", {batch, 2});
  auto y = g.input("y", {batch}, kiln::i32);
  auto loss = kiln::softmax_cross_entropy(net(x), y);
  kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.1f});
  kiln::Executor step = kiln::compile(g, {.threads = 1});

  std::vector<float> points(batch * 2);
  std::vector<std::int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) {
    labels[i] = i % 2;
    points[2 * i] = labels[i] ? 1.0f + 0.01f * i : -1.0f - 0.01f * i;
    points[2 * i + 1] = 0.5f;
  }
  step.set_input("x", points);
  step.set_input("y", labels);
  float first = 0.0f, last = 0.0f;
  for (int s = 0; s < 50; ++s) {
    step.run();
    (s == 0 ? first : last) = step.scalar(loss);
  }
  std::printf("consumer: loss %.4f -> %.4f\n", first, last);
  return last < 0.5f * first ? 0 : 1;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
