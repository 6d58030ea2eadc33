// The CPU kernels of the all-reduce ops: packing a bucket and handing it to the communicator,
// then waiting for it and averaging. Plain C++: the copies and one scaling are memory-bound.
#pragma once

#include <cstring>
#include <limits>
#include <variant>

#include "kiln/backends/variant_table.hpp"

namespace kiln::cpu {

inline void allreduce_start_kernel(const KernelArgs& args) {
  const auto& attrs = *std::get_if<CollectiveAttrs>(args.attrs);
  float* packed = args.out.f32();
  std::int64_t offset = 0;
  for (int i = 0; i < args.num_inputs; ++i) {
    const TensorView& in = args.in[static_cast<std::size_t>(i)];
    std::memcpy(packed + offset, in.data, static_cast<std::size_t>(in.numel()) * sizeof(float));
    offset += in.numel();
  }
  attrs.communicator->start_sum(attrs.slot, packed, offset);
}

inline void allreduce_wait_kernel(const KernelArgs& args) {
  const auto& attrs = *std::get_if<CollectiveAttrs>(args.attrs);
  const float* summed = args.in[0].f32();
  float* out = args.out.f32();
  const std::int64_t n = args.out.numel();
  if (!attrs.communicator->wait(attrs.slot)) {
    // The executor reports the failure after the step; until then nothing may pass for a
    // gradient.
    for (std::int64_t i = 0; i < n; ++i) out[i] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float scale = 1.0f / static_cast<float>(attrs.communicator->size());
  for (std::int64_t i = 0; i < n; ++i) out[i] = summed[i] * scale;
}

/// Adds the all-reduce kernels to `table`.
inline void register_collective_kernels(VariantTable& table) {
  table.add(Op::AllreduceStart, {"allreduce_start", &allreduce_start_kernel});
  table.add(Op::AllreduceWait, {"allreduce_wait", &allreduce_wait_kernel});
}

} // namespace kiln::cpu
