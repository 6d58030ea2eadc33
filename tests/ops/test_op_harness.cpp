// The op harness over every row: kernels against the scalar references on every CPU target and
// thread count, in place exactly where each op allows it, gradients against finite differences.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/kiln.hpp"
#include "ops/op_harness.hpp"
#include "ops/op_rows.hpp"
#include "support/kernel_harness.hpp"
#include "support/skip.hpp"
#include "support/target_loop.hpp"

namespace {

using kiln::Op;
using kiln::test::OpRow;

/// The operand a row's in-place run copies (so that it dies at the node), and whether the
/// op's definition lets the node write over it: the operand it may overwrite, else one of the
/// output's size and type it may not; -1 when the row has neither.
std::pair<int, bool> in_place_candidate(const OpRow& row, const kiln::TensorType& out) {
  if (kiln::op_info(row.op).role == kiln::OpRole::update) return {1, true};
  if (const int k = kiln::test::overwritable_operand(row, out); k >= 0) return {k, true};
  return {kiln::test::same_sized_operand(row, out), false};
}

/// `v` rounded to the nearest bfloat16, ties to even (no NaN among the drawn values).
float to_bf16(float v) {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  return std::bit_cast<float>(rounded);
}

/// Whether `table` has a kernel of `op` that multiplies in bfloat16.
bool has_bf16_variant(const kiln::cpu::KernelTable& table, Op op) {
  for (const kiln::KernelVariant& v : table.variants[kiln::op_index(op)])
    if (v.precision == kiln::Precision::bf16) return true;
  return false;
}

} // namespace

TEST_CASE("op harness: every op a graph holds has rows that fit it, with a reference") {
  std::array<int, kiln::op_count> rows{}, gradient_rows{};
  for (const OpRow& row : kiln::test::op_rows()) {
    INFO(kiln::test::row_name(row));
    CHECK_NOTHROW((void)kiln::test::row_output(row));
    ++rows[kiln::op_index(row.op)];
    if (row.gradient) ++gradient_rows[kiln::op_index(row.op)];
  }
  for (std::size_t i = 0; i < kiln::op_count; ++i) {
    const kiln::OpInfo& info = kiln::op_info(static_cast<Op>(i));
    if (info.is_source()) continue;
    INFO(info.name);
    CHECK(rows[i] > 0);
    CHECK(static_cast<bool>(kiln::test::reference_of(static_cast<Op>(i))));
    if (info.grad) CHECK(gradient_rows[i] > 0);
  }
}

TEST_CASE("op harness: every row's kernel matches its reference on every CPU target, 2 threads") {
  int runs = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 1);
    const auto want = kiln::test::expected(row, values, kiln::test::row_output(row));
    kiln::test::for_each_target([&](const kiln::cpu::KernelTable& table) {
      INFO("target " << std::string(table.target_name));
      const kiln::cpu::CpuBackend backend(&table);
      const kiln::test::RowRun run = kiln::test::run_row(backend, row, values, 2);
      INFO("kernel " << run.kernel_name);
      CHECK(kiln::test::relative_error(run.out, want) <= row.tolerance);
      ++runs;
    });
  }
  CHECK(runs >= 2 * static_cast<int>(kiln::test::op_rows().size())); // at least two targets
}

TEST_CASE("op harness: rows that ask for the Winograd domain run the Winograd kernels") {
  int rows = 0;
  std::array<int, 2> tiles{};
  for (const OpRow& row : kiln::test::op_rows()) {
    const auto* conv = std::get_if<kiln::Conv2dAttrs>(&row.attrs);
    if (!conv || !conv->winograd) continue;
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 1);
    const kiln::test::RowRun run = kiln::test::run_row(kiln::cpu_backend(), row, values, 2);
    CHECK(run.kernel_name.ends_with(".winograd"));
    ++rows;
    const kiln::Shape& out = kiln::test::row_output(row).shape;
    ++tiles[kiln::cpu::winograd_tile(row.op, out[1], out[2]) == 4 ? 1 : 0];
  }
  CHECK(rows >= 10);
  // Both output tiles of the forward pass and input gradient, F(2x2, 3x3) and F(4x4, 3x3), ran
  // (the weight gradient's rows count as F(2x2) ones).
  CHECK(tiles[0] >= 2 + rows / 3);
  CHECK(tiles[1] >= 8);
}

TEST_CASE("op harness: channels-last input gradients of too few channels for whole vectors "
          "run the scatter kernel") {
  int rows = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    const auto* conv = std::get_if<kiln::Conv2dAttrs>(&row.attrs);
    if (row.op != Op::Conv2dGradInput || !conv || !conv->channels_last) continue;
    const kiln::Shape& weight = row.operands[1].type.shape;
    const std::int64_t channels = weight[3], columns = weight[1];
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 1);
    const kiln::test::RowRun run = kiln::test::run_row(kiln::cpu_backend(), row, values, 2);
    CHECK(run.kernel_name.ends_with(".scatter") == (channels % 16 != 0));
    if (channels % 16 != 0) {
      CHECK(columns * channels <= 64);
      ++rows;
    }
  }
  CHECK(rows >= 9);
}

