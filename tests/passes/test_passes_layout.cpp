// The layout pass: IR before and after in text form, its decisions and reorders as
// recorded, and results with the pass against the graph compiled without it.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::cpu_context;
using kiln::test::random_tensor;
using kiln::test::with_and_without;

using kiln::Shape;
using kiln::Value;

} // namespace

TEST_CASE("layout: a conv-relu-conv-pool chain runs NHWC, reordered only at its edges "
          "(IR before and after)") {
  kiln::Graph g;
  auto x = g.input("x", {2, 1, 6, 6});
  auto w1 = g.param("w1", random_tensor({16, 1, 3, 3}, 1));
  auto b1 = g.param("b1", random_tensor({16}, 2));
  auto w2 = g.param("w2", random_tensor({16, 16, 3, 3}, 3));
  auto a1 = kiln::relu(kiln::conv2d(x, w1, {}) + kiln::reshape(b1, Shape{1, 16, 1, 1}));
  auto a2 = kiln::relu(kiln::conv2d(a1, w2, {.padding = 1}));
  auto out = kiln::flatten(kiln::max_pool2d(a2, {.kernel = 2}));
  g.mark_output(out);
  kiln::PassContext ctx = cpu_context();
  const kiln::PassResult r = kiln::choose_layouts(g, ctx);
  CHECK(r.changed);
  // x has one channel, so its NHWC form is a reshape; the only activation reorder is the
  // pooled result's, read by flatten. Both weights are packed once.
  CHECK(kiln::to_text(g) == R"(%0 = input "x" : f32[2,1,6,6]
%1 = param "w1" : f32[16,1,3,3]
%2 = param "b1" : f32[16]
%3 = param "w2" : f32[16,16,3,3]
%4 = reshape(%2) {shape=[1,16,1,1]} : f32[1,16,1,1]
%5 = reshape(%0) {shape=[2,6,6,1]} : f32[2,6,6,1]
%6 = transpose(%1) {perm=[2,3,1,0]} : f32[3,3,1,16]
%7 = conv2d(%5, %6) {stride=1x1, pad=0x0, nhwc} : f32[2,4,4,16]
%8 = reshape(%4) {shape=[1,1,1,16]} : f32[1,1,1,16]
%9 = add(%7, %8) : f32[2,4,4,16]
%10 = relu(%9) : f32[2,4,4,16]
%11 = transpose(%3) {perm=[2,3,1,0]} : f32[3,3,16,16]
%12 = conv2d(%10, %11) {stride=1x1, pad=1x1, nhwc} : f32[2,4,4,16]
%13 = relu(%12) : f32[2,4,4,16]
%14 = maxpool2d(%13) {kernel=2, stride=2, pad=0, nhwc} : f32[2,2,2,16]
%15 = transpose(%14) {perm=[0,3,1,2]} : f32[2,16,2,2]
%16 = reshape(%15) {shape=[2,64]} : f32[2,64]
outputs: %16
)");
  // Three groups: x; conv1's output through bias and relu; conv2's output through the pool.
  REQUIRE(ctx.report.layouts.size() == 3);
  for (const kiln::LayoutDecision& d : ctx.report.layouts) {
    CHECK(d.layout == "NHWC");
    CHECK(d.reason == kiln::LayoutReason::channels_last);
    CHECK(d.saved_bytes > d.reorder_bytes);
  }
  REQUIRE(ctx.report.transforms.size() == 3);
  CHECK(ctx.report.transforms[0].to == "HWIO");
  CHECK(ctx.report.transforms[1].to == "HWIO");
  CHECK(ctx.report.transforms[2].from == "NHWC");
  CHECK(ctx.report.transforms[2].to == "NCHW");
  CHECK(ctx.report.transforms[2].elements == 2 * 16 * 2 * 2);
}

