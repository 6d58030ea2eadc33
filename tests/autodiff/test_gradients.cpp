// Autodiff of composites (batchnorm, a whole CNN, dropout) against central finite differences;
// each op's own gradient is checked by the op harness (tests/ops). Tolerance (GradCheckOptions
// defaults): step h = 1e-3, and each element must satisfy |analytic - numeric| <= 2e-3 +
// 2e-2·|numeric|.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::random_tensor;

using kiln::Shape;
using kiln::Value;

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
