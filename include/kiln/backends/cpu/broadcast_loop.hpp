// BroadcastLoop: walks a broadcast elementwise operation as rows of contiguous elements.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/core/shape.hpp"
#include "kiln/ops/broadcast.hpp"

namespace kiln::cpu {

/// Folds adjacent dimensions that every operand walks the same way, so an elementwise op
/// becomes `rows` rows of `inner` elements in which each input is either contiguous
/// (inner_stride 1) or one value repeated (inner_stride 0). A bias over NCHW becomes rows
/// of H*W with one bias value per row.
struct BroadcastLoop {
  std::int64_t inner = 1;
  std::int64_t rows = 1;
  std::array<int, 2> inner_stride{1, 1};

  BroadcastLoop(const Shape& out, const Shape& a, const Shape& b) {
    const int rank = out.rank();
    const Shape in_shapes[2] = {pad_rank(a, rank), pad_rank(b, rank)};
    // Element strides of each input over the output's dimensions (0 where broadcast).
    std::array<std::array<std::int64_t, Shape::max_rank>, 2> stride{};
    for (int k = 0; k < 2; ++k) {
      std::int64_t s = 1;
      for (int i = rank - 1; i >= 0; --i) {
        stride[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] =
            in_shapes[k][i] == 1 ? 0 : s;
        s *= in_shapes[k][i];
      }
    }
    // Merge from the innermost dimension outwards.
    for (int i = rank - 1; i >= 0; --i) {
      if (out[i] == 1) continue;
      if (dims_ == 0) {
        push(out[i], stride[0][static_cast<std::size_t>(i)],
             stride[1][static_cast<std::size_t>(i)]);
        continue;
      }
      bool mergeable = true;
      for (int k = 0; k < 2; ++k) {
        const auto& st = stride[static_cast<std::size_t>(k)];
        const std::int64_t inner_stride_k =
            strides_[static_cast<std::size_t>(k)][static_cast<std::size_t>(dims_ - 1)];
        mergeable = mergeable && st[static_cast<std::size_t>(i)] ==
                                     inner_stride_k * extent_[static_cast<std::size_t>(dims_ - 1)];
      }
      if (mergeable)
        extent_[static_cast<std::size_t>(dims_ - 1)] *= out[i];
      else
        push(out[i], stride[0][static_cast<std::size_t>(i)],
             stride[1][static_cast<std::size_t>(i)]);
    }
    if (dims_ == 0) push(1, 1, 1);
    // extent_[0] is the innermost folded dimension.
    inner = extent_[0];
    for (int k = 0; k < 2; ++k)
      inner_stride[static_cast<std::size_t>(k)] =
          strides_[static_cast<std::size_t>(k)][0] != 0 ? 1 : 0;
    for (int j = 1; j < dims_; ++j) rows *= extent_[static_cast<std::size_t>(j)];
  }

  /// Element offsets of row `r` in the two inputs (the output row starts at r * inner).
  void row_offsets(std::int64_t r, std::int64_t& offset_a, std::int64_t& offset_b) const {
    offset_a = offset_b = 0;
    for (int j = 1; j < dims_; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      const std::int64_t idx = r % extent_[uj];
      r /= extent_[uj];
      offset_a += idx * strides_[0][uj];
      offset_b += idx * strides_[1][uj];
    }
  }

private:
  void push(std::int64_t extent, std::int64_t sa, std::int64_t sb) {
    extent_[static_cast<std::size_t>(dims_)] = extent;
    strides_[0][static_cast<std::size_t>(dims_)] = sa;
    strides_[1][static_cast<std::size_t>(dims_)] = sb;
    ++dims_;
  }
  int dims_ = 0;
  std::array<std::int64_t, Shape::max_rank> extent_{};
  std::array<std::array<std::int64_t, Shape::max_rank>, 2> strides_{};
};

} // namespace kiln::cpu
