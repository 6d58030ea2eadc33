// Anchor + epilogue fusion, loss fusion and the pool-mask rewrite: IR before and after in
// text form, the reasons recorded, and fused results against the graph compiled without them.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::random_inputs;
using kiln::test::random_tensor;
using kiln::test::with_and_without;

using kiln::Shape;
using kiln::Value;

void check_close(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5).scale(1.0));
  }
}

} // namespace

TEST_CASE("fuse_epilogue: conv2d + bias + relu becomes one conv2d node (IR before and after)") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3, 6, 6});
  auto w = g.param("w", std::make_shared<kiln::Tensor>(Shape{4, 3, 3, 3}));
  auto b = g.param("b", std::make_shared<kiln::Tensor>(Shape{4}));
  auto conv = kiln::conv2d(x, w, {});
  auto bias = kiln::reshape(b, Shape{1, 4, 1, 1});
  g.mark_output(kiln::relu(conv + bias));
  kiln::PassContext ctx;
  (void)kiln::fuse_elementwise(g, ctx);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3,6,6]\n"
                            "%1 = param \"w\" : f32[4,3,3,3]\n"
                            "%2 = param \"b\" : f32[4]\n"
                            "%3 = conv2d(%0, %1) {stride=1x1, pad=0x0} : f32[2,4,4,4]\n"
                            "%4 = reshape(%2) {shape=[1,4,1,1]} : f32[1,4,1,1]\n"
                            "%5 = fused_elementwise(%3, %4) {t0=add(in0, in1); t1=relu(t0)} : "
                            "f32[2,4,4,4]\n"
                            "outputs: %5\n");
  const kiln::PassResult r = kiln::fuse_epilogue(g, ctx);
  CHECK(r.changed);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3,6,6]\n"
                            "%1 = param \"w\" : f32[4,3,3,3]\n"
                            "%2 = param \"b\" : f32[4]\n"
                            "%3 = reshape(%2) {shape=[1,4,1,1]} : f32[1,4,1,1]\n"
                            "%4 = conv2d(%0, %1, %3) {stride=1x1, pad=0x0; epilogue "
                            "t0=add(acc, in2); t1=relu(t0)} : f32[2,4,4,4]\n"
                            "outputs: %4\n");
  kiln::verify(g);
  CHECK(ctx.report.fusion.back().reason == kiln::FusionReason::fused);
  CHECK(ctx.report.fusion.back().producer_op == "conv2d");
  CHECK(ctx.report.fusion.back().consumer_op == "fused_elementwise");
  CHECK(ctx.report.fusion.back().pass == "fuse_epilogue");
}

TEST_CASE("fuse_epilogue: rejections carry their reasons") {
  kiln::Graph g;
  auto x = g.input("x", {4, 8});
  auto w = g.param("w", std::make_shared<kiln::Tensor>(Shape{8, 8}));
  auto shared = kiln::matmul(x, w);                                 // read by relu and by exp
  auto out = kiln::matmul(x, w, false, true);                       // a graph output itself
  auto pair = kiln::matmul(w, w) + kiln::matmul(w, w, true, false); // two anchors, one add
  g.mark_output(kiln::relu(shared) + kiln::exp(shared));
  g.mark_output(out);
  g.mark_output(kiln::neg(out));
  g.mark_output(pair);
  kiln::PassContext ctx;
  (void)kiln::fuse_epilogue(g, ctx);
  std::vector<kiln::FusionReason> reasons;
  for (const auto& d : ctx.report.fusion) reasons.push_back(d.reason);
  const auto count = [&](kiln::FusionReason r) {
    return std::count(reasons.begin(), reasons.end(), r);
  };
  CHECK(count(kiln::FusionReason::several_consumers) == 2); // shared, into relu and into exp
  CHECK(count(kiln::FusionReason::graph_output) == 1);      // out, into neg
  CHECK(count(kiln::FusionReason::fused) == 1);             // the first of the pair
  CHECK(count(kiln::FusionReason::consumer_taken) == 1);    // the second of the pair
  kiln::verify(g);
}

TEST_CASE("fuse_epilogue: conv2d + bias + relu, ragged batch and channels, matches unfused") {
  kiln::Graph g;
  auto x = g.input("x", {3, 5, 9, 7});
  auto w = g.param("w", random_tensor(Shape{7, 5, 3, 3}, 1));
  auto b = g.param("b", random_tensor(Shape{7}, 2));
  auto y = kiln::relu(kiln::conv2d(x, w, {.stride = 1, .padding = 1}) +
                      kiln::reshape(b, Shape{1, 7, 1, 1}));
  g.mark_output(y);
  const auto [fused, plain] = with_and_without(g, y, "fuse_epilogue");
  check_close(fused, plain);
}

