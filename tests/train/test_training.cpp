// Training tests: optimizers against their formulas, loss falls on real learning problems,
// train/eval modes, thread-count independence.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kiln/kiln.hpp"
#include "support/skip.hpp"

namespace {

using kiln::Shape;
using kiln::Value;

/// Two Gaussian-ish blobs per class in 2-D, 4 classes: learnable by a small MLP.
void make_blobs(std::vector<float>& x, std::vector<std::int32_t>& y, int n, std::uint64_t seed) {
  kiln::Rng rng(seed);
  x.resize(static_cast<std::size_t>(n) * 2);
  y.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng.below(4));
    y[static_cast<std::size_t>(i)] = c;
    x[static_cast<std::size_t>(2 * i)] = (c % 2 ? 1.0f : -1.0f) + rng.uniform(-0.4f, 0.4f);
    x[static_cast<std::size_t>(2 * i + 1)] = (c / 2 ? 1.0f : -1.0f) + rng.uniform(-0.4f, 0.4f);
  }
}

/// loss = sum(w * c): its gradient is c whatever w is, so updates follow the formulas exactly.
struct LinearProblem {
  std::shared_ptr<kiln::Tensor> w = std::make_shared<kiln::Tensor>(Shape{3});
  std::shared_ptr<kiln::Tensor> c = std::make_shared<kiln::Tensor>(Shape{3});
  LinearProblem() {
    const float w0[] = {0.5f, -1.0f, 2.0f}, c0[] = {1.0f, -2.0f, 0.25f};
    for (int i = 0; i < 3; ++i)
      w->f32()[static_cast<std::size_t>(i)] = w0[i], c->f32()[static_cast<std::size_t>(i)] = c0[i];
  }
  template <class Opt> kiln::Executor compile(kiln::Graph& g, const Opt& opt) {
    const Value loss = kiln::sum(g.param("w", w) * g.param("c", c));
    (void)kiln::train_step(loss, {{"w", w}}, opt);
    return kiln::compile(g, {.threads = 1});
  }
};

} // namespace

