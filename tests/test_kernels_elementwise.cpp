// Elementwise kernels: every elementwise op, on every compiled SIMD target, with and without
// broadcasting, against the scalar reference built from the same op body (ScalarMath).
// Tolerance: |simd - scalar| <= 1e-5·max(1, |scalar|) (exp and log differ in the last bits).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kiln/backends/cpu/broadcast_loop.hpp"
#include "kiln/kiln.hpp"
#include "kiln/ops/scalar_math.hpp"
#include "target_loop.hpp"

namespace {

using kiln::Op;
using kiln::Shape;

std::vector<float> random_values(std::int64_t n, std::uint64_t seed, bool positive) {
  kiln::Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = positive ? rng.uniform(0.25f, 3.0f) : rng.uniform(-3.0f, 3.0f);
  return v;
}

/// Index of the element of an input of shape `in` that output index `flat` reads.
std::int64_t broadcast_index(const Shape& out, const Shape& in, std::int64_t flat) {
  const Shape padded = kiln::pad_rank(in, out.rank());
  std::int64_t index = 0, stride = 1;
  for (int d = out.rank() - 1; d >= 0; --d) {
    const std::int64_t coord = flat % out[d];
    flat /= out[d];
    if (padded[d] != 1) index += coord * stride;
    stride *= padded[d];
  }
  return index;
}

template <Op op> float scalar_reference(float a, float b, float s) {
  return kiln::OpDef<op>::apply(kiln::ScalarMath{}, a, b, s);
}

using ReferenceFn = float (*)(float, float, float);

constexpr std::array<ReferenceFn, kiln::op_count> reference_table() {
  std::array<ReferenceFn, kiln::op_count> t{};
#define KILN_REFERENCE(name, spelling)                                                             \
  if constexpr (kiln::OpDef<Op::name>::is_elementwise)                                             \
    t[kiln::op_index(Op::name)] = &scalar_reference<Op::name>;
  KILN_OP_LIST(KILN_REFERENCE)
#undef KILN_REFERENCE
  return t;
}

struct ShapeCase {
  Shape out, a, b;
};

} // namespace

TEST_CASE("elementwise kernels match the scalar reference on every target") {
  constexpr auto reference = reference_table();
  const ShapeCase cases[] = {
      {{3, 17}, {3, 17}, {3, 17}},                // same shape, a tail after the vectors
      {{2, 3, 5, 7}, {2, 3, 5, 7}, {1, 3, 1, 1}}, // per-channel bias over NCHW
      {{4, 33}, {4, 33}, {33}},                   // row bias
      {{5, 6}, {5, 1}, {1, 6}},                   // outer product shape
      {{1}, {1}, {1}},                            // one element
      {{2, 64, 13}, {1}, {2, 64, 13}},            // scalar on the left
      // Per-channel operands over channels-last tensors: rows of C elements are merged into
      // long ones, the channel row repeated (BroadcastLoop::widen).
      {{6, 5, 7, 16}, {6, 5, 7, 16}, {16}},
      {{4, 9, 11, 3}, {1, 1, 1, 3}, {4, 9, 11, 3}},
  };
  int ops_checked = 0;
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& table) {
    CAPTURE(table.target_name);
    for (std::size_t op = 0; op < kiln::op_count; ++op) {
      if (!reference[op]) continue;
      const auto info = kiln::op_info(static_cast<Op>(op));
      CAPTURE(info.name);
      REQUIRE(!table.variants[op].empty());
      const bool positive = info.name == "log" || info.name == "sqrt" || info.name == "rsqrt";
      for (const ShapeCase& c : cases) {
        // relu_grad takes equal shapes; other unary ops take the output's shape.
        const bool same_shape = info.name == "relu_grad";
        const Shape a_shape =
            (info.arity == 1 && info.name != "broadcast_to") || same_shape ? c.out : c.a;
        const Shape b_shape = same_shape ? c.out : c.b;
        auto a = random_values(a_shape.numel(), 1, positive);
        auto b = random_values(b_shape.numel(), 2, positive);
        std::vector<float> out(static_cast<std::size_t>(c.out.numel()), -7.0f);
        const kiln::Attrs attrs = kiln::ScalarAttrs{0.75f};
        kiln::KernelArgs args;
        args.num_inputs = info.arity;
        args.in[0] = {a.data(), a_shape, kiln::f32};
        args.in[1] = {b.data(), b_shape, kiln::f32};
        args.out = {out.data(), c.out, kiln::f32};
        args.attrs = &attrs;
        kiln::cpu::select(table, static_cast<Op>(op), args).kernel(args);
        for (std::int64_t i = 0; i < c.out.numel(); ++i) {
          const float av = a[static_cast<std::size_t>(broadcast_index(c.out, args.in[0].shape, i))];
          const float bv =
              info.arity > 1
                  ? b[static_cast<std::size_t>(broadcast_index(c.out, args.in[1].shape, i))]
                  : av;
          const float expected = reference[op](av, bv, 0.75f);
          CAPTURE(i);
          CHECK(std::abs(out[static_cast<std::size_t>(i)] - expected) <=
                1e-5f * std::max(1.0f, std::abs(expected)));
        }
      }
      ++ops_checked;
    }
  });
  CHECK(ops_checked >= 15 * 2); // every elementwise op on at least two targets
}

TEST_CASE("fill, assign and dropout_mask kernels on every target") {
  std::vector<float> first_mask;
  kiln::test::for_each_target([&](const kiln::cpu::KernelTable& table) {
    CAPTURE(table.target_name);
    std::vector<float> out(37, 0.0f);
    const kiln::Attrs fill = kiln::FillAttrs{2.5f, Shape{37}};
    kiln::KernelArgs args;
    args.out = {out.data(), Shape{37}, kiln::f32};
    args.attrs = &fill;
    kiln::cpu::select(table, Op::Fill, args).kernel(args);
    for (float v : out) CHECK(v == 2.5f);

    std::vector<float> src = random_values(37, 4, false);
    args.num_inputs = 2;
    args.in[0] = args.out;
    args.in[1] = {src.data(), Shape{37}, kiln::f32};
    kiln::cpu::select(table, Op::Assign, args).kernel(args);
    CHECK(out == src);

    const kiln::Attrs dropout = kiln::DropoutAttrs{0.5f, 11, Shape{1000}};
    std::vector<float> mask(1000);
    kiln::KernelArgs margs;
    margs.out = {mask.data(), Shape{1000}, kiln::f32};
    margs.attrs = &dropout;
    margs.run_counter = 3;
    kiln::cpu::select(table, Op::DropoutMask, margs).kernel(margs);
    if (first_mask.empty()) first_mask = mask;
    CHECK(mask == first_mask); // a pure function of (seed, run, index) on every target
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
