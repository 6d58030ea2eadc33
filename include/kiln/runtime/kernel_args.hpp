// What a kernel receives: tensor views, attributes, workspace. Built once per plan step.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/ops/attrs.hpp"
#include "kiln/ops/op_list.hpp"

namespace kiln {

/// A tensor as a kernel sees it: dense, row-major, no ownership.
struct TensorView {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;

  [[nodiscard]] float* f32() const { return static_cast<float*>(data); }
  [[nodiscard]] std::int32_t* i32() const { return static_cast<std::int32_t*>(data); }
  [[nodiscard]] std::int64_t numel() const { return shape.numel(); }
};

/// Arguments of one kernel call. Kernels never throw and never allocate: everything they
/// need, scratch memory included, arrives here.
struct KernelArgs {
  static constexpr int max_inputs = max_op_inputs;
  std::array<TensorView, max_inputs> in{};
  int num_inputs = 0;
  TensorView out;
  const Attrs* attrs = nullptr;
  /// Scratch memory: `workspace_per_thread` bytes for each worker thread, 64-byte aligned.
  /// A kernel running on thread t (tbb::this_task_arena::current_thread_index()) uses the
  /// slice starting at workspace + t * workspace_per_thread.
  std::byte* workspace = nullptr;
  std::size_t workspace_per_thread = 0;
  /// Number of completed runs of the plan; seeds per-step randomness such as dropout.
  std::uint64_t run_counter = 0;
};

/// Every kernel has this signature.
using KernelFn = void (*)(const KernelArgs&);

} // namespace kiln
