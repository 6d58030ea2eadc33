// Misuse is an error, never silent: shapes checked where they enter, an executor run before its
// inputs were set, a Value of another graph, scalar() on a tensor, impossible thread counts,
// parameters the loss never reads, non-finite hyperparameters and losses.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

/// Runs `body` and returns the kiln::Error it throws (failing the case when it throws none).
template <class Body> kiln::Error error_of(Body&& body) {
  try {
    body();
  } catch (const kiln::Error& e) {
    return e;
  }
  FAIL("no kiln::Error was thrown");
  return kiln::Error("", "");
}

bool mentions(const kiln::Error& e, const std::string& text) {
  return e.message().find(text) != std::string::npos;
}

} // namespace

TEST_CASE("misuse: a dimension below 1 or a size past 2^62 bytes is refused where it enters") {
  kiln::Graph g;
  kiln::Error e = error_of([&] { (void)g.input("x", {-1, 1, 28, 28}); });
  CHECK(e.code() == "kiln.verify.shape");
  CHECK(mentions(e, "input 'x' has shape [-1,1,28,28]: dimension 0 is -1"));
  CHECK(error_of([&] { (void)g.input("y", {4, 0}); }).code() == "kiln.verify.shape");
  const std::int64_t big = std::int64_t{1} << 32;
  e = error_of([&] { (void)g.input("z", {big, big}); });
  CHECK(e.code() == "kiln.verify.shape");
  CHECK(mentions(e, "more than 2^62 bytes"));
  CHECK(error_of([&] { (void)g.input("w", {(std::int64_t{1} << 62) + 4}); }).code() ==
        "kiln.verify.shape");
  e = error_of([&] { kiln::Tensor t(kiln::Shape{3, 0}); });
  CHECK(e.code() == "kiln.verify.shape");
  CHECK(mentions(e, "a tensor has shape [3,0]"));
  // Builders check the shapes they make.
  const kiln::Value x = g.input("ok", {2, 3});
  e = error_of([&] { (void)kiln::broadcast_to(x, {big, big, 3}); });
  CHECK(e.code() == "kiln.verify.shape");
  CHECK(mentions(e, "broadcast_to"));
}

TEST_CASE("misuse: running before every input was set is an error naming the input") {
  kiln::Graph g;
  const kiln::Value x = g.input("x", {2, 3});
  const kiln::Value y = g.input("y", {2, 3});
  const kiln::Value sum = x + y;
  g.mark_output(sum);
  kiln::Executor exe = kiln::compile(g, {.threads = 1});
  const std::vector<float> data(6, 1.0f);
  exe.set_input("x", data);
  const kiln::Error e = error_of([&] { exe.run(); });
  CHECK(e.code() == "kiln.api.argument");
  CHECK(mentions(e, "input 'y' was never set"));
  exe.set_input("y", data);
  exe.run();
  CHECK(exe.output(sum)[0] == 2.0f);
}

TEST_CASE("misuse: an output read with a Value of another graph, or scalar() of a tensor") {
  kiln::Graph g, other;
  const kiln::Value x = g.input("x", {2, 3});
  const kiln::Value doubled = kiln::mul_scalar(x, 2.0f);
  g.mark_output(doubled);
  const kiln::Value stranger = kiln::mul_scalar(other.input("x", {2, 3}), 2.0f);
  kiln::Executor exe = kiln::compile(g, {.threads = 1});
  exe.set_input("x", std::vector<float>(6, 1.5f));
  exe.run();
  CHECK(exe.output(doubled)[5] == 3.0f);
  kiln::Error e = error_of([&] { (void)exe.output(stranger); });
  CHECK(e.code() == "kiln.api.argument");
  CHECK(mentions(e, "belongs to another graph"));
  e = error_of([&] { (void)exe.scalar(doubled); });
  CHECK(e.code() == "kiln.verify.shape");
  CHECK(mentions(e, "has 6 elements, not one"));
}

TEST_CASE("misuse: a thread count below 0 or past four per hardware thread is refused") {
  kiln::Graph g;
  g.mark_output(kiln::relu(g.input("x", {4})));
  for (const int threads : {-5, kiln::max_threads() + 1, 1000000}) {
    const kiln::Error e = error_of([&] { (void)kiln::compile(g, {.threads = threads}); });
    CHECK(e.code() == "kiln.api.argument");
    CHECK(mentions(e, "threads is " + std::to_string(threads)));
  }
  CHECK_NOTHROW((void)kiln::compile(g, {.threads = kiln::max_threads()}));
}

