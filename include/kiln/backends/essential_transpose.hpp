// A transpose reduced to its essential form, which both backends' transpose kernels run: size-1
// axes dropped, input axes that stay neighbours in the output merged.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/core/shape.hpp"

namespace kiln {

/// A transpose in essential form: input dims (row-major, no size-1 dims, no two input axes
/// that are neighbours in the output too) and the permutation (output axis i = input perm[i]).
struct EssentialTranspose {
  int rank = 0;
  std::array<std::int64_t, Shape::max_rank> dims{};
  std::array<int, Shape::max_rank> perm{};

  /// Element strides of the input's axes (`in`) and of the output's axes (`out`).
  void strides(std::array<std::int64_t, Shape::max_rank>& in,
               std::array<std::int64_t, Shape::max_rank>& out) const {
    if (rank == 0) return;
    in[static_cast<std::size_t>(rank - 1)] = out[static_cast<std::size_t>(rank - 1)] = 1;
    for (int a = rank - 2; a >= 0; --a) {
      const auto u = static_cast<std::size_t>(a);
      in[u] = in[u + 1] * dims[u + 1];
      out[u] = out[u + 1] * dims[static_cast<std::size_t>(perm[u + 1])];
    }
  }
};

inline EssentialTranspose essential_transpose(const Shape& in, std::span<const int> perm) {
  const auto rank = static_cast<std::size_t>(in.rank());
  // Drop size-1 axes: kept[a] is the new index of input axis a, or -1.
  std::array<int, Shape::max_rank> kept{};
  std::array<std::int64_t, Shape::max_rank> dims{};
  std::size_t m = 0;
  for (std::size_t a = 0; a < rank; ++a) {
    const std::int64_t d = in[static_cast<int>(a)];
    kept[a] = d == 1 ? -1 : static_cast<int>(m);
    if (d != 1) dims[m++] = d;
  }
  std::array<std::size_t, Shape::max_rank> p{}; // the permutation of the kept axes
  std::size_t n = 0;
  for (std::size_t i = 0; i < rank; ++i)
    if (const int a = kept[static_cast<std::size_t>(perm[i])]; a >= 0)
      p[n++] = static_cast<std::size_t>(a);
  // Merge runs of input axes that follow each other in the output too: an axis leads its
  // run unless the output axis before it is the input axis before it.
  std::array<bool, Shape::max_rank> leads{};
  leads.fill(true);
  for (std::size_t i = 1; i < m; ++i)
    if (p[i] == p[i - 1] + 1) leads[p[i]] = false;
  std::array<int, Shape::max_rank> merged{}; // the merged axis of each kept axis
  EssentialTranspose e;
  for (std::size_t a = 0; a < m; ++a) {
    if (leads[a]) e.dims[static_cast<std::size_t>(e.rank++)] = 1;
    merged[a] = e.rank - 1;
    e.dims[static_cast<std::size_t>(e.rank - 1)] *= dims[a];
  }
  std::size_t out = 0;
  for (std::size_t i = 0; i < m; ++i)
    if (leads[p[i]]) e.perm[out++] = merged[p[i]];
  return e;
}

} // namespace kiln
