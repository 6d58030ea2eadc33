// A tensor as rows along its last axis: how the softmax and loss kernels of every backend
// walk their operands.
#pragma once

#include <cstdint>

#include "kiln/core/shape.hpp"

namespace kiln {

/// Row-wise view of a tensor: `rows` rows of `cols` contiguous elements (the last dim).
struct Rows {
  std::int64_t rows = 0, cols = 0;
};

inline Rows rows_of(const Shape& s) {
  const std::int64_t cols = s.rank() == 0 ? 1 : s[s.rank() - 1];
  return {cols == 0 ? 0 : s.numel() / cols, cols};
}

} // namespace kiln
