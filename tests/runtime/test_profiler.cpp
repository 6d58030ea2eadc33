// Profiler tests: FLOP counts from the op definitions, bytes per step, per-run times of an
// executed plan, and the machine peak the profile is measured against.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "support/graph_test_helpers.hpp"

namespace {

using kiln::Attrs;
using kiln::Op;
using kiln::Shape;

/// A plan step of `op` over buffers of these shapes (no memory: only shapes matter here).
kiln::PlanStep step_of(Op op, const std::vector<Shape>& inputs, const Shape& out, Attrs attrs) {
  kiln::PlanStep s;
  s.op = op;
  s.num_inputs = static_cast<int>(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) s.inputs[i].shape = inputs[i];
  s.output.shape = out;
  s.attrs = std::move(attrs);
  return s;
}

} // namespace

TEST_CASE("profiler: FLOPs of anchors count two per multiply-add, gradients included") {
  const Attrs conv = kiln::Conv2dAttrs{};
  // 2 images x 4 channels x 6 x 6 outputs, each 3 x 3 x 3 taps.
  const double conv_flops = 2.0 * (2 * 4 * 6 * 6) * (3 * 3 * 3);
  CHECK(kiln::step_flops(step_of(Op::Conv2d, {{2, 3, 8, 8}, {4, 3, 3, 3}}, {2, 4, 6, 6}, conv)) ==
        conv_flops);
  CHECK(kiln::step_flops(step_of(Op::Conv2dGradInput, {{2, 4, 6, 6}, {4, 3, 3, 3}}, {2, 3, 8, 8},
                                 conv)) == conv_flops);
  CHECK(kiln::step_flops(step_of(Op::Conv2dGradWeight, {{2, 3, 8, 8}, {2, 4, 6, 6}}, {4, 3, 3, 3},
                                 conv)) == conv_flops);
  kiln::Conv2dAttrs channels_last;
  channels_last.channels_last = true;
  CHECK(kiln::step_flops(step_of(Op::Conv2d, {{2, 8, 8, 3}, {3, 3, 3, 4}}, {2, 6, 6, 4},
                                 channels_last)) == conv_flops);

  CHECK(kiln::step_flops(step_of(Op::MatMul, {{5, 7}, {7, 3}}, {5, 3}, kiln::MatMulAttrs{})) ==
        2.0 * 5 * 3 * 7);
  CHECK(kiln::step_flops(step_of(Op::MatMul, {{7, 5}, {7, 3}}, {5, 3},
                                 kiln::MatMulAttrs{true, false})) == 2.0 * 5 * 3 * 7);
  // Data movement computes nothing; a reduction adds every input element once.
  CHECK(kiln::step_flops(step_of(Op::Transpose, {{2, 3}}, {3, 2}, kiln::TransposeAttrs{{1, 0}})) ==
        0.0);
  CHECK(kiln::step_flops(step_of(Op::SumTo, {{64, 10}}, {1, 10}, kiln::ShapeAttrs{Shape{1, 10}})) ==
        640.0);
  CHECK(kiln::step_bytes(step_of(Op::Relu, {{4, 5}}, {4, 5}, {})) == 2.0 * 20 * sizeof(float));
}

TEST_CASE("profiler: an executed plan's steps with time per run, FLOPs and bytes") {
  kiln::Graph g;
  const auto x = g.input("x", {16, 32});
  const auto w = g.param("w", kiln::test::random_tensor({32, 8}, 1));
  const auto y = kiln::relu(kiln::matmul(x, w));
  g.mark_output(y);
  kiln::Executor exe = kiln::compile(g, {.threads = 1, .profile = true});
  exe.set_input("x", kiln::test::random_inputs(16 * 32, 2));
  for (int i = 0; i < 3; ++i) exe.run();
  CHECK(exe.profiled_runs() == 3);
  const std::vector<kiln::StepProfile> steps = kiln::profile_steps(exe);
  REQUIRE(steps.size() == exe.plan().steps.size());
  bool found_matmul = false;
  for (const kiln::StepProfile& s : steps) {
    CHECK(s.seconds >= 0.0);
    if (s.op != Op::MatMul) continue;
    found_matmul = true;
    // The relu rides in the matmul's epilogue: one more operation per output element.
    CHECK(s.flops == 2.0 * 16 * 8 * 32 + 16 * 8);
    CHECK(s.bytes == (16 * 32 + 32 * 8 + 16 * 8) * 4.0);
  }
  CHECK(found_matmul);

  const kiln::MachinePeak peak{1, 100.0, 10.0};
  char text[4096] = {};
  std::FILE* out = fmemopen(text, sizeof text - 1, "w");
  REQUIRE(out != nullptr);
  kiln::print_profile(out, exe, peak);
  std::fclose(out);
  const std::string printed = text;
  CHECK(printed.find("100 GFLOP/s") != std::string::npos);
  CHECK(printed.find("matmul") != std::string::npos);
}

TEST_CASE("profiler: the machine peak is measured, once per thread count") {
  kiln::Graph g;
  g.mark_output(kiln::relu(g.input("x", {4})));
  const kiln::Executor exe = kiln::compile(g, {.threads = 1});
  const kiln::MachinePeak peak = kiln::machine_peak(exe.plan());
  CHECK(peak.threads == 1);
  // Any core kiln runs on does more than 1 GFLOP/s; a loop the compiler dropped would report
  // far more than any core can.
  CHECK(peak.gflops > 1.0);
  CHECK(peak.gflops < 10000.0);
  CHECK(peak.gbytes_per_s > 0.1);
  CHECK(kiln::machine_peak(exe.plan()).gflops == peak.gflops);
}
