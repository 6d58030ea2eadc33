// IR tests: builder shape checks, the verifier, the text printer and DOT export, and every
// graph-level error code.
#include <doctest/doctest.h>

#include <string>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::error_code;
using kiln::test::error_message;

} // namespace

TEST_CASE("printer: a small graph prints in the stable text form") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto b = g.param("b", std::make_shared<kiln::Tensor>(kiln::Shape{3}));
  auto y = kiln::relu(x + b);
  g.mark_output(kiln::mul_scalar(y, 2.0f));
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = param \"b\" : f32[3]\n"
                            "%2 = add(%0, %1) : f32[2,3]\n"
                            "%3 = relu(%2) : f32[2,3]\n"
                            "%4 = mul_scalar(%3) {value=2} : f32[2,3]\n"
                            "outputs: %4\n");
}

TEST_CASE("printer: conv, pooling and matmul attributes are printed") {
  kiln::Graph g;
  auto x = g.input("x", {1, 1, 8, 8});
  auto w = g.param("w", std::make_shared<kiln::Tensor>(kiln::Shape{4, 1, 3, 3}));
  auto y = kiln::max_pool2d(kiln::conv2d(x, w, {.stride = 1, .padding = 1}), {.kernel = 2});
  auto flat = kiln::flatten(y);
  auto z = kiln::matmul(flat, g.param("l", std::make_shared<kiln::Tensor>(kiln::Shape{5, 64})),
                        false, true);
  const std::string text = kiln::to_text(g);
  CHECK(text.find("conv2d(%0, %1) {stride=1x1, pad=1x1} : f32[1,4,8,8]") != std::string::npos);
  CHECK(text.find("maxpool2d(%2) {kernel=2, stride=2, pad=0} : f32[1,4,4,4]") != std::string::npos);
  CHECK(text.find("reshape(%3) {shape=[1,64]} : f32[1,64]") != std::string::npos);
  CHECK(text.find("matmul(%4, %5) {a, tb} : f32[1,5]") != std::string::npos);
  CHECK(z.shape() == kiln::Shape{1, 5});
}

TEST_CASE("dot: export names every node and edge") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto y = kiln::relu(x);
  g.mark_output(y);
  const std::string dot = kiln::to_dot(g);
  CHECK(dot.rfind("digraph kiln {", 0) == 0);
  CHECK(dot.find("n0 [label=\"%0 input x\\nf32[2,3]\"") != std::string::npos);
  CHECK(dot.find("n0 -> n1;") != std::string::npos);
  CHECK(dot.find("#c8f0c8") != std::string::npos); // the output is highlighted
}

TEST_CASE("builder: a shape mismatch throws kiln.verify.shape naming the node") {
  kiln::Graph g;
  auto a = g.input("a", {64, 10});
  auto b = g.input("b", {64, 12});
  const std::string msg = error_message([&] { (void)(a + b); });
  CHECK(msg == "[kiln.verify.shape] node %2 add(%0:[64,10], %1:[64,12]): [64,10] vs [64,12] do not "
               "broadcast");
  CHECK(error_code([&] { (void)kiln::matmul(a, b); }) == "kiln.verify.shape");
  auto x = g.input("x", {8, 3, 28, 28});
  auto w = g.param("w", std::make_shared<kiln::Tensor>(kiln::Shape{16, 1, 3, 3}));
  CHECK(error_message([&] {
          (void)kiln::conv2d(x, w);
        }).find("conv2d(%2:[8,3,28,28], %3:[16,1,3,3])") != std::string::npos);
  CHECK(error_code([&] { (void)kiln::reshape(a, {7, -1}); }) == "kiln.verify.shape");
  CHECK(error_code([&] { (void)kiln::sum_to(a, {3}); }) == "kiln.verify.shape");
  CHECK(error_code([&] { (void)kiln::max_pool2d(a); }) == "kiln.verify.shape");
  kiln::nn::BatchNorm2d bn(4);
  CHECK(error_code([&] { (void)bn(x); }) == "kiln.verify.shape");
}

TEST_CASE("builder: dtype, arity and attribute errors have their own codes") {
  kiln::Graph g;
  auto logits = g.input("logits", {4, 10});
  auto float_labels = g.input("y", {4});
  CHECK(error_code([&] { (void)kiln::softmax_cross_entropy(logits, float_labels); }) ==
        "kiln.verify.dtype");
  CHECK(error_code([&] { (void)kiln::append(g, kiln::Op::Add, {logits.id}); }) ==
        "kiln.verify.arity");
  CHECK(error_code([&] { (void)kiln::append(g, kiln::Op::MulScalar, {logits.id}); }) ==
        "kiln.verify.attr");
  CHECK(error_code([&] {
          (void)kiln::max_pool2d(g.input("img", {1, 1, 4, 4}),
                                 {.kernel = 2, .stride = 0, .padding = 2});
        }) == "kiln.verify.attr");
  CHECK(error_code([&] { (void)kiln::dropout_mask(g, {4}, 1.0f, 0); }) == "kiln.verify.attr");
}