TEST_CASE("misuse: a parameter the loss never reads is an error unless allowed") {
  kiln::nn::manual_seed(1);
  kiln::nn::Linear used(3, 2), forgotten(3, 2);
  std::vector<kiln::nn::Parameter> params = used.parameters();
  for (const auto& p : forgotten.parameters()) params.push_back(p);
  for (const bool allow : {false, true}) {
    kiln::Graph g;
    const kiln::Value loss = kiln::sum(used(g.input("x", {4, 3})));
    if (allow) {
      CHECK_NOTHROW((void)kiln::train_step(loss, params, kiln::optim::SGD{.lr = 0.1f},
                                           {.allow_unused = true}));
      continue;
    }
    const kiln::Error e =
        error_of([&] { (void)kiln::train_step(loss, params, kiln::optim::SGD{.lr = 0.1f}); });
    CHECK(e.code() == "kiln.api.argument");
    CHECK(mentions(e, "parameter '" + forgotten.parameters()[0].name + "' [2,3] does not reach"));
  }
}

TEST_CASE("misuse: hyperparameters must be finite") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto sgd_error = [](kiln::optim::SGD sgd) {
    kiln::nn::manual_seed(1);
    kiln::nn::Linear layer(3, 2);
    kiln::Graph g;
    const kiln::Value loss = kiln::sum(layer(g.input("x", {4, 3})));
    return error_of([&] { (void)kiln::train_step(loss, layer.parameters(), sgd); });
  };
  CHECK(sgd_error({.lr = inf}).code() == "kiln.api.argument");
  CHECK(sgd_error({.lr = 0.1f, .momentum = nan}).code() == "kiln.api.argument");
  CHECK(sgd_error({.lr = 0.1f, .weight_decay = inf}).code() == "kiln.api.argument");
  kiln::nn::Linear layer(3, 2);
  kiln::Graph g;
  const kiln::Value loss = kiln::sum(layer(g.input("x", {4, 3})));
  const auto adam = [&](kiln::optim::Adam a) {
    return error_of([&] { (void)kiln::train_step(loss, layer.parameters(), a); });
  };
  CHECK(adam({.lr = nan}).code() == "kiln.api.argument");
  CHECK(adam({.lr = 0.1f, .eps = inf}).code() == "kiln.api.argument");
  const kiln::TrainStep step = kiln::train_step(loss, layer.parameters(), kiln::optim::SGD{});
  CHECK(error_of([&] { step.set_learning_rate(inf); }).code() == "kiln.api.argument");
}

TEST_CASE("misuse: with check_finite, the first run whose loss is not finite stops training") {
  kiln::Graph g;
  const kiln::Value x = g.input("x", {3});
  const kiln::Value loss = kiln::sum(kiln::log(x));
  g.mark_output(loss);
  kiln::Executor checked = kiln::compile(g, {.threads = 1, .check_finite = true});
  kiln::Executor unchecked = kiln::compile(g, {.threads = 1});
  checked.set_input("x", std::vector<float>{1.0f, 2.0f, 3.0f});
  checked.run();
  CHECK(checked.scalar(loss) == doctest::Approx(std::log(6.0)));
  for (kiln::Executor* exe : {&checked, &unchecked})
    exe->set_input("x", std::vector<float>{1.0f, -2.0f, 3.0f});
  unchecked.run();
  CHECK(std::isnan(unchecked.scalar(loss)));
  const kiln::Error e = error_of([&] { checked.run(); });
  CHECK(e.code() == "kiln.runtime.not_finite");
  CHECK(mentions(e, "run 2: output %" + std::to_string(loss.id) + " is nan"));
}

TEST_CASE("misuse: one NaN pixel makes the loss NaN through relu and max pooling, wherever it "
          "sits") {
  kiln::nn::manual_seed(3);
  kiln::nn::Sequential net = kiln::nn::models::mnist_cnn();
  kiln::Graph g;
  const std::int64_t batch = 2;
  const auto x = g.input("x", {batch, 1, 28, 28});
  const auto y = g.input("y", {batch}, kiln::i32);
  const kiln::Value loss = kiln::softmax_cross_entropy(net(x), y);
  g.mark_output(loss);
  kiln::Executor exe = kiln::compile(g, {.threads = 2});
  exe.set_input("y", std::vector<std::int32_t>{3, 7});
  kiln::Rng rng(4);
  std::vector<float> images(static_cast<std::size_t>(batch * 784));
  for (float& v : images) v = rng.uniform(0.0f, 1.0f);
  exe.set_input("x", images);
  exe.run();
  REQUIRE(std::isfinite(exe.scalar(loss)));
  // Corners, the centre and pixels at every offset of a 16-float vector within a row.
  for (const std::int64_t pixel : {0, 27, 13 * 28 + 13, 783, 784 + 5 * 28 + 1, 784 + 300, 784 + 301,
                                   784 + 302, 784 + 303, 784 + 309, 784 + 314}) {
    std::vector<float> poisoned = images;
    poisoned[static_cast<std::size_t>(pixel)] = std::numeric_limits<float>::quiet_NaN();
    exe.set_input("x", poisoned);
    exe.run();
    INFO("NaN at pixel " << pixel);
    CHECK(std::isnan(exe.scalar(loss)));
  }
}
