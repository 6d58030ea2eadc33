// Pass tests: the pipeline's switches and report, fusion IR before/after in text form,
// fusion reasons, and whole training steps with every pass on against every pass off.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

using kiln::Shape;
using kiln::Value;

/// Every optimisation off (each pass of the pipeline, each lowering switch): the plan runs
/// the graph as autodiff built it.
std::vector<std::string> every_optimisation() {
  std::vector<std::string> names;
  for (const kiln::Pass& p : kiln::default_pipeline) names.emplace_back(p.name);
  for (const kiln::LoweringSwitch& s : kiln::lowering_switches) names.emplace_back(s.name);
  return names;
}
const std::vector<std::string> all_off = every_optimisation();

kiln::FusionReason reason_for(const kiln::CompileReport& report, const std::string& producer_op,
                              const std::string& consumer_op) {
  for (const kiln::FusionDecision& d : report.fusion)
    if (d.producer_op == producer_op && d.consumer_op == consumer_op) return d.reason;
  FAIL("no decision for " << producer_op << " -> " << consumer_op);
  return kiln::FusionReason::fused;
}

} // namespace

TEST_CASE("fuse_elementwise: a bias-add-relu-scale chain becomes one node (IR before and after)") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto b = g.param("b", std::make_shared<kiln::Tensor>(Shape{3}));
  g.mark_output(kiln::mul_scalar(kiln::relu(x + b), 2.0f));
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = param \"b\" : f32[3]\n"
                            "%2 = add(%0, %1) : f32[2,3]\n"
                            "%3 = relu(%2) : f32[2,3]\n"
                            "%4 = mul_scalar(%3) {value=2} : f32[2,3]\n"
                            "outputs: %4\n");
  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::fuse_elementwise(g, ctx);
  CHECK(r.changed);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = param \"b\" : f32[3]\n"
                            "%2 = fused_elementwise(%0, %1) {t0=add(in0, in1); t1=relu(t0); "
                            "t2=mul_scalar(t1, 2)} : f32[2,3]\n"
                            "outputs: %2\n");
  kiln::verify(g);
}

TEST_CASE("fuse_elementwise: every rejection carries its reason") {
  kiln::Graph g;
  auto x = g.input("x", {4, 8});
  auto w = g.param("w", std::make_shared<kiln::Tensor>(Shape{8, 8}));
  auto small = g.input("s", {8});
  auto shared = kiln::exp(x);                       // read by two nodes outside one chain
  auto a = kiln::relu(kiln::matmul(x, w) + shared); // matmul: an anchor, not elementwise
  auto bcast = kiln::neg(small);                    // [8] broadcast into [4,8]
  auto c = kiln::square(shared) * bcast;
  auto out = kiln::log(kiln::add_scalar(kiln::square(a), 1.0f));
  g.mark_output(out);
  g.mark_output(a);
  g.mark_output(c);
  kiln::PassContext ctx;
  (void)kiln::fuse_elementwise(g, ctx);
  const auto& report = ctx.report;
  CHECK(reason_for(report, "matmul", "add") == kiln::FusionReason::not_fusable);
  CHECK(reason_for(report, "exp", "add") == kiln::FusionReason::several_consumers);
  CHECK(reason_for(report, "neg", "mul") == kiln::FusionReason::would_duplicate_work);
  CHECK(reason_for(report, "relu", "square") == kiln::FusionReason::graph_output);
  CHECK(reason_for(report, "square", "add_scalar") == kiln::FusionReason::fused);
  CHECK(kiln::fusion_reason_name(kiln::FusionReason::several_consumers) == "several_consumers");
}

