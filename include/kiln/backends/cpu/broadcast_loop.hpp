// BroadcastLoop: walks a broadcast elementwise operation as rows of contiguous elements.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "kiln/core/shape.hpp"
#include "kiln/ops/broadcast.hpp"
#include "kiln/ops/op_list.hpp"

namespace kiln::cpu {

/// Folds adjacent dimensions that every operand walks the same way, so an elementwise op
/// becomes `rows` rows of `inner` elements in which each input is either contiguous
/// (inner_stride 1) or one value repeated (inner_stride 0). A bias over NCHW becomes rows
/// of H*W with one bias value per row.
class BroadcastLoop {
public:
  std::int64_t inner = 1;
  std::int64_t rows = 1;
  std::array<int, max_op_inputs> inner_stride{};

  BroadcastLoop(const Shape& out, std::span<const Shape> inputs)
      : inputs_(static_cast<int>(inputs.size())) {
    const int rank = out.rank();
    // Element strides of each input over the output's dimensions (0 where broadcast).
    std::array<std::array<std::int64_t, Shape::max_rank>, max_op_inputs> stride{};
    for (int k = 0; k < inputs_; ++k) {
      const Shape padded = pad_rank(inputs[static_cast<std::size_t>(k)], rank);
      std::int64_t s = 1;
      for (int i = rank - 1; i >= 0; --i) {
        stride[uz(k)][uz(i)] = padded[i] == 1 ? 0 : s;
        s *= padded[i];
      }
    }
    // Merge from the innermost dimension outwards.
    for (int i = rank - 1; i >= 0; --i) {
      if (out[i] == 1) continue;
      bool mergeable = dims_ > 0;
      for (int k = 0; mergeable && k < inputs_; ++k)
        mergeable = stride[uz(k)][uz(i)] == strides_[uz(k)][uz(dims_ - 1)] * extent_[uz(dims_ - 1)];
      if (mergeable) {
        extent_[uz(dims_ - 1)] *= out[i];
        continue;
      }
      extent_[uz(dims_)] = out[i];
      for (int k = 0; k < inputs_; ++k) strides_[uz(k)][uz(dims_)] = stride[uz(k)][uz(i)];
      ++dims_;
    }
    if (dims_ == 0) { // a single element
      extent_[0] = 1;
      for (int k = 0; k < inputs_; ++k) strides_[uz(k)][0] = 1;
      dims_ = 1;
    }
    // extent_[0] is the innermost folded dimension.
    inner = extent_[0];
    for (int k = 0; k < inputs_; ++k) inner_stride[uz(k)] = strides_[uz(k)][0] != 0 ? 1 : 0;
    for (int j = 1; j < dims_; ++j) rows *= extent_[uz(j)];
  }

  /// Element offsets of row `r` in each input (the output row starts at r * inner).
  void row_offsets(std::int64_t r, std::int64_t* offsets) const {
    for (int k = 0; k < inputs_; ++k) offsets[k] = 0;
    for (int j = 1; j < dims_; ++j) {
      const std::int64_t idx = r % extent_[uz(j)];
      r /= extent_[uz(j)];
      for (int k = 0; k < inputs_; ++k) offsets[k] += idx * strides_[uz(k)][uz(j)];
    }
  }

private:
  static constexpr std::size_t uz(int i) { return static_cast<std::size_t>(i); }
  int inputs_ = 0;
  int dims_ = 0;
  std::array<std::int64_t, Shape::max_rank> extent_{};
  std::array<std::array<std::int64_t, Shape::max_rank>, max_op_inputs> strides_{};
};

} // namespace kiln::cpu
