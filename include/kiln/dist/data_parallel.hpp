// What data-parallel training needs besides the step's all-reduces: the same parameters on
// every rank at the start, a check that they stay the same, and counts summed over ranks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/communicator.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/fnv1a.hpp"
#include "kiln/nn/module.hpp"

namespace kiln::dist {

/// Copies rank 0's values of `state` (parameters, buffers, optimizer state) to every rank, so
/// all start from rank 0's initialisation or checkpoint.
inline void broadcast_parameters(Communicator& world, std::span<const nn::Parameter> state) {
  for (const nn::Parameter& p : state) {
    if (!p.tensor || p.tensor->dtype() != DType::f32)
      fail(errc::argument, "broadcast_parameters: '" + p.name + "' is not an f32 tensor");
    world.broadcast(p.tensor->f32(), 0);
  }
}

/// A 64-bit FNV-1a hash of every byte of `state`: equal on two ranks exactly when (but for a
/// 2^-64 chance) their tensors are bit-identical.
inline std::uint64_t parameter_checksum(std::span<const nn::Parameter> state) {
  std::uint64_t h = fnv1a_basis;
  for (const nn::Parameter& p : state)
    h = fnv1a(p.tensor->data(),
              static_cast<std::size_t>(p.tensor->numel()) * dtype_size(p.tensor->dtype()), h);
  return h;
}

/// Fails with kiln.dist.mismatch, on every rank, unless every rank holds bit-identical
/// `state`; `when` says where in training the check ran ("after epoch 2").
inline void check_same_parameters(Communicator& world, std::span<const nn::Parameter> state,
                                  const std::string& when) {
  const std::vector<std::uint64_t> all = world.gather(parameter_checksum(state));
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      fail(errc::dist_mismatch, "rank " + std::to_string(world.rank()) +
                                    ": the ranks' parameters differ " + when +
                                    ": rank 0's checksum is " + std::to_string(all[0]) + ", rank " +
                                    std::to_string(r) + "'s " + std::to_string(all[r]) +
                                    " (every rank must run the same step on the same parameters)");
}

} // namespace kiln::dist
