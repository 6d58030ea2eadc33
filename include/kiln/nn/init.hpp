// Parameter initialisation like PyTorch's defaults, from one seeded generator.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>

#include "kiln/core/rng.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::nn {

/// The generator layers draw their initial weights and dropout seeds from.
inline Rng& default_generator() {
  static Rng rng(0x6b696c6eULL);
  return rng;
}

/// Reseeds the generator: the same seed and the same layer order give the same weights.
inline void manual_seed(std::uint64_t seed) { default_generator() = Rng(seed); }

/// A tensor of `shape` with elements uniform in [-bound, bound).
inline std::shared_ptr<Tensor> uniform_tensor(Shape shape, float bound) {
  auto t = std::make_shared<Tensor>(shape);
  for (float& v : t->f32()) v = default_generator().uniform(-bound, bound);
  return t;
}

/// PyTorch's default for Conv2d and Linear weights and biases: kaiming_uniform with
/// a = sqrt(5) gives the bound 1/sqrt(fan_in), and the bias uses the same bound.
inline float default_init_bound(std::int64_t fan_in) {
  return 1.0f / std::sqrt(static_cast<float>(fan_in));
}

/// A tensor filled with `value`.
inline std::shared_ptr<Tensor> constant_tensor(Shape shape, float value) {
  auto t = std::make_shared<Tensor>(shape);
  for (float& v : t->f32()) v = value;
  return t;
}

} // namespace kiln::nn
