// The CPU backend's entry point: for every op, its kernels of the best SIMD target, each with
// the calls it accepts and the scratch it needs.
#pragma once

#include <cstddef>

#include "kiln/backends/variant_table.hpp"

namespace kiln::cpu {

/// Kernels of one Highway target, with the target's name and its peak measurement.
struct KernelTable : VariantTable {
  const char* target_name = "";
  /// GFLOP/s of multiply-adds the calling thread sustains for about `seconds`.
  double (*fma_gflops)(double seconds) = nullptr;
  /// The GEMM micro-kernel's register tile: rows of the result, and floats across (whole
  /// vectors), on this target.
  std::size_t gemm_tile_rows = 1, gemm_tile_columns = 1;
  /// Floats per SIMD vector: the channels a channels-last kernel's tile spans.
  std::size_t vector_floats = 1;
  /// Whether it holds variants that multiply in bfloat16 (the CPU has AVX512-BF16).
  bool bf16_products = false;
};

/// The kernel table for the best target this CPU supports (Highway dynamic dispatch).
///
/// Defined in kiln/backends/cpu/implementation.hpp, which exactly one .cpp file of the
/// program must include. Forgetting it gives the link error
///   undefined reference to `kiln::cpu::kernel_table()'
const KernelTable& kernel_table();

} // namespace kiln::cpu
