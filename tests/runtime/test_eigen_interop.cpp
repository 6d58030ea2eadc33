// kiln::eigen: tensors, inputs and outputs as Eigen maps, checked against Eigen's own GEMM.
#include <doctest/doctest.h>

#include <Eigen/Core>

#include "kiln/eigen.hpp"
#include "kiln/kiln.hpp"
#include "support/graph_test_helpers.hpp"

using kiln::test::error_code;
using kiln::test::error_message;

TEST_CASE("eigen: a matmul fed through an input map equals Eigen's product of the same maps") {
  // Sizes off every SIMD width and cache block, so the kernel's tails are exercised.
  constexpr int m = 37, k = 29, n = 19;
  kiln::Graph g;
  kiln::Value x = g.input("x", {m, k});
  auto w = kiln::test::random_tensor(kiln::Shape{n, k}, 3);
  kiln::Value y = kiln::matmul(x, g.param("w", w), false, true);
  g.mark_output(y);
  kiln::Executor exe = kiln::compile(g, {.threads = 2});

  const kiln::eigen::Matrix a = kiln::eigen::Matrix::Random(m, k);
  kiln::eigen::input(exe, "x") = a; // no set_input: the map is the plan's own memory
  exe.run();
  const kiln::eigen::Matrix expected = a * kiln::eigen::matrix(*w).transpose();
  const auto got = kiln::eigen::output(exe, y);
  REQUIRE(got.rows() == m);
  REQUIRE(got.cols() == n);
  const float scale = expected.cwiseAbs().maxCoeff();
  CHECK((got - expected).cwiseAbs().maxCoeff() <= 1e-5f * scale);

  // A second batch written the same way is what the next run reads.
  kiln::eigen::input(exe, "x") = -a;
  exe.run();
  CHECK((kiln::eigen::output(exe, y) + expected).cwiseAbs().maxCoeff() <= 1e-5f * scale);
}

TEST_CASE("eigen: a parameter's matrix is its tensor's memory, [first axis, the rest]") {
  kiln::Tensor weight(kiln::Shape{4, 2, 3, 3});
  auto view = kiln::eigen::matrix(weight);
  CHECK(view.rows() == 4);
  CHECK(view.cols() == 18);
  view(1, 5) = 2.5f;
  CHECK(weight.f32()[1 * 18 + 5] == 2.5f);
  kiln::Tensor bias(kiln::Shape{7});
  CHECK(kiln::eigen::matrix(bias).rows() == 1);
  CHECK(kiln::eigen::matrix(bias).cols() == 7);
}

TEST_CASE("eigen: an i32 tensor or an unknown input is an error naming it") {
  kiln::Tensor labels(kiln::Shape{3}, kiln::DType::i32);
  CHECK(error_code([&] { (void)kiln::eigen::matrix(labels); }) == kiln::errc::dtype);
  kiln::Graph g;
  kiln::Value x = g.input("x", {2, 2});
  g.mark_output(kiln::relu(x));
  kiln::Executor exe = kiln::compile(g, {.threads = 1});
  const std::string message = error_message([&] { (void)kiln::eigen::input(exe, "images"); });
  CHECK(message.find("no input named 'images'") != std::string::npos);
  CHECK(message.find("its inputs: 'x'") != std::string::npos);
}
