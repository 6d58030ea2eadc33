// The CPU backend's entry point: for every op, its kernels of the best SIMD target, each with
// the calls it accepts and the scratch it needs.
#pragma once

#include "kiln/backends/variant_table.hpp"

namespace kiln::cpu {

/// Kernels of one Highway target, with the target's name and its peak measurement.
struct KernelTable : VariantTable {
  const char* target_name = "";
  /// GFLOP/s of multiply-adds the calling thread sustains for about `seconds`.
  double (*fma_gflops)(double seconds) = nullptr;
};

/// The kernel table for the best target this CPU supports (Highway dynamic dispatch).
///
/// Defined in kiln/backends/cpu/implementation.hpp, which exactly one .cpp file of the
/// program must include. Forgetting it gives the link error
///   undefined reference to `kiln::cpu::kernel_table()'
const KernelTable& kernel_table();

} // namespace kiln::cpu
