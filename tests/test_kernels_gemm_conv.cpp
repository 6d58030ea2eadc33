// MatMul and convolution CPU kernels against the scalar references, per SIMD target.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "kernel_harness.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/core/rng.hpp"
#include "reference_gemm_conv.hpp"
#include "target_loop.hpp"

namespace {

using kiln::Attrs;
using kiln::Conv2dAttrs;
using kiln::DType;
using kiln::KernelArgs;
using kiln::MatMulAttrs;
using kiln::Op;
using kiln::Shape;
using kiln::TensorView;
using kiln::cpu::KernelTable;
using kiln::test::ref::ConvShape;

/// Error allowed, relative to the largest |reference| element of the output. The kernels
/// accumulate in float (up to 9216 terms here, in a different order than the reference);
/// the references accumulate in double.
constexpr double kTol = 1e-4;

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  kiln::Rng rng(seed);
  std::vector<float> v(n);
  for (float& f : v) f = rng.uniform(-1.0f, 1.0f);
  return v;
}

Shape shape_of(std::initializer_list<std::size_t> dims) {
  Shape s;
  for (const std::size_t d : dims) s.push_back(static_cast<std::int64_t>(d));
  return s;
}

using kiln::test::relative_error;
using kiln::test::view;

std::vector<float> run(const KernelTable& t, Op op, std::initializer_list<TensorView> inputs,
                       const Shape& out_shape, const Attrs& attrs) {
  return kiln::test::run_kernel(t, op, inputs, out_shape, &attrs);
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  CHECK(relative_error(got, want) <= kTol);
}

struct MatMulCase {
  std::size_t m, n, k;
};

/// Checks MatMul with all four transpose combinations on every target.
void check_matmul(const MatMulCase& c, std::uint64_t seed) {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      CAPTURE(ta);
      CAPTURE(tb);
      std::vector<float> a = random_values(c.m * c.k, seed);
      std::vector<float> b = random_values(c.k * c.n, seed + 1);
      const std::vector<float> want = kiln::test::ref::matmul(a, b, c.m, c.n, c.k, ta, tb);
      const Attrs attrs = MatMulAttrs{ta, tb};
      const Shape sa = ta ? shape_of({c.k, c.m}) : shape_of({c.m, c.k});
      const Shape sb = tb ? shape_of({c.n, c.k}) : shape_of({c.k, c.n});
      kiln::test::for_each_target([&](const KernelTable& t) {
        CAPTURE(std::string(t.target_name));
        check_close(run(t, Op::MatMul, {view(a, sa), view(b, sb)}, shape_of({c.m, c.n}), attrs),
                    want);
      });
    }
  }
}

Attrs conv_attrs(const ConvShape& s) {
  Conv2dAttrs a;
  a.stride_h = static_cast<int>(s.stride_h);
  a.stride_w = static_cast<int>(s.stride_w);
  a.pad_h = static_cast<int>(s.pad_h);
  a.pad_w = static_cast<int>(s.pad_w);
  return a;
}

/// Checks conv2d and both its gradients on every target.
void check_conv(const ConvShape& s, std::uint64_t seed) {
  CAPTURE(s.n);
  CAPTURE(s.c);
  CAPTURE(s.h);
  CAPTURE(s.w);
  CAPTURE(s.o);
  CAPTURE(s.kh);
  CAPTURE(s.kw);
  CAPTURE(s.stride_h);
  CAPTURE(s.stride_w);
  CAPTURE(s.pad_h);
  CAPTURE(s.pad_w);
  const Shape xs = shape_of({s.n, s.c, s.h, s.w});
  const Shape ws = shape_of({s.o, s.c, s.kh, s.kw});
  const Shape ys = shape_of({s.n, s.o, s.oh(), s.ow()});
  std::vector<float> x = random_values(static_cast<std::size_t>(xs.numel()), seed);
  std::vector<float> w = random_values(static_cast<std::size_t>(ws.numel()), seed + 1);
  std::vector<float> dy = random_values(static_cast<std::size_t>(ys.numel()), seed + 2);
  const std::vector<float> y_want = kiln::test::ref::conv2d(s, x, w);
  const std::vector<float> dx_want = kiln::test::ref::conv2d_grad_input(s, dy, w);
  const std::vector<float> dw_want = kiln::test::ref::conv2d_grad_weight(s, x, dy);
  const Attrs attrs = conv_attrs(s);
  kiln::test::for_each_target([&](const KernelTable& t) {
    CAPTURE(std::string(t.target_name));
    {
      INFO("conv2d");
      check_close(run(t, Op::Conv2d, {view(x, xs), view(w, ws)}, ys, attrs), y_want);
    }
    {
      INFO("conv2d_grad_input");
      check_close(run(t, Op::Conv2dGradInput, {view(dy, ys), view(w, ws)}, xs, attrs), dx_want);
    }
    {
      INFO("conv2d_grad_weight");
      check_close(run(t, Op::Conv2dGradWeight, {view(x, xs), view(dy, ys)}, ws, attrs), dw_want);
    }
  });
}

