// FNV-1a, the 64-bit hash kiln uses to compare bytes cheaply (parameters across ranks, graphs
// in the tuning cache); not for anything an adversary chooses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

/// The FNV-1a offset basis: the hash of no bytes.
inline constexpr std::uint64_t fnv1a_basis = 14695981039346656037ULL;

/// `h` continued over `n` bytes at `data`.
inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = fnv1a_basis) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  return h;
}

} // namespace kiln
