// Sum_to, pooling and softmax/loss CPU kernels against the scalar references, per SIMD target.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_harness.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "reference_pool_softmax.hpp"
#include "target_loop.hpp"

namespace {

using kiln::Attrs;
using kiln::DType;
using kiln::KernelArgs;
using kiln::Op;
using kiln::Pool2dAttrs;
using kiln::Shape;
using kiln::TensorView;
using kiln::cpu::KernelTable;

/// Error allowed, relative to the largest |reference| element of the output. The kernels
/// sum in float (vector partial sums) and use Highway's ~1 ulp exp/log; the references
/// accumulate in double.
constexpr double kTol = 1e-5;

using kiln::test::random_values;
using kiln::test::relative_error;
using kiln::test::tied_values;
using kiln::test::view;

std::vector<float> run(const KernelTable& t, Op op, std::initializer_list<TensorView> inputs,
                       const Shape& out_shape, const Attrs* attrs = nullptr) {
  return kiln::test::run_kernel(t, op, inputs, out_shape, attrs);
}

struct SumCase {
  Shape from, to;
};

struct PoolCase {
  std::int64_t n, c, h, w;
  int kernel, stride, padding;
};

/// Odd sizes, size-1 dims, stride != kernel, padding 1, 2x2/stride-2 fast paths, rows both
/// narrower and wider than a 16-lane vector.
const std::vector<PoolCase> kPoolCases = {
    {2, 3, 26, 26, 2, 2, 0},
    {1, 1, 5, 5, 2, 2, 0},
    {2, 3, 7, 9, 3, 1, 1},
    {2, 2, 13, 11, 3, 2, 1},
    {1, 1, 1, 1, 1, 1, 0},
    {2, 3, 17, 19, 2, 1, 0},
    {1, 2, 8, 8, 3, 3, 0},
    {1, 1, 6, 40, 3, 2, 0},
    {3, 4, 9, 50, 2, 2, 1},
    {1, 1, 4, 70, 1, 2, 0},
    {1, 2, 35, 67, 3, 1, 1},
    {8, 16, 28, 28, 2, 2, 0},
    {1, 1, 3, 3, 3, 1, 1},
    {2, 1, 1, 9, 1, 1, 0},
    {1, 1, 10, 37, 2, 2, 0},
    {1, 3, 11, 45, 3, 3, 1},
    {1, 1, 2, 2, 2, 2, 0},
    {1, 1, 5, 7, 4, 1, 1},
    {2, 2, 33, 33, 5, 2, 2},
    // 2x2 over even planes runs by blocks of row pairs across planes: LeNet's pools, and
    // blocks that end in the middle of a plane.
    {64, 16, 10, 10, 2, 2, 0},
    {3, 6, 28, 28, 2, 2, 0},
    {2, 40, 14, 6, 2, 2, 0},
};

std::string pool_name(const PoolCase& pc) {
  return "x=[" + std::to_string(pc.n) + "," + std::to_string(pc.c) + "," + std::to_string(pc.h) +
         "," + std::to_string(pc.w) + "] k=" + std::to_string(pc.kernel) +
         " s=" + std::to_string(pc.stride) + " p=" + std::to_string(pc.padding);
}

} // namespace

TEST_CASE("cpu kernels: sum_to matches the reference on every target") {
  const std::vector<SumCase> cases = {
      {{64, 128}, {1, 128}},
      {{64, 32, 26, 26}, {1, 32, 1, 1}},
      // Bias gradients over NHWC: one short row summed over many rows, in parallel blocks.
      {{64, 24, 24, 64}, {1, 1, 1, 64}},
      {{16, 26, 26, 33}, {1, 1, 1, 33}},
      {{64, 10}, {64, 1}},
      {{7, 13}, {1, 1}},
      {{100003}, {1}},
      {{3, 1, 5, 17}, {1, 1, 5, 1}},
      {{2, 3, 4, 5, 6, 7}, {1, 3, 1, 5, 1, 7}},
      {{2, 3, 4, 5, 6, 7}, {2, 1, 4, 1, 6, 1}},
      {{5, 37}, {5, 37}},
      {{1, 1}, {1, 1}},
      {{}, {}},
      {{3, 1}, {1, 1}},
      {{1000, 3}, {1, 3}},
      {{3, 1000}, {3, 1}},
      {{2, 700, 33}, {2, 1, 33}},
      {{9, 1, 1, 131}, {1, 1, 1, 131}},
      {{0, 4}, {1, 4}},
  };
  for (const SumCase& sc : cases) {
    std::vector<float> x = random_values(sc.from.numel(), 7);
    const std::vector<float> want = kiln::test::ref::sum_to(x, sc.from, sc.to);
    kiln::test::for_each_target([&](const KernelTable& t) {
      INFO("target " << std::string(t.target_name) << " " << sc.from.str() << " -> "
                     << sc.to.str());
      const std::vector<float> got = run(t, Op::SumTo, {view(x, sc.from)}, sc.to);
      CHECK(relative_error(got, want) <= kTol);
    });
  }
}

