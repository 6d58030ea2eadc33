// Tutorial step 2: a network from kiln::nn, its training step compiled once, trained, and
// evaluated by a second graph that shares its weights.
#include <cstdio>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

/// Four blobs in the plane, one per class: points spread uniformly around each centre.
void make_blobs(int count, std::vector<float>& points, std::vector<std::int32_t>& labels) {
  kiln::Rng rng(7);
  const float centres[4][2] = {{-2, -2}, {-2, 2}, {2, -2}, {2, 2}};
  points.resize(static_cast<std::size_t>(count) * 2);
  labels.resize(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    const int c = i % 4;
    labels[static_cast<std::size_t>(i)] = c;
    points[2 * static_cast<std::size_t>(i)] = centres[c][0] + rng.uniform(-1.5f, 1.5f);
    points[2 * static_cast<std::size_t>(i) + 1] = centres[c][1] + rng.uniform(-1.5f, 1.5f);
  }
}

} // namespace

int main() try {
  constexpr int batch = 64;
  kiln::nn::manual_seed(1);
  kiln::nn::Sequential net{kiln::nn::Linear(2, 32), kiln::nn::ReLU(), kiln::nn::Linear(32, 4)};

  // The training step: forward, loss, then train_step appends the backward pass and the
  // optimizer's update to the same graph, so one compiled plan does all three.
  kiln::Graph train_graph;
  kiln::Value x = train_graph.input("x", {batch, 2});
  kiln::Value y = train_graph.input("y", {batch}, kiln::i32);
  kiln::Value loss = kiln::softmax_cross_entropy(net(x), y);
  kiln::train_step(loss, net.parameters(), kiln::optim::Adam{.lr = 0.01f});
  kiln::Executor step = kiln::compile(train_graph, {.threads = 2});

  std::vector<float> points;
  std::vector<std::int32_t> labels;
  make_blobs(batch, points, labels);
  step.set_input("x", points);
  step.set_input("y", labels);
  for (int s = 1; s <= 200; ++s) {
    step.run();
    if (s == 1 || s % 50 == 0) std::printf("step %3d  loss %.4f\n", s, step.scalar(loss));
  }

  // Evaluation: the same modules in a graph of their own read the trained parameters.
  net.eval();
  kiln::Graph eval_graph;
  kiln::Value logits = net(eval_graph.input("x", {batch, 2}));
  eval_graph.mark_output(logits);
  kiln::Executor eval = kiln::compile(eval_graph, {.threads = 2});
  eval.set_input("x", points);
  eval.run();
  const std::int64_t correct = kiln::count_correct(eval.output(logits), labels, batch, 4);
  std::printf("accuracy %.1f%% on the points it trained on\n",
              100.0 * static_cast<double>(correct) / batch);
  return 0;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
