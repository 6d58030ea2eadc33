// The target description: what passes may know of the device a graph is compiled for.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

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

  /// Whether the backend runs `query` (false for a description without kernel selection).
  [[nodiscard]] bool runs(const KernelQuery& query) const {
    return has_kernel && has_kernel(query);
  }
};

} // namespace kiln