TEST_CASE("SGD with momentum and weight decay follows PyTorch's update") {
  LinearProblem p;
  kiln::Graph g;
  auto exe = p.compile(g, kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
  std::vector<double> w(p.w->f32().begin(), p.w->f32().end()), v(3, 0.0);
  for (int step = 0; step < 3; ++step) {
    exe.run();
    for (std::size_t i = 0; i < 3; ++i) {
      const double grad = p.c->f32()[i] + 0.01 * w[i];
      v[i] = 0.9 * v[i] + grad;
      w[i] -= 0.1 * v[i];
      CHECK(p.w->f32()[i] == doctest::Approx(w[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("Adam follows its update with bias correction") {
  LinearProblem p;
  kiln::Graph g;
  auto exe = p.compile(g, kiln::optim::Adam{.lr = 0.05f});
  std::vector<double> w(p.w->f32().begin(), p.w->f32().end()), m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 4; ++t) {
    exe.run();
    for (std::size_t i = 0; i < 3; ++i) {
      const double grad = p.c->f32()[i];
      m[i] = 0.9 * m[i] + 0.1 * grad;
      v[i] = 0.999 * v[i] + 0.001 * grad * grad;
      const double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.999, t));
      w[i] -= 0.05 * mhat / (std::sqrt(vhat) + 1e-8);
      CHECK(p.w->f32()[i] == doctest::Approx(w[i]).epsilon(1e-4));
    }
  }
}

TEST_CASE("an MLP learns 4 blobs with SGD and with Adam, and its eval graph shares the weights") {
  std::vector<float> xs;
  std::vector<std::int32_t> ys;
  make_blobs(xs, ys, 64, 3);
  for (int use_adam = 0; use_adam < 2; ++use_adam) {
    CAPTURE(use_adam);
    kiln::nn::manual_seed(4);
    kiln::nn::Sequential net{kiln::nn::Linear(2, 16), kiln::nn::ReLU(), kiln::nn::Linear(16, 4)};
    kiln::Graph g;
    auto x = g.input("x", {64, 2});
    auto y = g.input("y", {64}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    if (use_adam)
      (void)kiln::train_step(loss, net.parameters(), kiln::optim::Adam{.lr = 0.02f});
    else
      (void)kiln::train_step(loss, net.parameters(),
                             kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = 2});
    exe.set_input("x", xs);
    exe.set_input("y", ys);
    exe.run();
    const float first = exe.scalar(loss);
    for (int i = 0; i < 60; ++i) exe.run();
    const float last = exe.scalar(loss);
    CHECK(first > 1.0f);
    CHECK(last < 0.2f * first);

    net.eval();
    kiln::Graph eval;
    auto ex = eval.input("x", {64, 2});
    auto logits = net(ex);
    eval.mark_output(logits);
    auto eval_exe = kiln::compile(eval, {.threads = 1});
    eval_exe.set_input("x", xs);
    eval_exe.run();
    int correct = 0;
    const auto out = eval_exe.output(logits);
    for (std::size_t i = 0; i < 64; ++i) {
      const auto row = out.subspan(i * 4, 4);
      correct += std::max_element(row.begin(), row.end()) - row.begin() == ys[i];
    }
    CHECK(correct >= 60);
  }
}

TEST_CASE("a small CNN with batchnorm and dropout: loss falls, running stats move, eval is "
          "deterministic") {
  kiln::nn::manual_seed(5);
  kiln::nn::BatchNorm2d* bn = nullptr;
  kiln::nn::Sequential net{
      kiln::nn::Conv2d(1, 4, 3, 1, 1), kiln::nn::BatchNorm2d(4), kiln::nn::ReLU(),
      kiln::nn::MaxPool2d(2),          kiln::nn::Dropout(0.2f),  kiln::nn::Flatten(),
      kiln::nn::Linear(4 * 4 * 4, 2)};
  bn = dynamic_cast<kiln::nn::BatchNorm2d*>(&net[1]);
  REQUIRE(bn != nullptr);
  // Class 1 images are bright in the top half, class 0 in the bottom half.
  std::vector<float> xs(16 * 64);
  std::vector<std::int32_t> ys(16);
  kiln::Rng rng(6);
  for (int n = 0; n < 16; ++n) {
    ys[static_cast<std::size_t>(n)] = n % 2;
    for (int i = 0; i < 64; ++i)
      xs[static_cast<std::size_t>(n * 64 + i)] =
          rng.uniform(0.0f, 0.3f) + ((i < 32) == (n % 2 == 1) ? 0.7f : 0.0f);
  }
  kiln::Graph g;
  auto x = g.input("x", {16, 1, 8, 8});
  auto y = g.input("y", {16}, kiln::i32);
  auto loss = kiln::softmax_cross_entropy(net(x), y);
  (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
  auto exe = kiln::compile(g, {.threads = 2});
  exe.set_input("x", xs);
  exe.set_input("y", ys);
  exe.run();
  const float first = exe.scalar(loss);
  for (int i = 0; i < 30; ++i) exe.run();
  CHECK(exe.scalar(loss) < 0.5f * first);
  const auto running_var = bn->buffers()[1].tensor->f32();
  CHECK(running_var[0] != 1.0f);

  net.eval();
  kiln::Graph eval;
  auto ex = eval.input("x", {16, 1, 8, 8});
  auto logits = net(ex);
  eval.mark_output(logits);
  auto e = kiln::compile(eval, {.threads = 1});
  e.set_input("x", xs);
  e.run();
  const std::vector<float> once(e.output(logits).begin(), e.output(logits).end());
  e.run();
  CHECK(std::equal(once.begin(), once.end(), e.output(logits).begin()));
  CHECK(kiln::to_text(eval).find("dropout") == std::string::npos);
}

TEST_CASE("one and two threads compute the same training step") {
  std::vector<float> losses[2];
  for (int threads = 1; threads <= 2; ++threads) {
    kiln::nn::manual_seed(7);
    kiln::nn::Sequential net{kiln::nn::Conv2d(1, 8, 3), kiln::nn::ReLU(), kiln::nn::MaxPool2d(2),
                             kiln::nn::Flatten(), kiln::nn::Linear(8 * 13 * 13, 10)};
    kiln::Graph g;
    auto x = g.input("x", {32, 1, 28, 28});
    auto y = g.input("y", {32}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = threads});
    kiln::Rng rng(8);
    std::vector<float> xs(32 * 784);
    std::vector<std::int32_t> ys(32);
    for (float& v : xs) v = rng.uniform(0.0f, 1.0f);
    for (auto& v : ys) v = static_cast<std::int32_t>(rng.below(10));
    exe.set_input("x", xs);
    exe.set_input("y", ys);
    for (int i = 0; i < 5; ++i) {
      exe.run();
      losses[threads - 1].push_back(exe.scalar(loss));
    }
  }
  for (std::size_t i = 0; i < losses[0].size(); ++i)
    CHECK(losses[0][i] == doctest::Approx(losses[1][i]).epsilon(1e-4));
}

TEST_CASE("a training step with Precision::bf16 follows the FP32 one, its convolutions and "
          "matmuls multiplying in bfloat16") {
  if (!kiln::cpu_backend().target().bf16_products) {
    kiln::test::skip("this CPU has no AVX512-BF16, so no kernel multiplies in bfloat16");
    return;
  }
  std::vector<float> losses[2];
  int bf16_kernels[2] = {0, 0};
  for (const kiln::Precision precision : {kiln::Precision::f32, kiln::Precision::bf16}) {
    const auto k = static_cast<std::size_t>(precision);
    kiln::nn::manual_seed(11);
    kiln::nn::Sequential net = kiln::nn::models::mnist_cnn();
    kiln::Graph g;
    auto x = g.input("x", {16, 1, 28, 28});
    auto y = g.input("y", {16}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = 2, .precision = precision});
    for (const kiln::PlanStep& s : exe.plan().steps)
      bf16_kernels[k] += s.kernel_name.ends_with(".bf16") ? 1 : 0;
    kiln::Rng rng(12);
    std::vector<float> xs(16 * 784);
    std::vector<std::int32_t> ys(16);
    for (float& v : xs) v = rng.uniform(0.0f, 1.0f);
    for (auto& v : ys) v = static_cast<std::int32_t>(rng.below(10));
    exe.set_input("x", xs);
    exe.set_input("y", ys);
    for (int i = 0; i < 6; ++i) {
      exe.run();
      losses[k].push_back(exe.scalar(loss));
    }
  }
  CHECK(bf16_kernels[0] == 0);
  // The second convolution, both its gradients, and the two linear layers' products.
  CHECK(bf16_kernels[1] >= 7);
  for (std::size_t i = 0; i < losses[0].size(); ++i) {
    INFO("step " << i);
    CHECK(losses[1][i] == doctest::Approx(losses[0][i]).epsilon(2e-2));
  }
  CHECK(losses[1].back() < 0.95f * losses[1].front()); // it learns the batch
}

TEST_CASE("the learning rate can change between runs without recompiling") {
  LinearProblem p;
  kiln::Graph g;
  const Value loss = kiln::sum(g.param("w", p.w) * g.param("c", p.c));
  const kiln::TrainStep step = kiln::train_step(loss, {{"w", p.w}}, kiln::optim::SGD{.lr = 0.1f});
  auto exe = kiln::compile(g, {.threads = 1});
  const float w0 = p.w->f32()[0];
  exe.run();
  CHECK(p.w->f32()[0] == doctest::Approx(w0 - 0.1f * 1.0f));
  step.set_learning_rate(0.5f);
  CHECK(step.learning_rate() == 0.5f);
  exe.run();
  CHECK(p.w->f32()[0] == doctest::Approx(w0 - 0.1f - 0.5f));
  CHECK_THROWS_AS(step.set_learning_rate(-1.0f), kiln::Error);
}