TEST_CASE("graph errors: bad inputs, assign targets, undifferentiable ops") {
  kiln::Graph g;
  auto x = g.input("x", {4});
  CHECK(error_code([&] { (void)kiln::append(g, kiln::Op::Relu, {5}); }) == "kiln.verify.graph");
  CHECK(error_code([&] { (void)kiln::assign(x, x); }) == "kiln.verify.graph");
  auto p = g.param("p", std::make_shared<kiln::Tensor>(kiln::Shape{4}));
  auto m = kiln::dropout_mask(g, {4}, 0.5f, 1);
  auto loss = kiln::sum(m * p);
  // The mask is not differentiable, but nothing asks for its gradient: fine.
  CHECK(kiln::gradients(loss, std::vector<kiln::Value>{p}).size() == 1);
  auto pooled = kiln::max_pool2d_grad(g.input("a", {1, 1, 2, 2}), g.input("b", {1, 1, 1, 1}),
                                      {2, 2, 0, 2, 2});
  auto q = g.param("q", std::make_shared<kiln::Tensor>(kiln::Shape{1, 1, 2, 2}));
  auto through =
      kiln::sum(kiln::max_pool2d_grad(q, g.input("c", {1, 1, 1, 1}), {2, 2, 0, 2, 2}) + pooled);
  CHECK(error_code([&] { (void)kiln::gradients(through, std::vector<kiln::Value>{q}); }) ==
        "kiln.verify.graph");
}

TEST_CASE("verifier: a corrupted graph is rejected at the corrupted node") {
  kiln::Graph g;
  auto x = g.input("x", {4, 4});
  auto y = kiln::relu(x);
  g.mark_output(y);
  kiln::verify(g);
  g.node(y.id).type.shape = kiln::Shape{4, 5};
  CHECK(error_message([&] { kiln::verify(g); }) ==
        "[kiln.verify.shape] node %1 relu: recorded type f32[4,5] but its inputs give f32[4,4]");
  g.node(y.id).type.shape = kiln::Shape{4, 4};
  g.outputs().push_back(9);
  CHECK(error_code([&] { kiln::verify(g); }) == "kiln.verify.graph");
}

TEST_CASE("verifier: reading a param after its assign is a hazard") {
  kiln::Graph g;
  auto p = g.param("p", std::make_shared<kiln::Tensor>(kiln::Shape{3}));
  (void)kiln::assign(p, kiln::add_scalar(p, 1.0f));
  (void)kiln::relu(p);
  CHECK(error_message([&] { kiln::verify(g); }).find("reads param %0 after it was assigned") !=
        std::string::npos);
}

TEST_CASE("api errors: unknown names, bad arguments, wrong feeds") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto y = g.input("y", {2}, kiln::i32);
  CHECK(error_code([&] { (void)g.input("x", {1}); }) == "kiln.api.argument");
  CHECK(error_code([&] { (void)g.find_input("nope"); }) == "kiln.api.not_found");
  CHECK(error_code([] { kiln::nn::Linear bad(0, 3); }) == "kiln.api.argument");
  CHECK(error_code([] { kiln::nn::Dropout bad(1.5f); }) == "kiln.api.argument");
  auto loss = kiln::softmax_cross_entropy(x, y);
  g.mark_output(loss);
  auto exe = kiln::compile(g, {.threads = 1});
  CHECK(error_code([&] { exe.set_input("z", std::vector<float>(6)); }) == "kiln.api.not_found");
  CHECK(error_code([&] { exe.set_input("x", std::vector<float>(5)); }) == "kiln.verify.shape");
  CHECK(error_code([&] { exe.set_input("x", std::vector<std::int32_t>(6)); }) ==
        "kiln.verify.dtype");
  const std::string msg = error_message([&] {
    exe.set_input("y", std::vector<std::int32_t>{1, 3});
  });
  CHECK(msg == "[kiln.data.label] input 'y': label 3 at index 1 is outside [0, 3)");
  CHECK(error_code([&] { (void)exe.output(x.id + 100); }) == "kiln.api.not_found");
  CHECK(error_code([&] { (void)exe.output(x); }) == "kiln.api.not_found");
}

TEST_CASE("nn: parameters are named by layer index, in the module and in the IR") {
  kiln::nn::Sequential inner{kiln::nn::Linear(4, 4), kiln::nn::ReLU()};
  kiln::nn::Sequential net{kiln::nn::Linear(2, 4), kiln::nn::ReLU()};
  net.add(std::make_shared<kiln::nn::Sequential>(std::move(inner)));
  std::vector<std::string> names;
  for (const auto& p : net.parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.0.weight", "2.0.bias"});
  kiln::Graph g;
  (void)net(g.input("x", {3, 2}));
  CHECK(kiln::to_text(g).find("param \"2.0.weight\" : f32[4,4]") != std::string::npos);
}

TEST_CASE("nn: a shape error names the layer and its Sequential entry as well as the node") {
  kiln::nn::Sequential net{kiln::nn::Conv2d(1, 4, 3), kiln::nn::ReLU(), kiln::nn::MaxPool2d(2),
                           kiln::nn::Flatten(), kiln::nn::Linear(2304, 10)};
  kiln::Graph g;
  const kiln::Value x = g.input("x", {8, 1, 28, 28});
  std::string code;
  const std::string message = error_message([&] {
    try {
      (void)net(x);
    } catch (const kiln::Error& e) {
      code = e.code();
      throw;
    }
  });
  CHECK(code == "kiln.verify.shape");
  // 4 channels of 13x13 after the pool: 676 features, not 2304.
  CHECK(message.find("in Sequential entry 4, Linear(2304 -> 10): ") != std::string::npos);
  CHECK(message.find("[8,676]") != std::string::npos);

  kiln::nn::Sequential outer{kiln::nn::Linear(3, 3), kiln::nn::ReLU()};
  outer.add(std::make_shared<kiln::nn::Sequential>(
      kiln::nn::Sequential{kiln::nn::Conv2d(2, 2, 3, 1, 1), kiln::nn::BatchNorm2d(2)}));
  kiln::Graph h;
  const std::string nested = error_message([&] { (void)outer(h.input("x", {2, 3})); });
  CHECK(nested.find("in Sequential entry 2, Sequential(2 layers): in Sequential entry 0, "
                    "Conv2d(2 -> 2, 3x3, stride 1, padding 1): ") != std::string::npos);
}
