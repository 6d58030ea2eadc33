// Autodiff tests: every differentiable op's gradient against central finite differences.
// Tolerance (GradCheckOptions defaults): step h = 1e-3, and each element must satisfy
// |analytic - numeric| <= 2e-3 + 2e-2·|numeric|.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kiln/kiln.hpp"

#include "graph_test_helpers.hpp"

namespace {

using kiln::test::random_tensor;

using kiln::Shape;
using kiln::Value;

/// Uniform values in [lo, hi) with magnitude at least `gap`, so that relu and maxpool are
/// not probed across their kinks.
/// loss = sum(out * R) with a fixed random R: every output element gets its own weight.
Value project(Value out, std::uint64_t seed = 99) {
  auto r = random_tensor(out.shape(), seed);
  return kiln::sum(out * out.graph->param("R", r));
}

void check(const std::function<Value(kiln::Graph&, const std::vector<Value>&)>& build,
           const std::vector<std::shared_ptr<kiln::Tensor>>& params) {
  const kiln::GradCheckResult r = kiln::check_gradients(build, params);
  INFO(r.worst);
  CHECK(r.ok);
}

} // namespace

TEST_CASE("gradients: broadcasting add, sub, mul, div") {
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(p[0] + p[1]); },
        {random_tensor({3, 4}, 1), random_tensor({4}, 2)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(p[0] - p[1]); },
        {random_tensor({3, 1}, 3), random_tensor({3, 4}, 4)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(p[0] * p[1]); },
        {random_tensor({2, 3, 4}, 5), random_tensor({1, 3, 1}, 6)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(p[0] / p[1]); },
        {random_tensor({3, 4}, 7), random_tensor({3, 4}, 8, 0.5f, 2.0f)});
}

TEST_CASE("gradients: unary elementwise ops") {
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::neg(p[0])); },
        {random_tensor({5}, 9)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::relu(p[0])); },
        {random_tensor({4, 5}, 10, -1.0f, 1.0f, 0.05f)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::exp(p[0])); },
        {random_tensor({7}, 11)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::log(p[0])); },
        {random_tensor({7}, 12, 0.5f, 2.0f)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::sqrt(p[0])); },
        {random_tensor({7}, 13, 0.5f, 2.0f)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::rsqrt(p[0])); },
        {random_tensor({7}, 14, 0.5f, 2.0f)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::square(p[0])); },
        {random_tensor({7}, 15)});
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::mul_scalar(kiln::add_scalar(p[0], 0.5f), -3.0f));
      },
      {random_tensor({7}, 16)});
}

TEST_CASE("gradients: broadcast_to, sum_to, reshape, mean") {
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::broadcast_to(p[0], {2, 3, 4}));
      },
      {random_tensor({3, 1}, 17)});
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::sum_to(p[0], {1, 3, 1}));
      },
      {random_tensor({2, 3, 4}, 18)});
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::reshape(p[0], {4, -1}));
      },
      {random_tensor({2, 3, 4}, 19)});
  check([](kiln::Graph&, const std::vector<Value>& p) { return kiln::mean(kiln::square(p[0])); },
        {random_tensor({3, 5}, 20)});
}

TEST_CASE("gradients: matmul with every transpose combination") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      CAPTURE(ta);
      CAPTURE(tb);
      const Shape a = ta ? Shape{5, 3} : Shape{3, 5};
      const Shape b = tb ? Shape{4, 5} : Shape{5, 4};
      check([&](kiln::Graph&,
                const std::vector<Value>& p) { return project(kiln::matmul(p[0], p[1], ta, tb)); },
            {random_tensor(a, 21), random_tensor(b, 22)});
    }
}

TEST_CASE("gradients: conv2d with stride and padding, input and weight") {
  struct Case {
    Shape x, w;
    int stride, padding;
  };
  for (const Case& c :
       {Case{{2, 3, 6, 6}, {4, 3, 3, 3}, 1, 0}, Case{{1, 2, 7, 7}, {3, 2, 3, 3}, 2, 1},
        Case{{2, 1, 5, 5}, {2, 1, 1, 1}, 1, 0}}) {
    CAPTURE(c.stride);
    CAPTURE(c.padding);
    check(
        [&](kiln::Graph&, const std::vector<Value>& p) {
          return project(kiln::conv2d(p[0], p[1], {.stride = c.stride, .padding = c.padding}));
        },
        {random_tensor(c.x, 23), random_tensor(c.w, 24)});
  }
}

