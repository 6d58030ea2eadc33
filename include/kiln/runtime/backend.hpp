// The backend interface lowering targets: a kernel per op and each kernel's scratch needs.
#pragma once

#include <cstddef>
#include <string>

#include "kiln/ops/op_list.hpp"
#include "kiln/runtime/kernel_args.hpp"

namespace kiln {

/// A device kiln can run on. Lowering asks it for one kernel per step.
struct Backend {
  std::string name;
  /// The kernel of `op`, or nullptr when the backend has none.
  KernelFn (*kernel)(Op op) = nullptr;
  /// Scratch bytes per worker thread for a step with these shapes.
  std::size_t (*workspace_per_thread)(Op op, const KernelArgs& shapes) = nullptr;
  /// The SIMD target the kernels were chosen for, e.g. "AVX3".
  const char* (*target)() = nullptr;
  /// Measures the FP32 multiply-add peak of `threads` threads working at once, in GFLOP/s
  /// (a fraction of a second); the profiler's yardstick. May be null.
  double (*peak_gflops)(int threads) = nullptr;
};

} // namespace kiln