TEST_CASE("layout: reasons recorded: ineligible convolutions, and reorders that cost more") {
  SUBCASE("6 output channels have no channels-last kernel") {
    kiln::Graph g;
    auto x = g.input("x", {2, 1, 8, 8});
    auto w = g.param("w", random_tensor({6, 1, 5, 5}, 1));
    g.mark_output(kiln::relu(kiln::conv2d(x, w, {})));
    kiln::PassContext ctx = cpu_context();
    CHECK_FALSE(kiln::choose_layouts(g, ctx).changed);
    REQUIRE(ctx.report.layouts.size() == 2);
    for (const kiln::LayoutDecision& d : ctx.report.layouts) {
      CHECK(d.layout == "NCHW");
      CHECK(d.reason == kiln::LayoutReason::not_eligible);
    }
    CHECK(ctx.report.transforms.empty());
  }
  SUBCASE("a target without channels-last kernels keeps every group NCHW") {
    kiln::Graph g;
    auto x = g.input("x", {2, 16, 8, 8});
    auto w = g.param("w", random_tensor({16, 16, 3, 3}, 1));
    g.mark_output(kiln::relu(kiln::conv2d(x, w, {.padding = 1})));
    kiln::PassContext ctx; // the default Target describes NCHW kernels only
    CHECK_FALSE(kiln::choose_layouts(g, ctx).changed);
    REQUIRE(ctx.report.layouts.size() == 2);
    for (const kiln::LayoutDecision& d : ctx.report.layouts)
      CHECK(d.reason == kiln::LayoutReason::not_eligible);
    kiln::PassContext cpu = cpu_context();
    CHECK(kiln::choose_layouts(g, cpu).changed); // the same graph goes NHWC on the CPU
  }
  SUBCASE("a 1x1 convolution between a graph input and a graph output saves less than it costs") {
    // Its column matrix is the input itself: reading x in place saves 2 x 4 bytes per input
    // element, exactly what reordering x costs, and reordering the output costs more again.
    kiln::Graph g;
    auto x = g.input("x", {2, 16, 5, 5});
    auto w = g.param("w", random_tensor({16, 16, 1, 1}, 1));
    g.mark_output(kiln::conv2d(x, w, {}));
    kiln::PassContext ctx = cpu_context();
    CHECK_FALSE(kiln::choose_layouts(g, ctx).changed);
    REQUIRE(ctx.report.layouts.size() == 2);
    for (const kiln::LayoutDecision& d : ctx.report.layouts) {
      CHECK(d.layout == "NCHW");
      CHECK(d.reason == kiln::LayoutReason::reorders_cost_more);
      CHECK(d.saved_bytes <= d.reorder_bytes);
    }
  }
}

TEST_CASE("layout: NHWC results equal NCHW ones, forward and a training step's gradients") {
  SUBCASE("an NHWC value that is a graph output is read back as NCHW") {
    kiln::Graph g;
    auto x = g.input("x", {3, 16, 7, 7});
    auto w = g.param("w", random_tensor({32, 16, 3, 3}, 1));
    auto b = g.param("b", random_tensor({32}, 2));
    auto y = kiln::relu(kiln::conv2d(x, w, {.padding = 1}) + kiln::reshape(b, Shape{1, 32, 1, 1}));
    g.mark_output(y);
    // Without the Winograd domain, whose F(4x4, 3x3) rounds differently from a direct sum
    // (test_passes_winograd.cpp compares the two).
    const auto [with, without] = with_and_without(g, y, "layout", 2, {"winograd"});
    REQUIRE(with.size() == without.size());
    for (std::size_t i = 0; i < with.size(); ++i)
      CHECK(with[i] == doctest::Approx(without[i]).epsilon(1e-5).scale(1.0));
  }
  SUBCASE("the weight gradients and updated weights of a conv net with padding and pools") {
    kiln::nn::manual_seed(3);
    kiln::nn::Sequential net{kiln::nn::Conv2d(1, 16, 3, 1, 1),
                             kiln::nn::ReLU(),
                             kiln::nn::Conv2d(16, 32, 3, 1, 1),
                             kiln::nn::ReLU(),
                             kiln::nn::MaxPool2d(2),
                             kiln::nn::Flatten(),
                             kiln::nn::Linear(32 * 4 * 4, 10)};
    kiln::Graph g;
    auto x = g.input("x", {4, 1, 8, 8});
    auto labels = g.input("y", {4}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), labels);
    std::vector<Value> params;
    for (const kiln::nn::Parameter& p : net.parameters())
      params.push_back(g.param(p.name, p.tensor));
    const auto grads = kiln::gradients(loss, params);
    for (const Value& gr : grads) g.mark_output(gr);
    std::vector<std::vector<float>> results[2];
    for (int off = 0; off < 2; ++off) {
      auto exe = kiln::compile(
          g, {.threads = 2,
              .disable = off ? std::vector<std::string>{"layout"} : std::vector<std::string>{}});
      if (!off) CHECK(exe.report().pass("layout")->changed);
      std::vector<float> xs(4 * 64);
      kiln::Rng rng(5);
      for (float& v : xs) v = rng.uniform(-1.0f, 1.0f);
      exe.set_input("x", xs);
      exe.set_input("y", std::vector<std::int32_t>{1, 4, 9, 0});
      exe.run();
      for (const Value& gr : grads) {
        const auto o = exe.output(gr);
        results[off].emplace_back(o.begin(), o.end());
      }
    }
    for (std::size_t k = 0; k < grads.size(); ++k) {
      CAPTURE(k);
      REQUIRE(results[0][k].size() == results[1][k].size());
      for (std::size_t i = 0; i < results[0][k].size(); ++i)
        CHECK(results[0][k][i] == doctest::Approx(results[1][k][i]).epsilon(1e-4).scale(1e-3));
    }
  }
}

