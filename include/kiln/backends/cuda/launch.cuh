// What every CUDA kernel family shares: launching on the context's stream with the first
// failure recorded (launchers never throw), grid sizes, and the broadcast index arithmetic
// of elementwise operands.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/backends/cuda/kernel_table.hpp"
#include "kiln/ops/broadcast.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cuda {

/// Threads per block of the one-dimensional kernels.
inline constexpr int block_threads = 256;

/// Blocks for `n` elements at `per_block` elements each, capped where grid-stride loops take
/// over (enough blocks to fill every multiprocessor many times).
inline unsigned blocks_for(std::int64_t n, std::int64_t per_block = block_threads) {
  const std::int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 65536));
}

/// Launches `kernel` on the context's stream, recording the first failure with `name`.
template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
            std::size_t shared_bytes, Args&&... args) {
  LaunchContext& context = launch_context();
  kernel<<<grid, block, shared_bytes, context.stream>>>(static_cast<Params>(args)...);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess && context.error == cudaSuccess) {
    context.error = error;
    context.failed_kernel = name;
  }
}

/// Grid-stride loop bounds of a one-dimensional kernel.
#define KILN_CUDA_FOR_EACH(i, n)                                                                   \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

/// Where element i of an output lives in each of its broadcast operands: the output's
/// dimensions and each operand's element strides over them (0 where it broadcasts). Passed to
/// kernels by value.
template <int operands> struct BroadcastIndex {
  int rank = 0;
  std::array<std::int64_t, Shape::max_rank> dims{};
  std::array<std::array<std::int64_t, Shape::max_rank>, operands> strides{};
  /// Bit k set where operand k has the output's shape: its offset is i itself.
  std::uint32_t same_shape = 0;
  /// The output has fewer than 2^31 elements: coordinates in 32-bit arithmetic.
  bool narrow = false;

  BroadcastIndex() = default;
  /// `shapes[k]` broadcasts to `out` (numpy rules, aligned at the innermost dimension).
  BroadcastIndex(const Shape& out, const Shape* shapes, int count)
      : rank(out.rank()), narrow(out.numel() < (std::int64_t{1} << 31)) {
    for (int d = 0; d < rank; ++d) dims[static_cast<std::size_t>(d)] = out[d];
    for (int k = 0; k < count; ++k) {
      const Shape padded = pad_rank(shapes[k], rank);
      std::int64_t stride = 1;
      for (int d = rank - 1; d >= 0; --d) {
        strides[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)] =
            padded[d] == 1 ? 0 : stride;
        stride *= padded[d];
      }
      if (shapes[k] == out) same_shape |= 1u << static_cast<unsigned>(k);
    }
  }

  /// Offsets of output element i in the first `count` operands. Coordinates are worked out
  /// only when an operand broadcasts.
  __device__ void offsets(std::int64_t i, int count, std::int64_t* out) const {
    const std::uint32_t all = (1u << count) - 1;
    if ((same_shape & all) == all) {
      for (int k = 0; k < count; ++k) out[k] = i;
      return;
    }
    std::int64_t coordinate[Shape::max_rank];
    if (narrow) {
      auto rest = static_cast<std::uint32_t>(i);
      for (int d = rank - 1; d >= 0; --d) {
        const auto extent = static_cast<std::uint32_t>(dims[static_cast<std::size_t>(d)]);
        coordinate[d] = rest % extent;
        rest /= extent;
      }
    } else {
      std::int64_t rest = i;
      for (int d = rank - 1; d >= 0; --d) {
        coordinate[d] = rest % dims[static_cast<std::size_t>(d)];
        rest /= dims[static_cast<std::size_t>(d)];
      }
    }
    for (int k = 0; k < count; ++k) {
      if (same_shape >> k & 1u) {
        out[k] = i;
        continue;
      }
      std::int64_t at = 0;
      for (int d = 0; d < rank; ++d)
        at += coordinate[d] * strides[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)];
      out[k] = at;
    }
  }
};

} // namespace kiln::cuda
