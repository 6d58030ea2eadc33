// Shared harness of the kernel tests: run one kernel the way the executor does, and measure
// its error against a reference.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include <tbb/task_arena.h>

#include "kiln/backends/cpu/backend.hpp"

namespace kiln::test {

/// n values uniform in [lo, hi), seeded.
inline std::vector<float> random_values(std::int64_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& f : v) f = dist(gen);
  return v;
}

/// Few distinct values, so pooling windows contain ties.
inline std::vector<float> tied_values(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, 2);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& f : v) f = static_cast<float>(dist(gen));
  return v;
}

/// One call of `op` on f32 operands and result of these shapes, as kernel selection and the
/// cost model are asked about it; the query points into this object.
struct F32Call {
  Op op;
  std::vector<TensorType> in;
  TensorType out;
  Attrs attrs;
  F32Call(Op o, const std::vector<Shape>& inputs, const Shape& result, Attrs a)
      : op(o), out{result, f32}, attrs(std::move(a)) {
    for (const Shape& s : inputs) in.push_back({s, f32});
  }
  [[nodiscard]] KernelQuery query() const { return {op, &attrs, in, out}; }
};

inline TensorView view(std::vector<float>& v, const Shape& s) {
  return TensorView{v.data(), s, DType::f32};
}
inline TensorView view(std::vector<std::int32_t>& v, const Shape& s) {
  return TensorView{v.data(), s, DType::i32};
}

/// One cache line; a vector of these is 64-byte aligned workspace memory.
struct alignas(64) Line {
  std::byte bytes[64];
};

/// Runs `op` with a workspace for every thread of the current arena. The workspace starts as
/// NaN bytes and the output as NaN, so reading unset scratch or skipping an output fails;
/// the workspace has exactly the promised size, so the address sanitizer sees an overrun.
inline std::vector<float> run_kernel(const cpu::KernelTable& t, Op op,
                                     std::initializer_list<TensorView> inputs,
                                     const Shape& out_shape, const Attrs* attrs = nullptr) {
  std::vector<float> out(static_cast<std::size_t>(out_shape.numel()),
                         std::numeric_limits<float>::quiet_NaN());
  KernelArgs args;
  for (const TensorView& in : inputs) args.in[static_cast<std::size_t>(args.num_inputs++)] = in;
  args.out = view(out, out_shape);
  args.attrs = attrs;
  const KernelChoice choice = cpu::select(t, op, args);
  INFO(choice.name);
  REQUIRE(static_cast<bool>(choice.kernel));
  args.workspace_per_worker = choice.workspace_per_worker;
  CHECK(args.workspace_per_worker % 64 == 0);
  const auto threads = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  std::vector<Line> workspace(
      std::max<std::size_t>(1, threads * args.workspace_per_worker / sizeof(Line)));
  std::fill_n(reinterpret_cast<unsigned char*>(workspace.data()), workspace.size() * sizeof(Line),
              0xff);
  args.workspace = reinterpret_cast<std::byte*>(workspace.data());
  choice.kernel(args);
  return out;
}

/// max |got - want| / max |want|; equal values (infinities included) count as no error, a
/// NaN where the reference has a number as infinite error.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 0.0, err = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    if (got[i] == want[i]) continue;
    const double e = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    err = std::max(err, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  return err == 0.0 ? 0.0 : err / std::max(scale, 1e-30);
}

} // namespace kiln::test
