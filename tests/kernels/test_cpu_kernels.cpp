// What the op harness cannot see from outside the CPU backend: which kernel variant each call
// gets, the broadcast loop's row merging, and the transpose kernel moving 4-byte words of any
// dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kiln/backends/cpu/broadcast_loop.hpp"
#include "kiln/kiln.hpp"
#include "support/graph_test_helpers.hpp"
#include "support/kernel_harness.hpp"
#include "support/target_loop.hpp"

namespace {

using kiln::Op;
using kiln::Shape;

/// The variant the CPU selects for a call of `op` with these operand and output shapes.
std::string variant(Op op, const std::vector<Shape>& inputs, const Shape& out,
                    const kiln::Attrs& attrs) {
  return kiln::cpu_backend().select(kiln::test::F32Call(op, inputs, out, attrs).query()).name;
}

kiln::Attrs conv(int kernel, int padding, std::int64_t h, std::int64_t w, bool channels_last) {
  kiln::Conv2dAttrs a;
  a.kernel_h = a.kernel_w = kernel;
  a.pad_h = a.pad_w = padding;
  a.input_h = h;
  a.input_w = w;
  a.channels_last = channels_last;
  return a;
}

} // namespace

TEST_CASE("cpu backend: each convolution call gets one variant, chosen once by its rules") {
  // LeNet-5's first layer reads shifted rows of the padded image, forward and weight gradient.
  const kiln::Attrs first = conv(5, 2, 28, 28, false);
  CHECK(variant(Op::Conv2d, {{3, 1, 28, 28}, {6, 1, 5, 5}}, {3, 6, 28, 28}, first) ==
        "conv2d.shifted_rows");
  CHECK(variant(Op::Conv2dGradWeight, {{3, 1, 28, 28}, {3, 6, 28, 28}}, {6, 1, 5, 5}, first) ==
        "conv2d_grad_weight.shifted_rows");
  // Its second: the input gradient has 6 rows (shifted rows); the weight gradient has 150
  // taps, too many for shifted rows' tiles (a column matrix).
  const kiln::Attrs second = conv(5, 0, 14, 14, false);
  CHECK(variant(Op::Conv2dGradInput, {{2, 16, 10, 10}, {16, 6, 5, 5}}, {2, 6, 14, 14}, second) ==
        "conv2d_grad_input.shifted_rows");
  CHECK(variant(Op::Conv2dGradWeight, {{2, 6, 14, 14}, {2, 16, 10, 10}}, {16, 6, 5, 5}, second) ==
        "conv2d_grad_weight.columns");
  // Padding as wide as a 2x2 kernel: the input gradient goes back to a column matrix.
  const kiln::Attrs wide = conv(2, 2, 4, 5, false);
  CHECK(variant(Op::Conv2dGradInput, {{2, 3, 7, 8}, {3, 2, 2, 2}}, {2, 2, 4, 5}, wide) ==
        "conv2d_grad_input.columns");
  // Channels-last activations take the channels-last kernels, which tile 16 channels at a time:
  // 17 output channels have no kernel, and the reason names the variants.
  const kiln::Attrs nhwc = conv(3, 0, 8, 8, true);
  CHECK(variant(Op::Conv2d, {{2, 8, 8, 16}, {3, 3, 16, 32}}, {2, 6, 6, 32}, nhwc) ==
        "conv2d.channels_last");
  const std::string none =
      variant(Op::Conv2d, {{2, 8, 8, 16}, {3, 3, 16, 17}}, {2, 6, 6, 17}, nhwc);
  CHECK(none.find("none of its kernels") != std::string::npos);
  CHECK(none.find("conv2d.channels_last") != std::string::npos);
  // A channels-last input gradient of too few channels for whole vectors scatters dy's pixels
  // (LeNet-5's second convolution: 5 columns x 6 channels a kernel row), where a kernel row
  // fits four AVX-512 vectors; 17 channels of 5 columns do not.
  const kiln::Attrs lenet_nhwc = conv(5, 0, 14, 14, true);
  CHECK(variant(Op::Conv2dGradInput, {{2, 10, 10, 16}, {5, 5, 16, 6}}, {2, 14, 14, 6},
                lenet_nhwc) == "conv2d_grad_input.scatter");
  CHECK(variant(Op::Conv2dGradInput, {{2, 6, 6, 16}, {3, 3, 16, 16}}, {2, 8, 8, 16}, nhwc) ==
        "conv2d_grad_input.channels_last");
  CHECK(variant(Op::Conv2dGradInput, {{2, 10, 10, 16}, {5, 5, 16, 17}}, {2, 14, 14, 17}, lenet_nhwc)
            .find("none of its kernels") != std::string::npos);
}

