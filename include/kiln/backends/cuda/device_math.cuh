// The math policy of the CUDA kernels: the member functions of kiln::ScalarMath over device
// floats, so every elementwise op's one-line body (OpDef::apply) runs on the GPU unchanged.
#pragma once

#include <cuda_runtime.h>

#include "kiln/ops/scalar_math.hpp"

namespace kiln::cuda {

/// Mirrors kiln::ScalarMath member for member, with the same IEEE behaviour: max keeps a NaN
/// of either operand (max_keeping_nan, not fmaxf), rsqrt divides (no approximate rsqrtf).
struct DeviceMath {
  using V = float;
  __device__ static V zero() { return 0.0f; }
  __device__ static V add(V a, V b) { return a + b; }
  __device__ static V sub(V a, V b) { return a - b; }
  __device__ static V mul(V a, V b) { return a * b; }
  __device__ static V div(V a, V b) { return a / b; }
  __device__ static V max(V a, V b) { return max_keeping_nan(a, b); }
  __device__ static V neg(V a) { return -a; }
  __device__ static V exp(V a) { return expf(a); }
  __device__ static V log(V a) { return logf(a); }
  __device__ static V sqrt(V a) { return sqrtf(a); }
  __device__ static V rsqrt(V a) { return 1.0f / sqrtf(a); }
  /// v where cond > 0, else 0.
  __device__ static V where_positive(V cond, V v) { return cond > 0.0f ? v : 0.0f; }
};

} // namespace kiln::cuda