/// v, a 4-D tensor of sizes `dims`, with its axes reordered: result axis i is axis perm[i].
std::vector<float> permuted(const std::vector<float>& v, std::array<std::size_t, 4> dims,
                            std::array<std::size_t, 4> perm) {
  const std::array<std::size_t, 4> stride{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3],
                                          1};
  std::vector<float> out(v.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < dims[perm[0]]; ++i)
    for (std::size_t j = 0; j < dims[perm[1]]; ++j)
      for (std::size_t k = 0; k < dims[perm[2]]; ++k)
        for (std::size_t l = 0; l < dims[perm[3]]; ++l)
          out[at++] = v[i * stride[perm[0]] + j * stride[perm[1]] + k * stride[perm[2]] +
                        l * stride[perm[3]]];
  return out;
}

/// Checks the channels-last conv2d and gradients ([N, H, W, C] activations, pre-packed
/// weights) against the scalar NCHW references, their results transposed. The input
/// gradient only exists at stride 1 and for multiples of 16 input channels.
void check_conv_channels_last(const ConvShape& s, std::uint64_t seed) {
  CAPTURE(s.c);
  CAPTURE(s.o);
  CAPTURE(s.kh);
  CAPTURE(s.stride_h);
  CAPTURE(s.pad_h);
  const std::array<std::size_t, 4> x_dims{s.n, s.c, s.h, s.w}, w_dims{s.o, s.c, s.kh, s.kw},
      y_dims{s.n, s.o, s.oh(), s.ow()};
  constexpr std::array<std::size_t, 4> to_nhwc{0, 2, 3, 1};
  std::vector<float> x = random_values(s.n * s.c * s.h * s.w, seed);
  std::vector<float> w = random_values(s.o * s.c * s.kh * s.kw, seed + 1);
  std::vector<float> dy = random_values(s.n * s.o * s.oh() * s.ow(), seed + 2);
  std::vector<float> x_nhwc = permuted(x, x_dims, to_nhwc);
  std::vector<float> dy_nhwc = permuted(dy, y_dims, to_nhwc);
  std::vector<float> w_hwio = permuted(w, w_dims, {2, 3, 1, 0});
  std::vector<float> w_hwoi = permuted(w, w_dims, {2, 3, 0, 1});
  const Shape xs = shape_of({s.n, s.h, s.w, s.c});
  const Shape ys = shape_of({s.n, s.oh(), s.ow(), s.o});
  Conv2dAttrs a = std::get<Conv2dAttrs>(conv_attrs(s));
  a.channels_last = true;
  const Attrs attrs = a;
  const std::vector<float> y_want = permuted(kiln::test::ref::conv2d(s, x, w), y_dims, to_nhwc);
  const std::vector<float> dw_want = kiln::test::ref::conv2d_grad_weight(s, x, dy);
  kiln::test::for_each_target([&](const KernelTable& t) {
    CAPTURE(std::string(t.target_name));
    {
      INFO("conv2d, channels-last");
      check_close(run(t, Op::Conv2d,
                      {view(x_nhwc, xs), view(w_hwio, shape_of({s.kh, s.kw, s.c, s.o}))}, ys,
                      attrs),
                  y_want);
    }
    if (s.stride_h == 1 && s.stride_w == 1 && s.c % 16 == 0) {
      INFO("conv2d_grad_input, channels-last");
      const std::vector<float> dx_want =
          permuted(kiln::test::ref::conv2d_grad_input(s, dy, w), x_dims, to_nhwc);
      check_close(run(t, Op::Conv2dGradInput,
                      {view(dy_nhwc, ys), view(w_hwoi, shape_of({s.kh, s.kw, s.o, s.c}))}, xs,
                      attrs),
                  dx_want);
    }
    {
      INFO("conv2d_grad_weight, channels-last");
      check_close(run(t, Op::Conv2dGradWeight, {view(x_nhwc, xs), view(dy_nhwc, ys)},
                      shape_of({s.o, s.c, s.kh, s.kw}), attrs),
                  dw_want);
    }
  });
}

} // namespace

