// The CPU backend's entry point: for every op, its kernels of the best SIMD target, each with
// the calls it accepts and the scratch it needs.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "kiln/ir/op_list.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cpu {

/// One kernel of an op: a variant (e.g. convolution over shifted rows) with its own rule for
/// the calls it can run and its own scratch need.
struct KernelVariant {
  const char* name = ""; ///< e.g. "conv2d.shifted_rows"
  KernelFn run = nullptr;
  /// Whether it runs this call; null: every call.
  bool (*accepts)(const KernelQuery&) = nullptr;
  /// Scratch bytes per worker thread for this call; null: none.
  std::size_t (*workspace)(const KernelQuery&) = nullptr;
};

/// Kernels of one Highway target. Each op lists its variants; their `accepts` rules exclude
/// each other, so the order they were added in decides nothing.
struct KernelTable {
  std::array<std::vector<KernelVariant>, op_count> variants{};
  const char* target_name = "";
  /// GFLOP/s of multiply-adds the calling thread sustains for about `seconds`.
  double (*fma_gflops)(double seconds) = nullptr;

  void add(Op op, const KernelVariant& variant) { variants[op_index(op)].push_back(variant); }
};

/// The kernel table for the best target this CPU supports (Highway dynamic dispatch).
///
/// Defined in kiln/backends/cpu/implementation.hpp, which exactly one .cpp file of the
/// program must include. Forgetting it gives the link error
///   undefined reference to `kiln::cpu::kernel_table()'
const KernelTable& kernel_table();

} // namespace kiln::cpu