TEST_CASE("fuse_epilogue: conv2d + residual add (two epilogue inputs) matches unfused") {
  kiln::Graph g;
  auto x = g.input("x", {2, 4, 8, 8});
  auto w = g.param("w", random_tensor(Shape{4, 4, 3, 3}, 3));
  auto b = g.param("b", random_tensor(Shape{4}, 4));
  auto y = kiln::relu(kiln::conv2d(x, w, {.stride = 1, .padding = 1}) +
                      kiln::reshape(b, Shape{1, 4, 1, 1}) + x);
  g.mark_output(y);
  const auto [fused, plain] = with_and_without(g, y, "fuse_epilogue");
  check_close(fused, plain);
}

TEST_CASE("fuse_epilogue: matmul + bias + relu on ragged tiles, 1 and 2 threads, matches unfused") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    kiln::Graph g;
    auto x = g.input("x", {37, 300});
    auto w = g.param("w", random_tensor(Shape{53, 300}, 5));
    auto b = g.param("b", random_tensor(Shape{53}, 6));
    auto y = kiln::relu(kiln::matmul(x, w, false, true) + b);
    g.mark_output(y);
    const auto [fused, plain] = with_and_without(g, y, "fuse_epilogue", threads);
    check_close(fused, plain);
  }
}

TEST_CASE("fuse_epilogue: the relu mask runs in conv2d_grad_input, the update in the weight "
          "gradient, and training matches the unfused step") {
  std::vector<float> losses[2];
  std::vector<float> weights[2];
  for (int off = 0; off < 2; ++off) {
    kiln::nn::manual_seed(7);
    kiln::nn::Sequential net{
        kiln::nn::Conv2d(2, 4, 3), kiln::nn::ReLU(),    kiln::nn::Conv2d(4, 4, 3, 1, 1),
        kiln::nn::ReLU(),          kiln::nn::Flatten(), kiln::nn::Linear(4 * 6 * 6, 5)};
    kiln::Graph g;
    auto x = g.input("x", {3, 2, 8, 8});
    auto y = g.input("y", {3}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f});
    auto exe = kiln::compile(g, {.threads = 2,
                                 .disable = off ? std::vector<std::string>{"fuse_epilogue"}
                                                : std::vector<std::string>{}});
    if (!off) {
      const kiln::PassRecord* r = exe.report().pass("fuse_epilogue");
      const auto stat = [&](const std::string& name) {
        for (const auto& [k, v] : r->stats)
          if (k == name) return v;
        return std::int64_t{0};
      };
      CHECK(stat("conv2d_grad_input_epilogues") == 1);  // the first relu's mask
      CHECK(stat("conv2d_grad_weight_epilogues") == 2); // both SGD updates
      CHECK(stat("assigns_absorbed") >= 2);
    }
    exe.set_input("x", random_inputs(3 * 2 * 8 * 8, 11));
    exe.set_input("y", std::vector<std::int32_t>{0, 3, 4});
    for (int step = 0; step < 3; ++step) {
      exe.run();
      losses[off].push_back(exe.scalar(loss));
    }
    const auto params = net.parameters();
    for (const auto& p : params)
      for (std::int64_t i = 0; i < p.tensor->numel(); ++i)
        weights[off].push_back(p.tensor->f32()[static_cast<std::size_t>(i)]);
  }
  check_close(losses[0], losses[1]);
  check_close(weights[0], weights[1]);
}

TEST_CASE("mask_through_pool: relu_grad after maxpool2d_grad moves onto the pooled gradient") {
  kiln::Graph g;
  auto a = g.input("a", {1, 2, 4, 4});
  auto dp = g.input("dp", {1, 2, 2, 2});
  auto p = kiln::max_pool2d(a, {});
  const kiln::Pool2dAttrs window = std::get<kiln::Pool2dAttrs>(p.node().attrs);
  auto da = kiln::relu_grad(a, kiln::max_pool2d_grad(a, dp, window));
  g.mark_output(p);
  g.mark_output(da);
  kiln::PassContext ctx;
  CHECK(kiln::move_masks_through_pools(g, ctx).changed);
  (void)kiln::eliminate_dead_nodes(g, ctx);
  CHECK(kiln::to_text(g) == "%0 = input \"a\" : f32[1,2,4,4]\n"
                            "%1 = input \"dp\" : f32[1,2,2,2]\n"
                            "%2 = maxpool2d(%0) {kernel=2, stride=2, pad=0} : f32[1,2,2,2]\n"
                            "%3 = relu_grad(%2, %1) : f32[1,2,2,2]\n"
                            "%4 = maxpool2d_grad(%0, %3) {kernel=2, stride=2, pad=0} : "
                            "f32[1,2,4,4]\n"
                            "outputs: %2 %4\n");
}