TEST_CASE("cpu backend: a node no kernel takes fails at compile with kiln.plan.no_kernel") {
  kiln::Graph g;
  auto x = g.input("x", {2, 8, 8, 16});  // NHWC
  auto w = g.input("w", {3, 3, 16, 17}); // packed for 17 output channels
  const auto y = kiln::append(g, Op::Conv2d, {x.id, w.id}, conv(3, 0, 8, 8, true));
  g.mark_output(y);
  const std::string message =
      kiln::test::error_message([&] { (void)kiln::compile(g, {.threads = 1}); });
  CHECK(message.rfind("[kiln.plan.no_kernel] %2 = conv2d(%0, %1)", 0) == 0);
  CHECK(message.find("(inputs %0:f32[2,8,8,16], %1:f32[3,3,16,17])") != std::string::npos);
  CHECK(message.find("backend cpu has no kernel for it") != std::string::npos);
}

TEST_CASE("cpu backend: transpose moves 4-byte words, i32 as well as f32, on every target") {
  const Shape s{2, 3, 5, 7};
  std::vector<std::int32_t> x(2 * 3 * 5 * 7);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(i * 2654435761u);
  std::vector<std::int32_t> want(x.size());
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t h = 0; h < 5; ++h)
        for (std::int64_t w = 0; w < 7; ++w)
          want[static_cast<std::size_t>(((n * 5 + h) * 7 + w) * 3 + c)] =
              x[static_cast<std::size_t>(((n * 3 + c) * 5 + h) * 7 + w)];
  const kiln::Attrs attrs = kiln::TransposeAttrs{{0, 2, 3, 1}};
  std::vector<std::int32_t> out(x.size(), -1);
  kiln::KernelArgs args;
  args.in[0] = kiln::test::view(x, s);
  args.num_inputs = 1;
  args.out = kiln::test::view(out, Shape{2, 5, 7, 3});
  args.attrs = &attrs;
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& t) {
    INFO("target " << std::string(t.target_name));
    std::fill(out.begin(), out.end(), -1);
    kiln::cpu::select(t, Op::Transpose, args).kernel(args);
    CHECK(out == want);
  });
}

TEST_CASE("broadcast loop: rows of a channels-last tensor with a per-channel operand merge") {
  std::uint32_t periodic = 0;
  const Shape bias_right[] = {{6, 5, 7, 16}, {16}};
  kiln::cpu::BroadcastLoop loop({6, 5, 7, 16}, bias_right);
  // 210 rows of 16: the largest factor of 210 with at most 1024 elements is 42.
  CHECK(loop.widen(1024, 0, 4, periodic) == 42);
  CHECK(loop.inner == 672);
  CHECK(loop.rows == 5);
  CHECK(periodic == 2u);
  std::int64_t offsets[2];
  loop.row_offsets(3, offsets);
  CHECK(offsets[0] == 3 * 672);
  CHECK(offsets[1] == 0);

  // A forbidden operand, or one whose value changes from row to row, keeps the rows.
  kiln::cpu::BroadcastLoop kept({6, 5, 7, 16}, bias_right);
  CHECK(kept.widen(1024, 2u, 4, periodic) == 1);
  CHECK(kept.inner == 16);
  const Shape per_row[] = {{3, 50, 8}, {3, 1, 8}};
  kiln::cpu::BroadcastLoop rows({3, 50, 8}, per_row);
  CHECK(rows.widen(1024, 0, 4, periodic) == 1);
  CHECK(periodic == 0u);
}

