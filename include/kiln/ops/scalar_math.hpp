// The scalar math policy: elementwise op bodies evaluated one float at a time. It is the
// reference the SIMD kernels are tested against, and their tail loop.
#pragma once

#include <cmath>

#include "kiln/core/host_device.hpp"

namespace kiln {

/// The larger of a and b, NaN when either is NaN, as PyTorch's max and relu: a NaN never
/// turns into a number on its way through relu or a max pool, on any target.
KILN_HOST_DEVICE inline float max_keeping_nan(float a, float b) {
  return a < b || b != b ? b : a; // b != b only for NaN; std::isnan is not on every device
}

/// Math policy over plain floats. The SIMD policy (backends/cpu/elementwise-inl.hpp) has
/// the same member functions over Highway vectors, so one op body serves both.
struct ScalarMath {
  using V = float;
  static V zero() { return 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V max(V a, V b) { return max_keeping_nan(a, b); }
  static V neg(V a) { return -a; }
  static V exp(V a) { return std::exp(a); }
  static V log(V a) { return std::log(a); }
  static V sqrt(V a) { return std::sqrt(a); }
  static V rsqrt(V a) { return 1.0f / std::sqrt(a); }
  /// v where cond > 0, else 0.
  static V where_positive(V cond, V v) { return cond > 0.0f ? v : 0.0f; }
};

} // namespace kiln
