// The op harness over every row: kernels against the scalar references on every CPU target and
// thread count, in place exactly where each op allows it, gradients against finite differences.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "ops/op_harness.hpp"
#include "ops/op_rows.hpp"
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