TEST_CASE("mask_through_pool: same gradients, and the pool gradient overwrites its input") {
  std::vector<float> grads[2];
  for (int off = 0; off < 2; ++off) {
    kiln::nn::manual_seed(9);
    kiln::nn::Sequential net{kiln::nn::Conv2d(1, 4, 3), kiln::nn::ReLU(), kiln::nn::MaxPool2d(2),
                             kiln::nn::Flatten(), kiln::nn::Linear(4 * 4 * 4, 3)};
    kiln::Graph g;
    auto x = g.input("x", {2, 1, 10, 10});
    auto y = g.input("y", {2}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    const auto params = net.parameters();
    const std::vector<Value> wrt = {g.param(params[0].name, params[0].tensor)};
    const std::vector<Value> dw = kiln::gradients(loss, wrt);
    g.mark_output(dw[0]);
    auto exe = kiln::compile(g, {.threads = 1,
                                 .disable = off ? std::vector<std::string>{"mask_through_pool"}
                                                : std::vector<std::string>{}});
    if (!off) {
      CHECK(exe.report().pass("mask_through_pool")->changed);
      // The pool gradient's output takes over the dying relu output's memory.
      bool overwrites = false;
      for (const kiln::PlanStep& s : exe.plan().steps)
        if (s.op == kiln::Op::MaxPool2dGrad) overwrites = s.output.offset == s.inputs[0].offset;
      CHECK(overwrites);
    }
    exe.set_input("x", random_inputs(2 * 100, 13));
    exe.set_input("y", std::vector<std::int32_t>{1, 2});
    exe.run();
    const auto o = exe.output(dw[0]);
    grads[off].assign(o.begin(), o.end());
  }
  check_close(grads[0], grads[1]);
}

TEST_CASE("dot: an anchor with an epilogue is drawn as one cluster opened by the anchor") {
  kiln::Graph g;
  auto x = g.input("x", {2, 8});
  auto w = g.param("w", random_tensor(Shape{8, 4}, 1));
  g.mark_output(kiln::relu(kiln::matmul(x, w)));
  const auto exe = kiln::compile(g, {.threads = 1});
  const std::string dot = kiln::to_dot(*exe.report().optimised);
  CHECK(dot.find("matmul + epilogue") != std::string::npos);
  CHECK(dot.find("_acc [label=\"matmul\"]") != std::string::npos);
  CHECK(dot.find("t0 relu") != std::string::npos);
}

TEST_CASE("fuse_epilogue: a whole Adam update runs in the weight gradient's epilogue") {
  std::vector<float> weights[2];
  for (int off = 0; off < 2; ++off) {
    kiln::nn::manual_seed(5);
    kiln::nn::Sequential net{kiln::nn::Conv2d(1, 3, 3), kiln::nn::ReLU(), kiln::nn::Flatten(),
                             kiln::nn::Linear(3 * 4 * 4, 4)};
    kiln::Graph g;
    auto x = g.input("x", {2, 1, 6, 6});
    auto y = g.input("y", {2}, kiln::i32);
    (void)kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                           kiln::optim::Adam{.lr = 0.01f});
    auto exe = kiln::compile(
        g, {.threads = 2,
            .disable = off ? std::vector<std::string>{"fuse_epilogue", "fuse_elementwise"}
                           : std::vector<std::string>{}});
    if (!off) {
      // Moment m, moment v and the weight: three stores in the gradient's own kernel.
      int stores = 0;
      for (const kiln::Node& n : exe.report().optimised->nodes())
        if (n.op == kiln::Op::Conv2dGradWeight)
          stores = static_cast<int>(kiln::epilogue_of(n.attrs)->stores.size());
      CHECK(stores == 3);
    }
    exe.set_input("x", random_inputs(2 * 36, 17));
    exe.set_input("y", std::vector<std::int32_t>{1, 3});
    for (int step = 0; step < 3; ++step) exe.run();
    for (const auto& p : net.parameters())
      for (std::int64_t i = 0; i < p.tensor->numel(); ++i)
        weights[off].push_back(p.tensor->f32()[static_cast<std::size_t>(i)]);
  }
  check_close(weights[0], weights[1]);
}

