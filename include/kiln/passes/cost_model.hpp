// The cost model: how long one kernel call should take on a device, from the work its op
// defines and the device's measured speed, so that candidates can be weighed without running
// them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/target.hpp"

namespace kiln {

/// The yardsticks of a device on a number of workers, measured on this machine.
struct MachinePeak {
  int threads = 1;
  double gflops = 0.0;       ///< FP32 multiply-add peak of `threads` threads; 0 if unknown
  double gbytes_per_s = 0.0; ///< bytes read plus written per second by a large copy
  /// The same for a copy that stays in the caches; 0 if unknown (then gbytes_per_s serves).
  double cache_gbytes_per_s = 0.0;
};

/// The operands' bytes and the op's FLOPs: the work of `query` before a backend says how its
/// kernel runs it.
inline KernelWork operand_work(const KernelQuery& query) {
  std::array<Shape, max_op_inputs> shapes{};
  double bytes = static_cast<double>(query.out.shape.numel()) * dtype_size(query.out.dtype);
  for (std::size_t i = 0; i < query.in.size(); ++i) {
    shapes[i] = query.in[i].shape;
    bytes += static_cast<double>(query.in[i].shape.numel()) * dtype_size(query.in[i].dtype);
  }
  static const Attrs none{};
  const CostContext c{std::span<const Shape>(shapes.data(), query.in.size()), query.out.shape,
                      query.attrs ? *query.attrs : none};
  return {static_cast<double>(op_info(query.op).flops(c)), bytes, 0.0, 1.0};
}

/// The work of `query` as `target`'s kernel does it, or its operand work where the target
/// cannot say.
inline KernelWork kernel_work(const Target& target, const KernelQuery& query) {
  return target.kernel_work ? target.kernel_work(query) : operand_work(query);
}

/// A roofline with measured yardsticks: a kernel takes the longer of its arithmetic at the
/// reachable share of the peak and its traffic at the copy bandwidth (the caches' where its
/// bytes fit in them), after any packing phase, plus the fixed cost of starting it.
struct CostModel {
  MachinePeak peak;
  /// Share of the multiply-add peak a GEMM with full tiles and long inner products sustains
  /// (the loads around the register tiles take the rest).
  double compute_share = 0.85;
  /// Share of a plain copy's bandwidth a kernel's traffic sustains: kernels read several
  /// streams at once, some strided or broadcast, and a memcpy is the best case.
  double memory_share = 0.5;
  /// The traffic sizes the two bandwidths were measured at (see the CPU backend's
  /// copy_gbytes_per_s): in between, the rate falls from the one to the other, geometrically.
  double cache_copy_bytes = 4.0 * (1 << 20), memory_copy_bytes = 64.0 * (1 << 20);
  /// Seconds to start a kernel and, on several workers, to hand out its work and join.
  double start_seconds = 1e-6, split_seconds = 3e-6;

  /// Predicted seconds of one call doing `work`; 0 when the peak is unknown.
  [[nodiscard]] double seconds(const KernelWork& work) const {
    if (peak.gflops <= 0.0 || peak.gbytes_per_s <= 0.0) return 0.0;
    const double fill = std::max(work.compute_fill, 1e-3);
    const double compute = work.flops / (peak.gflops * 1e9 * compute_share * fill);
    const double memory = work.bytes / (memory_share * bandwidth(work.bytes) * 1e9);
    const double packing = work.packed_bytes / (memory_share * bandwidth(work.packed_bytes) * 1e9);
    return start_seconds + (peak.threads > 1 ? split_seconds : 0.0) + packing +
           std::max(compute, memory);
  }

  /// GB/s at which `bytes` of traffic stream: the caches' rate up to the size it was measured
  /// at, the memory's from the size it was measured at.
  [[nodiscard]] double bandwidth(double bytes) const {
    if (peak.cache_gbytes_per_s <= 0.0 || bytes >= memory_copy_bytes) return peak.gbytes_per_s;
    if (bytes <= cache_copy_bytes) return peak.cache_gbytes_per_s;
    const double t =
        std::log(bytes / cache_copy_bytes) / std::log(memory_copy_bytes / cache_copy_bytes);
    return std::exp((1.0 - t) * std::log(peak.cache_gbytes_per_s) +
                    t * std::log(peak.gbytes_per_s));
  }
};

/// The share of a register tile of `tile` rows or columns that `extent` fills, over all the
/// tiles it needs: 1 for a multiple of the tile, 10 / 16 for 10 rows of 16-row tiles.
inline double tile_fill(std::int64_t extent, std::int64_t tile) {
  if (extent <= 0 || tile <= 0) return 1.0;
  const std::int64_t tiles = (extent + tile - 1) / tile;
  return static_cast<double>(extent) / static_cast<double>(tiles * tile);
}

/// The share of a GEMM's time its multiply-adds take when each register tile of the result is
/// loaded and stored once per inner product of `depth` steps: short products (a convolution of
/// one input channel: depth 9) spend most of their time on the tile.
inline double depth_fill(std::int64_t depth, double tile_cost_in_steps = 12.0) {
  return depth <= 0
             ? 1.0
             : static_cast<double>(depth) / (static_cast<double>(depth) + tile_cost_in_steps);
}

} // namespace kiln
