// The target description: what passes may know of the device a graph is compiled for.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kiln/core/precision.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln {

/// One node as a backend would run it: its op, attributes, and the types of its inputs and
/// output (physical shapes: a channels-last activation is [N, H, W, C]). Kernel selection
/// (plan/backend.hpp) answers it, and a pass asks Target::has_kernel with it before it rewrites
/// a node into a form that only some devices run.
struct KernelQuery {
  Op op = Op::Input;
  const Attrs* attrs = nullptr;
  std::span<const TensorType> in;
  TensorType out;
  /// The precision the compilation lets it multiply in; a backend without a kernel of that
  /// precision for the call runs its FP32 one.
  Precision precision = Precision::f32;
};

/// The work of one kernel call as its device runs it.
struct KernelWork {
  double flops = 0.0; ///< the op's floating-point operations (OpDef::flops)
  /// Bytes streamed: every operand read once and the result written once, plus any scratch
  /// matrix the kernel writes and reads back (a convolution's column matrix).
  double bytes = 0.0;
  /// Bytes a separate phase copies before the arithmetic starts (a GEMM packing an operand).
  double packed_bytes = 0.0;
  /// The share of the FP32 multiply-add peak its inner loop can reach on these shapes: below 1
  /// where the shapes leave a kernel's register tiles partly empty or its inner products short,
  /// up to 2 where it multiplies in bfloat16 (two multiply-adds per lane of a dot product).
  double compute_fill = 1.0;
};

/// What passes may know of the device a graph is compiled for, in the spirit of TVM's Target:
/// which layouts and tile multiples its kernels support, and the yardsticks of its speed. A
/// backend describes its device with one (Backend::target); passes read it through
/// PassContext::target and never include a backend. The default describes a device with NCHW
/// kernels only and no measured speed, so target-dependent passes leave the graph alone.
struct Target {
  std::string backend = "none"; ///< the backend's name, e.g. "cpu"
  std::string isa;              ///< the instruction set its kernels were chosen for, e.g. "AVX3"
  /// Channel counts that its channels-last (NHWC) convolution kernels tile over must be
  /// multiples of this; 0 when it has none.
  std::int64_t channels_last_multiple = 0;
  /// Whether some of its convolutions and matmuls can multiply in bfloat16 (Precision::bf16).
  bool bf16_products = false;
  /// Workers a compilation gets when it asks for 0 (every core).
  int default_threads = 1;
  /// Whether the backend has a kernel for this node: the same selection lowering makes.
  std::function<bool(const KernelQuery&)> has_kernel;
  /// Measures the FP32 multiply-add peak of `threads` workers at once, in GFLOP/s (a fraction
  /// of a second); empty when the backend cannot.
  std::function<double(int threads)> peak_gflops;
  /// Measures the bytes read plus written per second by a copy far larger than the caches on
  /// `threads` workers, in GB/s; empty when the backend cannot.
  std::function<double(int threads)> copy_gbytes_per_s;
  /// The same for a copy that stays in the caches (a few MiB, as one layer's activations).
  std::function<double(int threads)> cache_gbytes_per_s;
  /// The work its kernel for this call does, as the device runs it: the op's FLOPs, the
  /// operands' bytes plus the kernel's own scratch traffic, and how well the shapes fill its
  /// register tiles (passes/cost_model.hpp). Empty: the op's FLOPs and operand bytes alone.
  std::function<KernelWork(const KernelQuery&)> kernel_work;

  /// Whether the backend runs `query` (false for a description without kernel selection).
  [[nodiscard]] bool runs(const KernelQuery& query) const {
    return has_kernel && has_kernel(query);
  }
};

/// Fails (kiln.target.precision) when `target` has no kernels that multiply in `precision`,
/// naming the device, its instruction set and what it lacks.
inline void check_precision(const Target& target, Precision precision) {
  if (precision != Precision::bf16 || target.bf16_products) return;
  fail(errc::precision,
       "compile: precision bf16 needs kernels that multiply in bfloat16, and the " +
           target.backend + " backend's " +
           (target.isa.empty() ? std::string("kernels") : target.isa + " kernels") +
           " have none on this machine" +
           (target.backend == "cpu" ? std::string(" (they need AVX-512 with AVX512-BF16)")
                                    : std::string()) +
           "; compile with Precision::f32");
}

} // namespace kiln
