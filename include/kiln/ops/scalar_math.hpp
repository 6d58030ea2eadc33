// The scalar math policy: elementwise op bodies evaluated one float at a time. It is the
// reference the SIMD kernels are tested against, and their tail loop.
#pragma once

#include <algorithm>
#include <cmath>

namespace kiln {

/// Math policy over plain floats. The SIMD policy (backends/cpu/elementwise-inl.hpp) has
/// the same member functions over Highway vectors, so one op body serves both.
struct ScalarMath {
  using V = float;
  static V zero() { return 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V max(V a, V b) { return std::max(a, b); }
  static V neg(V a) { return -a; }
  static V exp(V a) { return std::exp(a); }
  static V log(V a) { return std::log(a); }
  static V sqrt(V a) { return std::sqrt(a); }
  static V rsqrt(V a) { return 1.0f / std::sqrt(a); }
  /// v where cond > 0, else 0.
  static V where_positive(V cond, V v) { return cond > 0.0f ? v : 0.0f; }
};

} // namespace kiln
