// BroadcastLoop: walks a broadcast elementwise operation as rows of contiguous elements.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "kiln/core/shape.hpp"
#include "kiln/ir/op_list.hpp"
#include "kiln/ops/broadcast.hpp"

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

  /// Merges consecutive rows into one of at most `max_inner` elements, so that short rows (a
  /// channels-last tensor with a per-channel operand: rows of C elements) cost one call per
  /// max_inner elements instead of one per row. Possible when every operand either walks the
  /// merged rows contiguously, or holds one value per row that stays the same across them, or
  /// is "periodic": one row of values shared by every row (its offsets are always 0). The
  /// caller reads a periodic operand from a buffer that holds its row `factor` times. Operands
  /// whose bit is set in `no_periodic` may not be periodic, nor may more than `max_periodic`.
  /// Returns the factor (1: nothing changed) and sets the periodic operands' bits in `periodic`.
  std::int64_t widen(std::int64_t max_inner, std::uint32_t no_periodic, int max_periodic,
                     std::uint32_t& periodic) {
    periodic = 0;
    if (dims_ < 2 || 2 * inner > max_inner) return 1;
    int count = 0;
    for (int k = 0; k < inputs_; ++k) {
      const auto& s = strides_[uz(k)];
      if (s[0] != 0 && s[1] == s[0] * inner) continue; // contiguous across rows
      if (s[0] == 0 && s[1] == 0) continue;            // one value, the same for merged rows
      bool shared_row = s[0] != 0 && !(no_periodic >> k & 1u);
      for (int j = 1; shared_row && j < dims_; ++j) shared_row = s[uz(j)] == 0;
      if (!shared_row || ++count > max_periodic) return 1;
      periodic |= 1u << k;
    }
    std::int64_t factor = max_inner / inner;
    while (factor > 1 && extent_[1] % factor != 0) --factor;
    if (factor <= 1) {
      periodic = 0;
      return 1;
    }
    extent_[0] *= factor;
    extent_[1] /= factor;
    for (int k = 0; k < inputs_; ++k)
      if (!(periodic >> k & 1u)) strides_[uz(k)][1] *= factor;
    inner = extent_[0];
    rows /= factor;
    return factor;
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
