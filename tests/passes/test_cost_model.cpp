// Cost model tests: the roofline arithmetic, how shapes fill the GEMM's register tiles, the CPU
// kernels' own traffic (a column matrix only where the chosen variant writes one), and a
// compiled step's prediction as the sum of its kernels'.
#include <doctest/doctest.h>

#include <vector>

#include "kiln/kiln.hpp"
#include "support/graph_test_helpers.hpp"
#include "support/kernel_harness.hpp"

namespace {

using kiln::Op;
using kiln::Shape;

/// The CPU's work for a call of `op` with f32 operands of these shapes.
kiln::KernelWork cpu_work(Op op, const std::vector<Shape>& inputs, const Shape& out,
                          const kiln::Attrs& attrs) {
  return kiln::kernel_work(kiln::cpu_backend().target(),
                           kiln::test::F32Call(op, inputs, out, attrs).query());
}

} // namespace

TEST_CASE("cost model: a kernel takes the longer of its arithmetic and its traffic, plus its "
          "start") {
  kiln::CostModel model{.peak = {.threads = 1, .gflops = 100.0, .gbytes_per_s = 10.0}};
  // 1.7 GFLOP at 85% of 100 GFLOP/s: 20 ms; 0.1 GB at half of 10 GB/s: 20 ms.
  CHECK(model.seconds({.flops = 1.7e9, .bytes = 1e8}) ==
        doctest::Approx(0.020 + model.start_seconds).epsilon(1e-9));
  // Traffic-bound: 1 GB at half the copy bandwidth; a packing phase comes before the rest.
  CHECK(model.seconds({.flops = 1e6, .bytes = 1e9}) ==
        doctest::Approx(0.2 + model.start_seconds).epsilon(1e-9));
  CHECK(model.seconds({.flops = 1.7e9, .bytes = 1e8, .packed_bytes = 5e7}) ==
        doctest::Approx(0.030 + model.start_seconds).epsilon(1e-9));
  // Traffic that fits in the caches streams at their rate, falling to the memory's rate
  // between the sizes the two were measured at.
  model.peak.cache_gbytes_per_s = 40.0;
  CHECK(model.bandwidth(1e6) == 40.0);
  CHECK(model.bandwidth(1e9) == 10.0);
  CHECK(model.bandwidth(16.0 * (1 << 20)) == doctest::Approx(20.0));
  model.peak.cache_gbytes_per_s = 0.0;
  // A half-filled tile halves the arithmetic rate.
  CHECK(model.seconds({.flops = 1.7e9, .bytes = 0, .compute_fill = 0.5}) ==
        doctest::Approx(0.040 + model.start_seconds).epsilon(1e-9));
  // Several workers pay for handing out the work.
  model.peak.threads = 2;
  CHECK(model.seconds({.flops = 1.7e9, .bytes = 1e8}) ==
        doctest::Approx(0.020 + model.start_seconds + model.split_seconds).epsilon(1e-9));
  // Without a measured peak there is no prediction.
  CHECK(kiln::CostModel{}.seconds({.flops = 1e9, .bytes = 1e9}) == 0.0);
}

TEST_CASE("cost model: tile and depth fill") {
  CHECK(kiln::tile_fill(32, 8) == 1.0);
  CHECK(kiln::tile_fill(10, 16) == doctest::Approx(10.0 / 16.0));
  CHECK(kiln::tile_fill(50, 48) == doctest::Approx(50.0 / 96.0));
  CHECK(kiln::depth_fill(12, 12.0) == doctest::Approx(0.5));
  CHECK(kiln::depth_fill(1188, 12.0) == doctest::Approx(0.99));
}

TEST_CASE("cost model: the CPU counts a column matrix only where its convolution writes one") {
  kiln::Conv2dAttrs a{.kernel_h = 3, .kernel_w = 3, .input_h = 26, .input_w = 26};
  // 32 -> 64 channels: too many output channels for shifted rows, so im2col writes
  // 8 x 288 x 576 floats and reads them back.
  const kiln::KernelWork columns =
      cpu_work(Op::Conv2d, {{8, 32, 26, 26}, {64, 32, 3, 3}}, {8, 64, 24, 24}, a);
  const double operands = 4.0 * (8 * 32 * 26 * 26 + 64 * 32 * 9 + 8 * 64 * 24 * 24);
  CHECK(columns.bytes == operands + 2.0 * 4.0 * 8 * 288 * 576);
  CHECK(columns.flops == 2.0 * 8 * 64 * 576 * 288);
  // 1 -> 6 channels at stride 1 reads shifted rows of the padded image: no column matrix.
  a.input_h = a.input_w = 28;
  CHECK(cpu_work(Op::Conv2d, {{8, 1, 28, 28}, {6, 1, 3, 3}}, {8, 6, 26, 26}, a).bytes ==
        4.0 * (8 * 28 * 28 + 6 * 9 + 8 * 6 * 26 * 26));
  // Channels-last kernels read the image in place.
  a.channels_last = true;
  a.input_h = a.input_w = 26;
  CHECK(cpu_work(Op::Conv2d, {{8, 26, 26, 32}, {3, 3, 32, 64}}, {8, 24, 24, 64}, a).bytes ==
        operands);
}

TEST_CASE("cost model: a GEMM whose rows leave the register tiles part empty is predicted "
          "slower") {
  const kiln::MatMulAttrs attrs{};
  // 64 x 96 results with inner products of 512 against 60 x 96: the same tiles, less work.
  const kiln::KernelWork full = cpu_work(Op::MatMul, {{64, 512}, {512, 96}}, {64, 96}, attrs);
  const kiln::KernelWork ragged = cpu_work(Op::MatMul, {{60, 512}, {512, 96}}, {60, 96}, attrs);
  CHECK(full.compute_fill > ragged.compute_fill);
  CHECK(full.compute_fill <= 1.0);
  CHECK(ragged.compute_fill > 0.0);
  const kiln::CostModel model{.peak = {.threads = 1, .gflops = 50.0, .gbytes_per_s = 20.0}};
  CHECK(model.seconds(ragged) == doctest::Approx(model.seconds(full)).epsilon(0.02));
}

TEST_CASE("cost model: a compiled step's prediction is the sum of its kernels'") {
  kiln::Graph g;
  const auto x = g.input("x", {8, 1, 28, 28});
  const auto y = g.input("y", {8}, kiln::i32);
  kiln::nn::manual_seed(3);
  kiln::nn::Sequential net = kiln::nn::models::mnist_cnn();
  (void)kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                         kiln::optim::SGD{.lr = 0.01f});
  kiln::Executor exe = kiln::compile(g, {.threads = 1, .profile = true});
  const kiln::MachinePeak peak{.threads = 1, .gflops = 50.0, .gbytes_per_s = 20.0};
  const double predicted = kiln::predicted_run_seconds(exe.plan(), peak);
  double sum = 0.0, conv = 0.0;
  for (const kiln::StepProfile& s : kiln::profile_steps(exe, peak)) {
    CHECK(s.predicted_seconds > 0.0);
    sum += s.predicted_seconds;
    if (s.op == Op::Conv2d || s.op == Op::Conv2dGradInput || s.op == Op::Conv2dGradWeight)
      conv += s.predicted_seconds;
  }
  CHECK(predicted == doctest::Approx(sum));
  // The convolutions do most of the arithmetic, so most of the predicted time is theirs.
  CHECK(conv > 0.5 * predicted);
}
