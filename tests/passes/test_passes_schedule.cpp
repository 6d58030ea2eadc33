// The scheduling pass: IR before and after in text form, param updates kept after every read
// of the old value, and the memory it lets lowering share.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::Shape;
using kiln::test::random_inputs;

} // namespace

TEST_CASE("schedule: each reduction runs as soon as its input is ready, freeing it") {
  kiln::Graph g;
  auto x = g.input("x", {1024});
  auto a = kiln::exp(x);
  auto b = kiln::log(x);
  g.mark_output(kiln::sum(a));
  g.mark_output(kiln::sum(b));
  CHECK(kiln::to_text(g) == R"(%0 = input "x" : f32[1024]
%1 = exp(%0) : f32[1024]
%2 = log(%0) : f32[1024]
%3 = sum_to(%1) {shape=[1]} : f32[1]
%4 = reshape(%3) {shape=[]} : f32[]
%5 = sum_to(%2) {shape=[1]} : f32[1]
%6 = reshape(%5) {shape=[]} : f32[]
outputs: %4 %6
)");
  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::schedule_for_memory(g, ctx);
  CHECK(r.changed);
  CHECK(kiln::to_text(g) == R"(%0 = input "x" : f32[1024]
%1 = exp(%0) : f32[1024]
%2 = sum_to(%1) {shape=[1]} : f32[1]
%3 = reshape(%2) {shape=[]} : f32[]
%4 = log(%0) : f32[1024]
%5 = sum_to(%4) {shape=[1]} : f32[1]
%6 = reshape(%5) {shape=[]} : f32[]
outputs: %3 %6
)");
  // Already in its best order: unchanged.
  CHECK_FALSE(kiln::schedule_for_memory(g, ctx).changed);
}

TEST_CASE("schedule: a param's update waits for every read of its old value") {
  // u = exp(x) * w frees exp(x), so it would run before exp(w) if only its inputs counted;
  // then exp(w) would read w between u and the assign, and u could not be computed straight
  // into w. Both stay where they are, and the update happens in place.
  kiln::Graph g;
  auto x = g.input("x", {256});
  const auto w_tensor = kiln::test::random_tensor(Shape{256}, 1);
  auto w = g.param("w", w_tensor);
  auto big = kiln::exp(x);
  auto read = kiln::exp(w) + x;
  (void)kiln::assign(w, big * w);
  g.mark_output(read);
  const std::string before = kiln::to_text(g);
  CHECK(before == R"(%0 = input "x" : f32[256]
%1 = param "w" : f32[256]
%2 = exp(%0) : f32[256]
%3 = exp(%1) : f32[256]
%4 = add(%3, %0) : f32[256]
%5 = mul(%2, %1) : f32[256]
%6 = assign(%1, %5) : f32[256]
outputs: %4
)");
  kiln::PassContext ctx;
  CHECK_FALSE(kiln::schedule_for_memory(g, ctx).changed);
  CHECK(kiln::to_text(g) == before);

  const std::vector<float> w0(w_tensor->f32().begin(), w_tensor->f32().end());
  auto exe = kiln::compile(g, {.threads = 1});
  CHECK(exe.plan().assigns_in_place == 1);
  const std::vector<float> xs = random_inputs(256, 3);
  exe.set_input("x", xs);
  exe.run();
  const auto out = exe.output(read);
  const auto w1 = w_tensor->f32();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CHECK(out[i] == doctest::Approx(std::exp(w0[i]) + xs[i]));
    CHECK(w1[i] == doctest::Approx(std::exp(xs[i]) * w0[i]));
  }
}

TEST_CASE("schedule + staged epilogue: an input gradient overwrites the activation its relu "
          "mask reads, in either layout") {
  for (const bool channels_last : {true, false}) {
    CAPTURE(channels_last);
    std::vector<std::vector<float>> grads[2];
    for (int inplace = 0; inplace < 2; ++inplace) {
      kiln::nn::manual_seed(5);
      kiln::nn::Sequential net{kiln::nn::Conv2d(1, 16, 3, 1, 1),
                               kiln::nn::ReLU(),
                               kiln::nn::Conv2d(16, 16, 3, 1, 1),
                               kiln::nn::ReLU(),
                               kiln::nn::Flatten(),
                               kiln::nn::Linear(16 * 12 * 12, 3)};
      kiln::Graph g;
      // Activations (2 x 16 x 12 x 12) larger than conv2's weight gradient, so that the
      // schedule runs that gradient first and the activation dies at the input gradient.
      auto x = g.input("x", {2, 1, 12, 12});
      auto y = g.input("y", {2}, kiln::i32);
      auto loss = kiln::softmax_cross_entropy(net(x), y);
      std::vector<kiln::Value> params;
      for (const kiln::nn::Parameter& p : net.parameters())
        params.push_back(g.param(p.name, p.tensor));
      const auto dw = kiln::gradients(loss, params);
      for (const kiln::Value& d : dw) g.mark_output(d);
      std::vector<std::string> disable;
      if (!channels_last) disable.emplace_back("layout");
      if (inplace == 0) disable.emplace_back("inplace");
      auto exe = kiln::compile(g, {.threads = 2, .disable = disable});
      CHECK(!kiln::find_overlap(exe.plan().buffers, exe.plan().memory));
      int overwrites = 0;
      for (const kiln::PlanStep& s : exe.plan().steps)
        if (s.op == kiln::Op::Conv2dGradInput && s.num_inputs == 3)
          overwrites += s.output.offset == s.inputs[2].offset;
      CHECK(overwrites == inplace);
      exe.set_input("x", random_inputs(2 * 144, 7));
      exe.set_input("y", std::vector<std::int32_t>{2, 0});
      exe.run();
      for (const kiln::Value& d : dw) {
        const auto o = exe.output(d);
        grads[inplace].emplace_back(o.begin(), o.end());
      }
    }
    for (std::size_t k = 0; k < grads[0].size(); ++k)
      for (std::size_t i = 0; i < grads[0][k].size(); ++i)
        CHECK(grads[1][k][i] == doctest::Approx(grads[0][k][i]).epsilon(1e-5).scale(1e-6));
  }
}