TEST_CASE("cpu kernels: pooling matches the reference on every target") {
  for (const PoolCase& pc : kPoolCases) {
    const Pool2dAttrs pa{.kernel = pc.kernel, .stride = pc.stride, .padding = pc.padding};
    const Attrs attrs = pa;
    const Shape xs{pc.n, pc.c, pc.h, pc.w};
    const Shape ys{pc.n, pc.c, kiln::test::ref::pool_out(pc.h, pa),
                   kiln::test::ref::pool_out(pc.w, pa)};
    std::vector<float> x = random_values(xs.numel(), 11);
    std::vector<float> x_tied = tied_values(xs.numel(), 13);
    std::vector<float> dy = random_values(ys.numel(), 17);
    const std::vector<float> want_max = kiln::test::ref::maxpool2d(x, xs, pa);
    const std::vector<float> want_avg = kiln::test::ref::avgpool2d(x, xs, pa);
    const std::vector<float> want_max_grad = kiln::test::ref::maxpool2d_grad(x, xs, dy, pa);
    const std::vector<float> want_max_grad_tied =
        kiln::test::ref::maxpool2d_grad(x_tied, xs, dy, pa);
    const std::vector<float> want_avg_grad = kiln::test::ref::avgpool2d_grad(dy, xs, pa);
    kiln::test::for_each_target([&](const KernelTable& t) {
      INFO("target " << std::string(t.target_name) << " " << pool_name(pc));
      // A max is exact, so maxpool2d must match bit for bit.
      CHECK(relative_error(run(t, Op::MaxPool2d, {view(x, xs)}, ys, &attrs), want_max) == 0.0);
      CHECK(relative_error(run(t, Op::AvgPool2d, {view(x, xs)}, ys, &attrs), want_avg) <= kTol);
      CHECK(relative_error(run(t, Op::MaxPool2dGrad, {view(x, xs), view(dy, ys)}, xs, &attrs),
                           want_max_grad) <= kTol);
      CHECK(relative_error(run(t, Op::MaxPool2dGrad, {view(x_tied, xs), view(dy, ys)}, xs, &attrs),
                           want_max_grad_tied) <= kTol);
      CHECK(relative_error(run(t, Op::AvgPool2dGrad, {view(dy, ys)}, xs, &attrs), want_avg_grad) <=
            kTol);
    });
  }
}

TEST_CASE("cpu kernels: log_softmax and its gradient match the reference on every target") {
  const std::vector<Shape> shapes = {{1, 1},     {4, 10}, {64, 10}, {3, 17}, {5, 1000},
                                     {2, 3, 33}, {1},     {7, 1},   {300, 7}};
  for (const Shape& s : shapes) {
    const std::int64_t cols = s[s.rank() - 1];
    // Wide logits check that the max shift keeps exp from overflowing.
    std::vector<float> x = random_values(s.numel(), 19, -50.0f, 50.0f);
    std::vector<float> dy = random_values(s.numel(), 23);
    const std::vector<float> want = kiln::test::ref::log_softmax(x, cols);
    std::vector<float> y = want;
    const std::vector<float> want_grad = kiln::test::ref::log_softmax_grad(y, dy, cols);
    kiln::test::for_each_target([&](const KernelTable& t) {
      INFO("target " << std::string(t.target_name) << " " << s.str());
      CHECK(relative_error(run(t, Op::LogSoftmax, {view(x, s)}, s), want) <= kTol);
      CHECK(relative_error(run(t, Op::LogSoftmaxGrad, {view(y, s), view(dy, s)}, s), want_grad) <=
            kTol);
    });
  }
}

TEST_CASE(
    "cpu kernels: softmax cross-entropy and its gradient match the reference on every target") {
  const std::vector<Shape> shapes = {{64, 10}, {1, 1}, {5, 37}, {3, 1000}, {200, 3}, {2000, 17}};
  for (const Shape& s : shapes) {
    const std::int64_t n = s[0], k = s[1];
    std::vector<float> x = random_values(s.numel(), 29, -20.0f, 20.0f);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
    std::mt19937 gen(31);
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(k - 1));
    for (std::int32_t& l : labels) l = pick(gen);
    std::vector<float> dloss = {0.7f};
    const std::vector<float> want = {kiln::test::ref::softmax_cross_entropy(x, labels, k)};
    const std::vector<float> want_grad =
        kiln::test::ref::softmax_cross_entropy_grad(x, labels, k, dloss[0]);
    kiln::test::for_each_target([&](const KernelTable& t) {
      INFO("target " << std::string(t.target_name) << " " << s.str());
      const Shape ls{n};
      CHECK(relative_error(run(t, Op::SoftmaxCrossEntropy, {view(x, s), view(labels, ls)}, Shape{}),
                           want) <= kTol);
      CHECK(relative_error(run(t, Op::SoftmaxCrossEntropyGrad,
                               {view(x, s), view(labels, ls), view(dloss, Shape{})}, s),
                           want_grad) <= kTol);
    });
  }
}