TEST_CASE("op harness: convolution kernels write every output element, from NaN-filled output "
          "and scratch, on every CPU target, 2 threads") {
  // A compiled step's arena may hold zeros where a kernel forgot to write; here it holds NaN.
  tbb::task_arena arena(2);
  int runs = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    if (row.op != Op::Conv2d && row.op != Op::Conv2dGradInput && row.op != Op::Conv2dGradWeight)
      continue;
    INFO(kiln::test::row_name(row));
    auto values = kiln::test::draw_all(row, 1);
    const kiln::TensorType out = kiln::test::row_output(row);
    const auto want = kiln::test::expected(row, values, out);
    kiln::test::for_each_target([&](const kiln::cpu::KernelTable& table) {
      INFO("target " << std::string(table.target_name));
      const std::vector<float> got = arena.execute([&] {
        return kiln::test::run_kernel(table, row.op,
                                      {kiln::test::view(values[0].f32, row.operands[0].type.shape),
                                       kiln::test::view(values[1].f32, row.operands[1].type.shape)},
                                      out.shape, &row.attrs);
      });
      CHECK(kiln::test::relative_error(got, want) <= row.tolerance);
      ++runs;
    });
  }
  CHECK(runs >= 100);
}

TEST_CASE("op harness: every row's kernel matches its reference on 1 thread") {
  for (const OpRow& row : kiln::test::op_rows()) {
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 2);
    const auto want = kiln::test::expected(row, values, kiln::test::row_output(row));
    const kiln::test::RowRun run = kiln::test::run_row(kiln::cpu_backend(), row, values, 1);
    CHECK(kiln::test::relative_error(run.out, want) <= row.tolerance);
  }
}

TEST_CASE("op harness: a kernel writes over a dying input exactly where its op allows it") {
  int in_place = 0, kept_apart = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    const kiln::TensorType out = kiln::test::row_output(row);
    const auto [operand, allowed] = in_place_candidate(row, out);
    if (operand < 0) continue;
    INFO(kiln::test::row_name(row) << ", operand " << operand << " dying at it");
    const auto values = kiln::test::draw_all(row, 3);
    const auto want = kiln::test::expected(row, values, out);
    const kiln::test::RowRun run =
        kiln::test::run_row(kiln::cpu_backend(), row, values, 2, operand);
    CHECK(run.in_place_of == (allowed ? operand : -1));
    CHECK(kiln::test::relative_error(run.out, want) <= row.tolerance);
    ++(allowed ? in_place : kept_apart);
  }
  CHECK(in_place > 50);
  CHECK(kept_apart > 10);
}

TEST_CASE("op harness: gradients match central finite differences") {
  for (const OpRow& row : kiln::test::op_rows()) {
    if (!row.gradient) continue;
    INFO(kiln::test::row_name(row));
    const kiln::GradCheckResult r = kiln::test::check_row_gradient(row, 7);
    INFO(r.worst);
    CHECK(r.ok);
  }
}

TEST_CASE("op harness: with Precision::bf16, kernels multiply bfloat16-rounded operands and add "
          "in FP32") {
  const kiln::cpu::KernelTable& table = kiln::cpu::kernel_table();
  if (!table.bf16_products) {
    kiln::test::skip("this CPU has no AVX512-BF16, so no kernel multiplies in bfloat16");
    return;
  }
  int bf16_runs = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    if (!has_bf16_variant(table, row.op)) continue;
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 3);
    auto rounded = values;
    for (auto& v : rounded)
      for (float& f : v.f32) f = to_bf16(f);
    const kiln::TensorType out = kiln::test::row_output(row);
    const auto exact = kiln::test::expected(row, values, out);
    const auto of_rounded = kiln::test::expected(row, rounded, out);
    const kiln::test::RowRun run =
        kiln::test::run_row(kiln::cpu_backend(), row, values, 2, -1, kiln::Precision::bf16);
    INFO("kernel " << run.kernel_name);
    if (!run.kernel_name.ends_with(".bf16")) { // shapes its bf16 kernels do not take
      CHECK(kiln::test::relative_error(run.out, exact) <= row.tolerance);
      continue;
    }
    ++bf16_runs;
    // The products of the rounded operands are exact in FP32: only the order of the sums
    // differs from the reference's.
    CHECK(kiln::test::relative_error(run.out, of_rounded) <= row.tolerance);
    // 8 bits of mantissa per operand: about 2^-8 of the largest result.
    CHECK(kiln::test::relative_error(run.out, exact) <= 2e-2);
  }
  CHECK(bf16_runs > 0);
}

TEST_CASE("compile: Precision::bf16 where no kernel multiplies in bfloat16 is "
          "kiln.target.precision, naming the device") {
  kiln::Graph g;
  const kiln::Value x = g.input("x", kiln::Shape{4, 8});
  const kiln::Value w = g.input("w", kiln::Shape{8, 3});
  g.mark_output(kiln::matmul(x, w));
  int refused = 0;
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& t) {
    INFO("target " << std::string(t.target_name));
    const kiln::cpu::CpuBackend backend(&t);
    const kiln::CompileOptions bf16{.precision = kiln::Precision::bf16};
    if (t.bf16_products) {
      CHECK_NOTHROW((void)kiln::compile(g, backend, bf16));
      return;
    }
    ++refused;
    try {
      (void)kiln::compile(g, backend, bf16);
      FAIL("compiled for bf16 without bf16 kernels");
    } catch (const kiln::Error& e) {
      CHECK(e.code() == kiln::errc::precision);
      CHECK(e.message().find(t.target_name) != std::string::npos);
      CHECK(e.message().find("Precision::f32") != std::string::npos);
    }
    // Lowering directly, without compile(), refuses it too rather than running FP32.
    CHECK_THROWS_AS((void)kiln::lower(g, backend, {.precision = kiln::Precision::bf16}),
                    kiln::Error);
  });
  // Every machine has at least one target without AVX512-BF16 (the scalar or SSE ones).
  CHECK(refused > 0);
  kiln::Target described;
  described.backend = "cuda";
  CHECK_THROWS_AS(kiln::check_precision(described, kiln::Precision::bf16), kiln::Error);
  CHECK_NOTHROW(kiln::check_precision(described, kiln::Precision::f32));
}
