// Helpers the graph-level tests share: the code or message of the kiln::Error a call throws,
// seeded random values, and one graph compiled with and without a pass.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "kiln/kiln.hpp"

namespace kiln::test {

/// The stable code of the kiln::Error that f throws, or "no error".
template <class F> std::string error_code(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return "no error";
}

/// The full message of the kiln::Error that f throws, or "no error".
template <class F> std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

/// A tensor of values uniform in [lo, hi), seeded; values closer to 0 than `gap` are drawn
/// again (finite differences of kinked ops need them away from the kink).
inline std::shared_ptr<Tensor> random_tensor(const Shape& shape, std::uint64_t seed,
                                             float lo = -1.0f, float hi = 1.0f, float gap = 0.0f) {
  auto t = std::make_shared<Tensor>(shape);
  Rng rng(seed);
  for (float& v : t->f32()) {
    do v = rng.uniform(lo, hi);
    while (std::abs(v) < gap);
  }
  return t;
}

/// n input values uniform in [-1, 1), seeded.
/// A pass context for the CPU, whose kernels the layout and reduction passes ask about.
inline PassContext cpu_context() {
  PassContext ctx;
  ctx.target = cpu_backend().target();
  return ctx;
}

inline std::vector<float> random_inputs(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  Rng rng(seed);
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

/// Compiles g with every pass but `both_without`, and again without `pass` too, feeds both the
/// same input "x" and returns (with, without) for `out`, after checking the pass did change the
/// graph.
inline std::pair<std::vector<float>, std::vector<float>>
with_and_without(Graph& g, Value out, const std::string& pass, int threads = 2,
                 const std::vector<std::string>& both_without = {}) {
  std::pair<std::vector<float>, std::vector<float>> results;
  const Shape xs = g.node(g.find_input("x")).type.shape;
  const std::vector<float> x = random_inputs(xs.numel(), 99);
  for (int off = 0; off < 2; ++off) {
    std::vector<std::string> disable = both_without;
    if (off) disable.push_back(pass);
    auto exe = compile(g, {.threads = threads, .disable = disable});
    if (!off) CHECK(exe.report().pass(pass)->changed);
    CHECK(!find_overlap(exe.plan().buffers, exe.plan().memory));
    exe.set_input("x", x);
    exe.run();
    const auto o = exe.output(out);
    (off ? results.second : results.first).assign(o.begin(), o.end());
  }
  return results;
}

} // namespace kiln::test
