// The winograd pass: which convolutions it has multiply in the Winograd domain and why, the
// decisions that override it, and the gradients and losses with it against without it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

/// The MNIST CNN's training step at batch 8 with its gradients as outputs, seeded alike.
struct MnistStep {
  kiln::nn::Sequential net;
  kiln::Graph graph;
  kiln::Value loss;
  std::vector<kiln::Value> grads;

  MnistStep() {
    kiln::nn::manual_seed(7);
    net = kiln::nn::models::mnist_cnn();
    auto x = graph.input("x", {8, 1, 28, 28});
    auto y = graph.input("y", {8}, kiln::i32);
    loss = kiln::softmax_cross_entropy(net(x), y);
    std::vector<kiln::Value> params;
    for (const kiln::nn::Parameter& p : net.parameters())
      params.push_back(graph.param(p.name, p.tensor));
    grads = kiln::gradients(loss, params);
    for (const kiln::Value& g : grads) graph.mark_output(g);
    graph.mark_output(loss);
  }

  /// Every gradient, then the loss, of one run on a fixed batch.
  std::vector<std::vector<float>> run(kiln::Executor& exe) const {
    std::vector<float> images(8 * 784);
    kiln::Rng rng(8);
    for (float& v : images) v = rng.uniform(0.0f, 1.0f);
    exe.set_input("x", images);
    exe.set_input("y", std::vector<std::int32_t>{3, 1, 4, 1, 5, 9, 2, 6});
    exe.run();
    std::vector<std::vector<float>> out;
    for (const kiln::Value& g : grads) {
      const auto o = exe.output(g);
      out.emplace_back(o.begin(), o.end());
    }
    out.push_back({exe.scalar(loss)});
    return out;
  }
};

std::vector<std::string> winograd_kernels(const kiln::Executor& exe) {
  std::vector<std::string> names;
  for (const kiln::PlanStep& s : exe.plan().steps)
    if (s.kernel_name.ends_with(".winograd")) names.push_back(s.kernel_name);
  return names;
}

} // namespace

TEST_CASE("winograd: the MNIST CNN's 32->64 convolution and both its gradients multiply in the "
          "Winograd domain, the first convolution directly") {
  MnistStep step;
  kiln::Executor exe = kiln::compile(step.graph, {.threads = 2});
  std::vector<std::string> kernels = winograd_kernels(exe);
  std::sort(kernels.begin(), kernels.end());
  CHECK(kernels == std::vector<std::string>{"conv2d.winograd", "conv2d_grad_input.winograd",
                                            "conv2d_grad_weight.winograd"});
  // Weighed: the three that fit, each predicted faster. The 1->32 convolution and its weight
  // gradient read one input channel, not a whole vector of them, so neither is weighed.
  const std::vector<kiln::AlgorithmDecision>& decided = exe.report().algorithms;
  REQUIRE(decided.size() == 3);
  for (const kiln::AlgorithmDecision& d : decided) {
    CAPTURE(d.op);
    CHECK(d.algorithm == "winograd");
    CHECK(d.winograd_relative < 1.0 / kiln::winograd_required_gain);
    CHECK_FALSE(d.measured);
  }
  CHECK(exe.report().pass("winograd")->stats ==
        std::vector<std::pair<std::string, std::int64_t>>{{"winograd_convs", 3}});
}

TEST_CASE("winograd: off by name or by a decision, the convolutions run directly and the "
          "gradients and loss agree") {
  MnistStep step;
  kiln::Executor with = kiln::compile(step.graph, {.threads = 2});
  kiln::Executor off = kiln::compile(step.graph, {.threads = 2, .disable = {"winograd"}});
  CHECK(winograd_kernels(off).empty());
  const auto want = step.run(off);
  const auto got = step.run(with);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    REQUIRE(got[k].size() == want[k].size());
    // Winograd rounds differently: the worst difference, against the largest magnitude.
    float scale = 0.0f, worst = 0.0f;
    for (std::size_t i = 0; i < got[k].size(); ++i) {
      scale = std::max(scale, std::abs(want[k][i]));
      worst = std::max(worst, std::abs(got[k][i] - want[k][i]));
    }
    CHECK(scale > 0.0f);
    CHECK(worst <= 1e-4f * scale);
  }

  // A decision forcing one convolution direct leaves the others in the Winograd domain.
  kiln::PassContext ctx = kiln::test::cpu_context();
  const kiln::AlgorithmDecision first = with.report().algorithms.front();
  ctx.decisions.choices[kiln::algorithm_decision_key(first.node)] = "direct";
  const std::shared_ptr<kiln::Graph> copy = step.graph.clone();
  kiln::Graph& g = *copy;
  for (const kiln::Pass& p : kiln::default_pipeline) {
    if (p.name == "winograd") break;
    (void)p.run(g, ctx);
  }
  const kiln::PassResult r = kiln::choose_conv_algorithms(g, ctx);
  CHECK(r.stats == std::vector<std::pair<std::string, std::int64_t>>{{"winograd_convs", 2}});
  REQUIRE(ctx.report.algorithms.size() == 3);
  CHECK(ctx.report.algorithms.front().algorithm == "direct");
  CHECK(ctx.report.algorithms.front().measured);
  for (std::size_t i = 1; i < 3; ++i) CHECK(ctx.report.algorithms[i].algorithm == "winograd");
}

TEST_CASE("winograd: 5x5 kernels stay direct") {
  kiln::Graph g;
  auto x = g.input("x", {2, 1, 28, 28});
  kiln::nn::manual_seed(2);
  kiln::nn::Sequential lenet = kiln::nn::models::lenet5();
  g.mark_output(lenet(x));
  kiln::Executor exe = kiln::compile(g, {.threads = 2});
  CHECK(exe.report().algorithms.empty());
  CHECK(winograd_kernels(exe).empty());
}

TEST_CASE("winograd: a bfloat16 compilation weighs the Winograd kernel against the bf16 one") {
  // Where the CPU multiplies in bfloat16, the direct kernel of each 32->64 convolution is
  // predicted twice as fast as in FP32, so Winograd's predicted share doubles; elsewhere the
  // direct kernel stays FP32 and nothing changes.
  const auto decide = [](kiln::Precision precision) {
    kiln::PassContext ctx = kiln::test::cpu_context();
    ctx.precision = precision;
    MnistStep step;
    const std::shared_ptr<kiln::Graph> copy = step.graph.clone();
    kiln::Graph& mnist = *copy;
    for (const kiln::Pass& p : kiln::default_pipeline) {
      if (p.name == "winograd") break;
      (void)p.run(mnist, ctx);
    }
    (void)kiln::choose_conv_algorithms(mnist, ctx);
    return ctx.report.algorithms;
  };
  const auto f32 = decide(kiln::Precision::f32);
  const auto bf16 = decide(kiln::Precision::bf16);
  REQUIRE(f32.size() == 3);
  REQUIRE(bf16.size() == f32.size());
  const double factor = kiln::cpu::kernel_table().bf16_products ? 2.0 : 1.0;
  for (std::size_t i = 0; i < f32.size(); ++i) {
    CAPTURE(bf16[i].op);
    CHECK(bf16[i].node == f32[i].node);
    CHECK(bf16[i].winograd_relative == doctest::Approx(factor * f32[i].winograd_relative));
    CHECK((bf16[i].algorithm == "winograd") ==
          (bf16[i].winograd_relative * kiln::winograd_required_gain <= 1.0));
  }
}