TEST_CASE("gradients: max, average and global average pooling") {
  // Distinct, well separated values keep each window's maximum stable under the probe.
  auto distinct = std::make_shared<kiln::Tensor>(Shape{2, 2, 5, 5});
  kiln::Rng rng(25);
  auto data = distinct->f32();
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = 0.01f * static_cast<float>((i * 37) % data.size());
  for (std::size_t i = data.size() - 1; i > 0; --i) std::swap(data[i], data[rng.below(i + 1)]);
  check([](kiln::Graph&,
           const std::vector<Value>& p) { return project(kiln::max_pool2d(p[0], {.kernel = 2})); },
        {distinct});
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::max_pool2d(p[0], {.kernel = 3, .stride = 2, .padding = 1}));
      },
      {distinct});
  check(
      [](kiln::Graph&, const std::vector<Value>& p) {
        return project(kiln::avg_pool2d(p[0], {.kernel = 3, .stride = 2, .padding = 1}));
      },
      {random_tensor({2, 2, 5, 5}, 26)});
  check([](kiln::Graph&,
           const std::vector<Value>& p) { return project(kiln::global_avg_pool2d(p[0])); },
        {random_tensor({2, 3, 4, 4}, 27)});
}

TEST_CASE("gradients: log_softmax and softmax cross-entropy") {
  check([](kiln::Graph&, const std::vector<Value>& p) { return project(kiln::log_softmax(p[0])); },
        {random_tensor({3, 6}, 28, -2.0f, 2.0f)});
  auto labels = std::make_shared<kiln::Tensor>(Shape{4}, kiln::i32);
  const std::int32_t classes[] = {0, 5, 2, 5};
  for (int i = 0; i < 4; ++i) static_cast<std::int32_t*>(labels->data())[i] = classes[i];
  check(
      [&](kiln::Graph& g, const std::vector<Value>& p) {
        return kiln::softmax_cross_entropy(p[0], g.param("labels", labels));
      },
      {random_tensor({4, 6}, 29, -2.0f, 2.0f)});
}

TEST_CASE("gradients: batchnorm2d in training mode (composite of reductions)") {
  kiln::nn::BatchNorm2d bn(3);
  check([&](kiln::Graph&, const std::vector<Value>& p) { return project(bn(p[0])); },
        {random_tensor({4, 3, 3, 3}, 30, -2.0f, 2.0f)});
}

TEST_CASE("gradients: a whole small CNN, every parameter") {
  kiln::nn::manual_seed(31);
  kiln::nn::Sequential net{kiln::nn::Conv2d(1, 3, 3, 1, 1), kiln::nn::ReLU(),
                           kiln::nn::MaxPool2d(2), kiln::nn::Flatten(), kiln::nn::Linear(12, 4)};
  auto labels = std::make_shared<kiln::Tensor>(Shape{2}, kiln::i32);
  static_cast<std::int32_t*>(labels->data())[1] = 3;
  std::vector<std::shared_ptr<kiln::Tensor>> params;
  for (const auto& p : net.parameters()) params.push_back(p.tensor);
  const auto x = random_tensor({2, 1, 4, 4}, 32);
  // The step is small next to the gaps a relu or maximum would have to cross.
  const kiln::GradCheckResult r = kiln::check_gradients(
      [&](kiln::Graph& g, const std::vector<Value>&) {
        return kiln::softmax_cross_entropy(net(g.param("x", x)), g.param("labels", labels));
      },
      params, {.step = 1e-3f});
  INFO(r.worst);
  CHECK(r.ok);
}

TEST_CASE("gradients: dropout scales kept elements and zeroes dropped ones, forward and backward") {
  kiln::Graph g;
  auto x = g.param("x", random_tensor({4096}, 33, 1.0f, 2.0f));
  auto mask = kiln::dropout_mask(g, {4096}, 0.25f, 7);
  auto y = x * mask;
  auto grad = kiln::gradients(kiln::sum(y), std::vector<Value>{x})[0];
  g.mark_output(mask);
  g.mark_output(grad);
  auto exe = kiln::compile(g, {.threads = 2});
  exe.run();
  const std::vector<float> first(exe.output(mask).begin(), exe.output(mask).end());
  int dropped = 0;
  for (std::size_t i = 0; i < first.size(); ++i) {
    CHECK((first[i] == 0.0f || first[i] == doctest::Approx(1.0f / 0.75f)));
    dropped += first[i] == 0.0f;
    CHECK(exe.output(grad)[i] == first[i]); // d(sum(x*mask))/dx = mask
  }
  CHECK(dropped == doctest::Approx(1024).epsilon(0.1));
  exe.run();
  const auto second = exe.output(mask);
  CHECK(!std::equal(first.begin(), first.end(), second.begin())); // a new mask every step
}