TEST_CASE("matmul kernel: small and odd shapes") {
  const MatMulCase cases[] = {{1, 1, 1},   {1, 17, 5},  {13, 1, 7},   {7, 9, 1},   {5, 3, 2},
                              {8, 48, 16}, {9, 49, 17}, {33, 65, 31}, {6, 16, 300}};
  std::uint64_t seed = 1;
  for (const MatMulCase& c : cases) check_matmul(c, seed += 2);
}

TEST_CASE("matmul kernel: shapes crossing the cache blocks") {
  // Depth beyond kc, rows beyond mc, columns beyond nc.
  const MatMulCase cases[] = {{17, 23, 600}, {300, 19, 13}, {21, 1100, 20}, {70, 130, 257}};
  std::uint64_t seed = 100;
  for (const MatMulCase& c : cases) check_matmul(c, seed += 2);
}

TEST_CASE("matmul kernel: the MNIST CNN's linear layers") {
  struct Named {
    const char* what;
    std::size_t m, n, k;
    bool ta, tb;
  };
  // fc1 forward, fc1 weight gradient, fc1 input gradient, fc2 forward.
  const Named cases[] = {{"fc1", 64, 128, 9216, false, true},
                         {"fc1 dW", 128, 9216, 64, true, false},
                         {"fc1 dX", 64, 9216, 128, false, false},
                         {"fc2", 64, 10, 128, false, true}};
  std::uint64_t seed = 200;
  for (const Named& c : cases) {
    CAPTURE(c.what);
    std::vector<float> a = random_values(c.m * c.k, seed += 2);
    std::vector<float> b = random_values(c.k * c.n, seed + 1);
    const std::vector<float> want = kiln::test::ref::matmul(a, b, c.m, c.n, c.k, c.ta, c.tb);
    const Attrs attrs = MatMulAttrs{c.ta, c.tb};
    const Shape sa = c.ta ? shape_of({c.k, c.m}) : shape_of({c.m, c.k});
    const Shape sb = c.tb ? shape_of({c.n, c.k}) : shape_of({c.k, c.n});
    kiln::test::for_each_target([&](const KernelTable& t) {
      CAPTURE(std::string(t.target_name));
      check_close(run(t, Op::MatMul, {view(a, sa), view(b, sb)}, shape_of({c.m, c.n}), attrs),
                  want);
    });
  }
}

TEST_CASE("conv kernels: stride 1, no padding") {
  check_conv({.n = 2, .c = 1, .h = 28, .w = 28, .o = 32, .kh = 3, .kw = 3}, 300);
  check_conv({.n = 3, .c = 5, .h = 9, .w = 11, .o = 7, .kh = 3, .kw = 3}, 310);
  check_conv({.n = 1, .c = 2, .h = 3, .w = 3, .o = 3, .kh = 3, .kw = 3}, 320);
}

