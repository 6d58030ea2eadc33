// The CPU backend's entry point: a table of kernels, one per op, for the best SIMD target.
#pragma once

#include <array>

#include "kiln/ops/op_list.hpp"
#include "kiln/runtime/kernel_args.hpp"

namespace kiln::cpu {

/// Kernels of one Highway target, indexed by op_index(op). Ops that need no kernel
/// (input, param, reshape) have nullptr.
struct KernelTable {
  std::array<KernelFn, op_count> run{};
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