TEST_CASE("fuse_elementwise: an SGD update becomes one kernel that stores the momentum") {
  auto w = std::make_shared<kiln::Tensor>(Shape{5});
  auto c = std::make_shared<kiln::Tensor>(Shape{5});
  for (int i = 0; i < 5; ++i)
    c->f32()[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i) - 1.0f;
  kiln::Graph g;
  auto loss = kiln::sum(g.param("w", w) * g.param("c", c));
  (void)kiln::train_step(loss, {{"w", w}}, kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f});
  std::ostringstream ir;
  auto exe = kiln::compile(g, {.threads = 1, .dump_ir = &ir});
  CHECK(ir.str().find("; store t") != std::string::npos);
  CHECK(exe.report().pass("fuse_elementwise")->stats.size() == 3); // groups, nodes, assigns
  CHECK(exe.plan().assigns_in_place == 1);                         // w's own assign
  // Three runs with the fused update against the formula, w starting at 0.
  std::vector<double> ref_w(5, 0.0), v(5, 0.0);
  for (int step = 0; step < 3; ++step) {
    exe.run();
    for (std::size_t i = 0; i < 5; ++i) {
      v[i] = 0.9 * v[i] + c->f32()[i];
      ref_w[i] -= 0.1 * v[i];
      CHECK(w->f32()[i] == doctest::Approx(ref_w[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("pipeline: switches by name, unknown names rejected, IR dumped after each pass") {
  kiln::Graph g;
  auto x = g.input("x", {2, 2});
  g.mark_output(kiln::relu(kiln::neg(x)));
  std::ostringstream dump;
  auto exe = kiln::compile(g, {.threads = 1, .disable = {"dce"}, .dump_ir = &dump});
  CHECK(!exe.report().pass("dce")->ran);
  CHECK(exe.report().pass("fuse_elementwise")->ran);
  CHECK(exe.report().pass("fuse_elementwise")->nodes_before == 3);
  CHECK(exe.report().pass("fuse_elementwise")->nodes_after == 2);
  CHECK(dump.str().find("// after fuse_elementwise\n%0 = input") != std::string::npos);
  CHECK(dump.str().find("// after dce") == std::string::npos);
  try {
    (void)kiln::compile(g, {.threads = 1, .disable = {"fuse_elementwsie"}});
    FAIL("an unknown pass name was accepted");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.api.argument");
    CHECK(std::string(e.what()).find("no pass named 'fuse_elementwsie'") != std::string::npos);
  }
}

TEST_CASE("default MNIST CNN: fusion cuts kernels to <= 60%, planned memory is <= 50% of naive") {
  kiln::nn::manual_seed(1);
  auto net = kiln::nn::models::mnist_cnn();
  kiln::Graph g;
  auto x = g.input("x", {64, 1, 28, 28});
  auto y = g.input("y", {64}, kiln::i32);
  (void)kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                         kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
  const auto fused = kiln::compile(g, {.threads = 1});
  const auto unfused =
      kiln::compile(g, {.threads = 1, .disable = {"fuse_elementwise", "fuse_epilogue"}});
  const kiln::Plan& plan = fused.plan();
  MESSAGE("kernels per step: " << plan.steps.size() << " fused, " << unfused.plan().steps.size()
                               << " unfused; arena " << plan.memory.arena_bytes << " bytes, "
                               << plan.memory.naive_bytes << " unshared, " << plan.unoptimised_bytes
                               << " unoptimised");
  CHECK(plan.steps.size() * 10 <= unfused.plan().steps.size() * 6);
  // Against the compiled step's own buffers each kept separately (what planning alone
  // saves), and against every value of the step as built, each in its own buffer.
  CHECK(plan.memory.arena_bytes * 2 <= plan.memory.naive_bytes);
  CHECK(plan.memory.arena_bytes * 4 <= plan.unoptimised_bytes);
  CHECK(!kiln::find_overlap(fused.plan().buffers, fused.plan().memory));
}

TEST_CASE("every pass on vs every pass off: the same losses on three networks") {
  const std::pair<const char*, kiln::nn::Sequential (*)()> nets[] = {
      {"mnist_cnn", &kiln::nn::models::mnist_cnn},
      {"lenet5", &kiln::nn::models::lenet5},
      {"small_resnet", &kiln::nn::models::small_resnet}};
  kiln::Rng rng(3);
  std::vector<float> images(16 * 784);
  std::vector<std::int32_t> labels(16);
  for (float& v : images) v = rng.uniform(-0.5f, 2.5f);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
  for (const auto& [name, make] : nets) {
    CAPTURE(name);
    std::vector<float> losses[2];
    for (int config = 0; config < 2; ++config) {
      kiln::nn::manual_seed(4);
      kiln::nn::Sequential net = make();
      kiln::Graph g;
      auto x = g.input("x", {16, 1, 28, 28});
      auto y = g.input("y", {16}, kiln::i32);
      auto loss = kiln::softmax_cross_entropy(net(x), y);
      (void)kiln::train_step(loss, net.parameters(),
                             kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
      auto exe = kiln::compile(
          g, {.threads = 2, .disable = config == 0 ? std::vector<std::string>{} : all_off});
      CHECK(!kiln::find_overlap(exe.plan().buffers, exe.plan().memory));
      exe.set_input("x", images);
      exe.set_input("y", labels);
      for (int step = 0; step < 4; ++step) {
        exe.run();
        losses[config].push_back(exe.scalar(loss));
      }
    }
    // Same seed, same data: fused and unfused steps agree up to float reassociation.
    for (std::size_t i = 0; i < losses[0].size(); ++i)
      CHECK(losses[0][i] == doctest::Approx(losses[1][i]).epsilon(1e-4));
    CHECK(losses[0].back() < losses[0].front());
  }
}

TEST_CASE("dot: the optimised graph draws each fused kernel as a cluster, with its stores") {
  auto w = std::make_shared<kiln::Tensor>(Shape{4});
  kiln::Graph g;
  auto x = g.input("x", {4});
  auto loss = kiln::sum(kiln::relu(x * g.param("w", w)));
  (void)kiln::train_step(loss, {{"w", w}}, kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f});
  const auto exe = kiln::compile(g, {.threads = 1});
  const std::string dot = kiln::to_dot(*exe.report().optimised);
  CHECK(dot.find("subgraph cluster_n") != std::string::npos);
  CHECK(dot.find("fillcolor=\"#fff4d6\"") != std::string::npos);
  CHECK(dot.find("[style=dashed, label=\"store\"]") != std::string::npos);
}

TEST_CASE("equivalent lerp forms a+(b-a)*w and a*(1-w)+b*w end in the same number of kernels") {
  const auto kernels = [](bool expanded) {
    kiln::Graph g;
    auto a = g.input("a", {8, 16});
    auto b = g.input("b", {8, 16});
    auto w = g.input("w", {8, 16});
    auto one_minus_w = kiln::add_scalar(kiln::neg(w), 1.0f);
    g.mark_output(expanded ? a * one_minus_w + b * w : a + (b - a) * w);
    const auto exe = kiln::compile(g, {.threads = 1});
    return exe.plan().steps.size();
  };
  CHECK(kernels(false) == 1);
  CHECK(kernels(true) == 1);
}