TEST_CASE("conv kernels: padding") {
  check_conv({.n = 2, .c = 3, .h = 7, .w = 6, .o = 5, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
             400);
  // Padding as wide as the kernel: whole rows and columns of taps read only padding.
  check_conv({.n = 2, .c = 2, .h = 4, .w = 5, .o = 3, .kh = 3, .kw = 3, .pad_h = 2, .pad_w = 2},
             410);
  check_conv({.n = 1, .c = 1, .h = 1, .w = 1, .o = 4, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
             420);
}

TEST_CASE("conv kernels: strides and non-square kernels") {
  check_conv({.n = 2,
              .c = 3,
              .h = 9,
              .w = 10,
              .o = 4,
              .kh = 3,
              .kw = 3,
              .stride_h = 2,
              .stride_w = 2,
              .pad_h = 1,
              .pad_w = 1},
             500);
  check_conv({.n = 3,
              .c = 2,
              .h = 11,
              .w = 8,
              .o = 6,
              .kh = 5,
              .kw = 3,
              .stride_h = 2,
              .stride_w = 1,
              .pad_h = 2,
              .pad_w = 1},
             510);
  check_conv({.n = 2,
              .c = 4,
              .h = 8,
              .w = 13,
              .o = 9,
              .kh = 2,
              .kw = 4,
              .stride_h = 1,
              .stride_w = 3,
              .pad_h = 0,
              .pad_w = 2},
             520);
}

TEST_CASE("conv kernels: pointwise (1x1) convolutions") {
  check_conv({.n = 2, .c = 8, .h = 5, .w = 7, .o = 6, .kh = 1, .kw = 1}, 600);
  check_conv({.n = 1, .c = 1, .h = 1, .w = 1, .o = 1, .kh = 1, .kw = 1}, 610);
  check_conv(
      {.n = 2, .c = 3, .h = 6, .w = 5, .o = 4, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2},
      620);
}

TEST_CASE("conv kernels: LeNet-5's convolutions, over shifted rows of the padded image") {
  // A first layer (5x5, padding 2, 6 filters: tiles of 6 rows) and the second (its input
  // gradient has 6 rows), both read as shifted windows instead of a column matrix.
  check_conv({.n = 3, .c = 1, .h = 28, .w = 28, .o = 6, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},
             650);
  check_conv({.n = 2, .c = 6, .h = 14, .w = 14, .o = 16, .kh = 5, .kw = 5}, 660);
  // Padding as wide as the kernel: the input gradient falls back to im2col.
  check_conv({.n = 2, .c = 2, .h = 4, .w = 5, .o = 3, .kh = 2, .kw = 2, .pad_h = 2, .pad_w = 2},
             670);
  using kiln::cpu::ConvGeometry;
  const ConvGeometry first{
      .c = 1, .h = 28, .w = 28, .o = 6, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2};
  const ConvGeometry second{.c = 6, .h = 14, .w = 14, .o = 16, .kh = 5, .kw = 5};
  const ConvGeometry wide_padding{
      .c = 2, .h = 4, .w = 5, .o = 3, .kh = 2, .kw = 2, .pad_h = 2, .pad_w = 2};
  CHECK(kiln::cpu::conv_reads_shifted_rows(Op::Conv2d, first));
  CHECK(kiln::cpu::conv_reads_shifted_rows(Op::Conv2dGradWeight, first));
  CHECK(kiln::cpu::conv_reads_shifted_rows(Op::Conv2dGradInput, second));
  CHECK_FALSE(kiln::cpu::conv_reads_shifted_rows(Op::Conv2dGradWeight, second));
  CHECK_FALSE(kiln::cpu::conv_reads_shifted_rows(Op::Conv2dGradInput, wide_padding));
}

TEST_CASE("conv kernels: the MNIST CNN's second convolution") {
  // ckk = 288 crosses the depth block, 576 pixels cross the column block.
  check_conv({.n = 3, .c = 32, .h = 26, .w = 26, .o = 64, .kh = 3, .kw = 3}, 700);
}

TEST_CASE("gemm and conv kernels in task arenas of 1 and 2 threads") {
  const ConvShape s{
      .n = 5, .c = 3, .h = 10, .w = 9, .o = 7, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1};
  const MatMulCase mm{70, 130, 40};
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    tbb::task_arena arena(threads);
    arena.execute([&] {
      REQUIRE(tbb::this_task_arena::max_concurrency() == threads);
      check_conv(s, 800);
      check_matmul(mm, 810);
    });
  }
}

TEST_CASE("channels-last conv kernels against the NCHW references") {
  // The MNIST CNN's two convolutions (one input channel; 32 -> 64 channels).
  check_conv_channels_last({.n = 2, .c = 1, .h = 28, .w = 28, .o = 32, .kh = 3, .kw = 3}, 900);
  check_conv_channels_last({.n = 3, .c = 32, .h = 26, .w = 26, .o = 64, .kh = 3, .kw = 3}, 910);
  // Padding (a halo around x, and a narrower one around dy), odd sizes, 48 channels (tiles
  // of one vector), a 5x5 kernel and a stride-2 forward.
  check_conv_channels_last(
      {.n = 2, .c = 16, .h = 7, .w = 9, .o = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}, 920);
  check_conv_channels_last({.n = 2, .c = 48, .h = 6, .w = 5, .o = 48, .kh = 3, .kw = 3}, 930);
  check_conv_channels_last(
      {.n = 1, .c = 16, .h = 9, .w = 8, .o = 32, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}, 940);
  check_conv_channels_last({.n = 2,
                            .c = 16,
                            .h = 9,
                            .w = 10,
                            .o = 32,
                            .kh = 3,
                            .kw = 3,
                            .stride_h = 2,
                            .stride_w = 2,
                            .pad_h = 1,
                            .pad_w = 1},
                           950);
  for (const int threads : {1, 2}) {
    CAPTURE(threads);
    tbb::task_arena arena(threads);
    arena.execute([&] {
      check_conv_channels_last(
          {.n = 5, .c = 16, .h = 6, .w = 6, .o = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},
          960);
    });
  }
}