TEST_CASE("fold_reorders: LeNet-5's reorders fold into its average pools, with the same losses") {
  const std::vector<float> images = kiln::test::random_inputs(16 * 784, 8);
  std::vector<std::int32_t> labels(16);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  std::vector<float> losses[2];
  for (int off = 0; off < 2; ++off) {
    kiln::nn::manual_seed(4);
    kiln::nn::Sequential net = kiln::nn::models::lenet5();
    kiln::Graph g;
    auto x = g.input("x", {16, 1, 28, 28});
    auto y = g.input("y", {16}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = 2,
                                 .disable = off ? std::vector<std::string>{"fold_reorders"}
                                                : std::vector<std::string>{}});
    int activation_reorders = 0, folded = 0;
    for (const kiln::PlanStep& s : exe.plan().steps)
      activation_reorders += s.op == kiln::Op::Transpose && s.output.shape[0] == 16;
    for (const kiln::LayoutTransform& t : exe.report().transforms)
      if (!t.folded_into.empty()) {
        ++folded;
        CHECK(t.folded_into.starts_with("avgpool2d"));
      }
    // The four reorders at the pools: pool 1's result and the gradient that reaches it,
    // conv 2's activations into pool 2 and their gradient.
    CHECK(activation_reorders == (off ? 4 : 0));
    CHECK(folded == (off ? 0 : 4));
    if (!off) CHECK(exe.report().pass("fold_reorders")->changed);
    exe.set_input("x", images);
    exe.set_input("y", labels);
    for (int step = 0; step < 4; ++step) {
      exe.run();
      losses[off].push_back(exe.scalar(loss));
    }
  }
  // The pools sum as the NCHW kernels do: the same losses, bit for bit.
  CHECK(losses[0] == losses[1]);
}

TEST_CASE("fold_reorders: a target without the folded pool's kernel keeps the reorder") {
  const auto build = [](kiln::Graph& g) {
    auto pooled = kiln::avg_pool2d(g.input("x", {2, 3, 8, 8}), {.kernel = 2});
    g.mark_output(kiln::transpose(pooled, {0, 2, 3, 1}));
  };
  kiln::PassContext ctx = cpu_context();
  kiln::Graph folded;
  build(folded);
  CHECK(kiln::fold_reorders(folded, ctx).changed);
  CHECK(kiln::to_text(folded) ==
        "%0 = input \"x\" : f32[2,3,8,8]\n"
        "%1 = avgpool2d(%0) {kernel=2, stride=2, pad=0, pooled nhwc} : f32[2,4,4,3]\n"
        "outputs: %1\n");
  ctx.target.has_kernel = [](const kiln::KernelQuery& q) {
    return !std::get<kiln::Pool2dAttrs>(*q.attrs).flip_pooled_layout;
  };
  kiln::Graph kept, original;
  build(kept);
  build(original);
  CHECK(!kiln::fold_reorders(kept, ctx).changed);
  CHECK(kiln::to_text(kept) == kiln::to_text(original));
}
