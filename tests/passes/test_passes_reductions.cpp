// Reduction fusion: a sum takes in the elementwise chain only it reads (IR before and after),
// the reasons recorded where it cannot, and the fused sums against the graph compiled without.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::Shape;
using kiln::Value;
using kiln::test::cpu_context;
using kiln::test::random_inputs;
using kiln::test::with_and_without;

} // namespace

TEST_CASE("fuse_reductions: a batchnorm's variance sums the centred square as it computes it") {
  kiln::Graph g;
  auto x = g.input("x", {4, 3, 5, 5});
  auto mean = g.input("mean", {1, 3, 1, 1});
  g.mark_output(kiln::sum_to(kiln::square(x - mean), Shape{1, 3, 1, 1}));
  kiln::PassContext ctx = cpu_context();
  (void)kiln::fuse_elementwise(g, ctx);
  const kiln::PassResult r = kiln::fuse_reductions(g, ctx);
  CHECK(r.changed);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[4,3,5,5]\n"
                            "%1 = input \"mean\" : f32[1,3,1,1]\n"
                            "%2 = fused_sum_to(%0, %1) {t0=sub(in0, in1); t1=square(t0); "
                            "over [4,3,5,5]} : f32[1,3,1,1]\n"
                            "outputs: %2\n");
  kiln::verify(g);
  REQUIRE(!ctx.report.fusion.empty());
  CHECK(ctx.report.fusion.back().pass == "fuse_reductions");
  CHECK(ctx.report.fusion.back().reason == kiln::FusionReason::fused);
  CHECK(ctx.report.fusion.back().consumer_op == "sum_to");
}

TEST_CASE("fuse_reductions: a chain read elsewhere, a graph output, a shape without a kernel") {
  SUBCASE("several consumers") {
    kiln::Graph g;
    auto x = g.input("x", {4, 8});
    auto y = kiln::relu(x);
    g.mark_output(kiln::sum_to(y, Shape{1, 8}));
    g.mark_output(kiln::relu(y) + x);
    kiln::PassContext ctx = cpu_context();
    CHECK(!kiln::fuse_reductions(g, ctx).changed);
    REQUIRE(ctx.report.fusion.size() == 1);
    CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::several_consumers);
  }
  SUBCASE("graph output") {
    kiln::Graph g;
    auto x = g.input("x", {4, 8});
    auto y = kiln::relu(x);
    g.mark_output(y);
    g.mark_output(kiln::sum_to(y, Shape{1, 8}));
    kiln::PassContext ctx = cpu_context();
    CHECK(!kiln::fuse_reductions(g, ctx).changed);
    REQUIRE(ctx.report.fusion.size() == 1);
    CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::graph_output);
  }
  SUBCASE("the CPU kernel sums no kept axes outside the innermost run") {
    kiln::Graph g;
    auto x = g.input("x", {4, 6, 8});
    g.mark_output(kiln::sum_to(kiln::relu(x), Shape{4, 1, 8}));
    kiln::PassContext ctx = cpu_context();
    CHECK(!kiln::fuse_reductions(g, ctx).changed);
    REQUIRE(ctx.report.fusion.size() == 1);
    CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::no_kernel);
  }
  SUBCASE("a target without kernel selection fuses nothing") {
    kiln::Graph g;
    auto x = g.input("x", {4, 8});
    g.mark_output(kiln::sum_to(kiln::relu(x), Shape{1, 8}));
    kiln::PassContext ctx;
    CHECK(!kiln::fuse_reductions(g, ctx).changed);
    REQUIRE(ctx.report.fusion.size() == 1);
    CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::no_kernel);
  }
}

TEST_CASE("fuse_reductions: fused sums equal the chain stored and then summed") {
  for (const auto& [shape, to] : std::vector<std::pair<Shape, Shape>>{
           {{6, 5, 7, 16}, {1, 1, 1, 16}}, // NHWC per channel: columns
           {{6, 16, 7, 5}, {1, 16, 1, 1}}, // NCHW per channel: runs
           {{9, 301}, {1, 1}}}) {          // everything
    CAPTURE(shape.str());
    kiln::Graph g;
    auto x = g.input("x", shape);
    const Value out = kiln::sum_to(kiln::square(kiln::add_scalar(kiln::relu(x), -0.25f)), to);
    g.mark_output(out);
    const auto [fused, plain] = with_and_without(g, out, "fuse_reductions");
    REQUIRE(fused.size() == plain.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
      CAPTURE(i);
      CHECK(fused[i] == doctest::Approx(plain[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("fuse_reductions: the small ResNet's batchnorms train the same with and without it") {
  std::vector<float> losses[2];
  for (int off = 0; off < 2; ++off) {
    kiln::nn::manual_seed(3);
    auto net = kiln::nn::models::small_resnet();
    kiln::Graph g;
    auto x = g.input("x", {8, 1, 28, 28});
    auto y = g.input("y", {8}, kiln::i32);
    const Value loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = 2,
                                 .disable = off ? std::vector<std::string>{"fuse_reductions"}
                                                : std::vector<std::string>{}});
    if (!off) {
      // Every batchnorm sums its centred square, and its gradient two products, fused.
      int fused = 0;
      for (const kiln::FusionDecision& d : exe.report().fusion)
        fused += d.pass == "fuse_reductions" && d.reason == kiln::FusionReason::fused;
      CHECK(fused >= 15);
    }
    exe.set_input("x", random_inputs(8 * 784, 5));
    std::vector<std::int32_t> labels(8);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
    exe.set_input("y", labels);
    for (int step = 0; step < 4; ++step) {
      exe.run();
      losses[off].push_back(exe.scalar(loss));
    }
  }
  for (std::size_t i = 0; i < losses[0].size(); ++i) {
    CAPTURE(i);
    CHECK(losses[0][i] == doctest::Approx(losses[1][i]).epsilon(1e-4));
  }
  CHECK(losses[0].back() < losses[0].front());
}