TEST_CASE("cpu backend: relu keeps a NaN at every vector position, on every target") {
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& t) {
    INFO("target " << std::string(t.target_name));
    for (const std::int64_t n : {1, 7, 16, 33, 70}) {
      for (std::int64_t at = 0; at < n; ++at) {
        std::vector<float> x(static_cast<std::size_t>(n), -1.0f);
        x[static_cast<std::size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
        const std::vector<float> y =
            kiln::test::run_kernel(t, Op::Relu, {kiln::test::view(x, Shape{n})}, Shape{n});
        INFO("n " << n << ", NaN at " << at);
        CHECK(std::isnan(y[static_cast<std::size_t>(at)]));
        for (std::int64_t i = 0; i < n; ++i)
          if (i != at) CHECK(y[static_cast<std::size_t>(i)] == 0.0f);
      }
    }
  });
}

TEST_CASE("cpu backend: max pooling keeps a NaN at every input position, on every target") {
  struct Case {
    std::int64_t c, h, w;
    int kernel, stride, padding;
    bool channels_last;
  };
  // Blocks of row pairs (2x2 over even planes), vector columns of one plane (3x3 stride 2,
  // padded), and channels-last vectors across channels.
  const Case cases[] = {{2, 4, 40, 2, 2, 0, false},
                        {1, 7, 37, 3, 2, 1, false},
                        {1, 5, 21, 2, 1, 0, false},
                        {37, 4, 4, 2, 2, 0, true},
                        {19, 5, 5, 3, 2, 1, true}};
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& t) {
    INFO("target " << std::string(t.target_name));
    for (const Case& k : cases) {
      kiln::Pool2dAttrs pool{k.kernel, k.stride, k.padding, k.h, k.w};
      pool.channels_last = k.channels_last;
      const kiln::Attrs attrs = pool;
      const std::int64_t oh = (k.h + 2 * k.padding - k.kernel) / k.stride + 1;
      const std::int64_t ow = (k.w + 2 * k.padding - k.kernel) / k.stride + 1;
      const Shape xs = k.channels_last ? Shape{1, k.h, k.w, k.c} : Shape{1, k.c, k.h, k.w};
      const Shape ys = k.channels_last ? Shape{1, oh, ow, k.c} : Shape{1, k.c, oh, ow};
      const auto at = [&](std::int64_t c, std::int64_t y, std::int64_t x, std::int64_t width,
                          std::int64_t height) {
        return static_cast<std::size_t>(k.channels_last ? (y * width + x) * k.c + c
                                                        : (c * height + y) * width + x);
      };
      for (std::int64_t nan_at = 0; nan_at < xs.numel(); ++nan_at) {
        std::vector<float> x = kiln::test::random_values(xs.numel(), 5);
        x[static_cast<std::size_t>(nan_at)] = std::numeric_limits<float>::quiet_NaN();
        const std::vector<float> y =
            kiln::test::run_kernel(t, Op::MaxPool2d, {kiln::test::view(x, xs)}, ys, &attrs);
        INFO(xs.str() << " " << k.kernel << "x" << k.kernel << " stride " << k.stride << " padding "
                      << k.padding << ", NaN at " << nan_at);
        // Each window's max over its in-bound taps, NaN when a tap is NaN.
        std::int64_t wrong = 0;
        for (std::int64_t c = 0; c < k.c; ++c)
          for (std::int64_t r = 0; r < oh; ++r)
            for (std::int64_t q = 0; q < ow; ++q) {
              float want = -std::numeric_limits<float>::infinity();
              bool has_nan = false;
              for (std::int64_t i = r * k.stride - k.padding;
                   i < r * k.stride - k.padding + k.kernel; ++i)
                for (std::int64_t j = q * k.stride - k.padding;
                     j < q * k.stride - k.padding + k.kernel; ++j) {
                  if (i < 0 || i >= k.h || j < 0 || j >= k.w) continue;
                  const float v = x[at(c, i, j, k.w, k.h)];
                  has_nan = has_nan || std::isnan(v);
                  want = std::isnan(v) ? want : std::max(want, v);
                }
              const float got = y[at(c, r, q, ow, oh)];
              if (has_nan ? !std::isnan(got) : got != want) ++wrong;
            }
        CHECK(wrong == 0);
      }
    }
  });
}