TEST_CASE("fuse_loss: the loss and its gradient become one kernel (IR before and after)") {
  kiln::Graph g;
  auto logits = g.input("x", {2, 3});
  auto labels = g.input("y", {2}, kiln::i32);
  auto loss = kiln::softmax_cross_entropy(logits, labels);
  auto seed = kiln::append(g, kiln::Op::Fill, {}, kiln::FillAttrs{1.0f, Shape{}});
  auto grad = kiln::softmax_cross_entropy_grad(logits, labels, seed);
  g.mark_output(loss);
  g.mark_output(kiln::relu(grad));
  kiln::PassContext ctx;
  CHECK(kiln::fuse_loss(g, ctx).changed);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = input \"y\" {classes=3} : i32[2]\n"
                            "%2 = fill {value=1, shape=[]} : f32[]\n"
                            "%3 = softmax_cross_entropy_with_grad(%0, %1, %2) : f32[7]\n"
                            "%4 = part(%3) {offset=0, shape=[2,3]} : f32[2,3]\n"
                            "%5 = part(%3) {offset=6, shape=[]} : f32[]\n"
                            "%6 = relu(%4) : f32[2,3]\n"
                            "outputs: %5 %6\n");
  kiln::verify(g);
  REQUIRE(ctx.report.fusion.size() == 1);
  CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::fused);
}

TEST_CASE("fuse_loss: a loss read before its gradient exists stays separate, with a reason") {
  kiln::Graph g;
  auto logits = g.input("x", {2, 3});
  auto labels = g.input("y", {2}, kiln::i32);
  auto loss = kiln::softmax_cross_entropy(logits, labels);
  auto grad = kiln::softmax_cross_entropy_grad(logits, labels, kiln::mul_scalar(loss, 2.0f));
  g.mark_output(grad);
  kiln::PassContext ctx;
  CHECK(!kiln::fuse_loss(g, ctx).changed);
  REQUIRE(ctx.report.fusion.size() == 1);
  CHECK(ctx.report.fusion[0].reason == kiln::FusionReason::read_too_early);
}

TEST_CASE("fuse_loss: same loss and gradient bits as the two separate kernels") {
  std::vector<float> results[2];
  for (int off = 0; off < 2; ++off) {
    kiln::Graph g;
    auto logits = g.input("x", {37, 10});
    auto labels = g.input("y", {37}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(logits, labels);
    const std::vector<Value> wrt = {logits};
    const Value grad = kiln::gradients(loss, wrt)[0];
    g.mark_output(loss);
    g.mark_output(grad);
    auto exe = kiln::compile(
        g, {.threads = 2,
            .disable = off ? std::vector<std::string>{"fuse_loss"} : std::vector<std::string>{}});
    if (!off) CHECK(exe.report().pass("fuse_loss")->changed);
    exe.set_input("x", random_inputs(370, 21));
    std::vector<std::int32_t> y(37);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i * 7 % 10);
    exe.set_input("y", y);
    exe.run();
    results[off].push_back(exe.scalar(loss));
    const auto d = exe.output(grad);
    results[off].insert(results[off].end(), d.begin(), d.end());
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("fuse_epilogue: an anchor never stores into a param it reads itself") {
  std::vector<float> results[2];
  for (int off = 0; off < 2; ++off) {
    kiln::Graph g;
    auto w = g.param("w", random_tensor(Shape{96, 96}, 23));
    auto x = g.input("x", {96, 96});
    // w = relu(w · x): the matmul reads w whole; a fused store would overwrite it tile by tile.
    (void)kiln::append(g, kiln::Op::Assign, {w.id, kiln::relu(kiln::matmul(w, x)).id});
    auto exe = kiln::compile(g, {.threads = 2,
                                 .disable = off ? std::vector<std::string>{"fuse_epilogue"}
                                                : std::vector<std::string>{}});
    if (!off) {
      bool hazard = false;
      for (const auto& d : exe.report().fusion)
        hazard = hazard || d.reason == kiln::FusionReason::state_hazard;
      CHECK(hazard);
    }
    exe.set_input("x", random_inputs(96 * 96, 29));
    exe.run();
    const auto* p = std::get_if<kiln::ParamAttrs>(&g.node(w.id).attrs);
    const auto values = p->tensor->f32();
    results[off].assign(values.begin(), values.end());
  }
  check_close(results[0], results[1]);
}
