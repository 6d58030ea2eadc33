// Seeded, portable random numbers: the same seed gives the same numbers on every platform.
#pragma once

#include <cstdint>

#include "kiln/core/host_device.hpp"

namespace kiln {

/// Mixes a 64-bit value into a well-distributed one (splitmix64 finaliser). Counter-based:
/// hash(seed, index) needs no state, so parallel kernels draw reproducible numbers.
KILN_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Uniform float in [0, 1) from the top 24 bits of a hash.
KILN_HOST_DEVICE constexpr float unit_float(std::uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

/// A small sequential generator for initialisation and shuffling. Unlike the standard
/// distributions its output is specified here, so it is identical across standard libraries.
class Rng {
public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64() {
    return mix64(state_++ * 0x2545f4914f6cdd1dULL + 0x632be59bd9b4e019ULL);
  }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * unit_float(next_u64()); }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return next_u64() % n; }

private:
  std::uint64_t state_;
};

} // namespace kiln
