// Numpy-style broadcasting of shapes, shared by shape inference and the kernels.
#pragma once

#include <algorithm>
#include <optional>

#include "kiln/core/shape.hpp"

namespace kiln {

/// The broadcast of two shapes (aligned at the innermost dimension), or nullopt.
inline std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int i = 0; i < rank; ++i) {
    const int ia = i - (rank - a.rank());
    const int ib = i - (rank - b.rank());
    const std::int64_t da = ia >= 0 ? a[ia] : 1;
    const std::int64_t db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

/// True when `from` broadcasts to exactly `to`.
inline bool broadcasts_to(const Shape& from, const Shape& to) {
  const auto b = broadcast_shapes(from, to);
  return b && *b == to;
}

/// True when `to` is what sum_to may sum `from` down to: the same rank, each extent kept or 1.
inline bool sums_down_to(const Shape& from, const Shape& to) {
  bool ok = to.rank() == from.rank();
  for (int i = 0; ok && i < from.rank(); ++i) ok = to[i] == from[i] || to[i] == 1;
  return ok;
}

/// `s` with leading 1s added up to `rank`.
inline Shape pad_rank(const Shape& s, int rank) {
  Shape out;
  for (int i = s.rank(); i < rank; ++i) out.push_back(1);
  for (std::int64_t d : s) out.push_back(d);
  return out;
}

} // namespace kiln
