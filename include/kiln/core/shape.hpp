// Shape: a small fixed-capacity list of dimensions, cheap to copy into kernel arguments.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kiln/core/error.hpp"

namespace kiln {

/// Tensor dimensions, outermost first (NCHW for images). Rank 0 is a scalar.
/// Fixed capacity so kernels can take shapes by value without allocating.
class Shape {
public:
  static constexpr int max_rank = 6;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  template <class It> Shape(It first, It last) { assign(first, last); }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  [[nodiscard]] std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  [[nodiscard]] const std::int64_t* begin() const { return dims_.data(); }
  [[nodiscard]] const std::int64_t* end() const { return dims_.data() + rank_; }

  /// Number of elements (1 for a scalar).
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }

  void push_back(std::int64_t d) {
    if (rank_ == max_rank) fail(errc::shape, "shape rank exceeds " + std::to_string(max_rank));
    dims_[static_cast<std::size_t>(rank_++)] = d;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }

  /// "[64,1,28,28]"; the form used in every error message and the IR printer.
  [[nodiscard]] std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ',';
      s += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    return s + "]";
  }

private:
  template <class It> void assign(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<std::int64_t>(*first));
  }
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

/// Fails with kiln.verify.shape unless every dimension of `shape` is at least 1 and its elements
/// of `element_bytes` bytes each can be addressed (2^62 bytes at most): what every entry point
/// of a shape (graph inputs, tensors, every built node) checks, so that no size computed later
/// can overflow. `what` names the value in the message, e.g. "input 'x'".
inline void check_shape(const Shape& shape, std::size_t element_bytes, const std::string& what) {
  constexpr std::int64_t most_bytes = std::int64_t{1} << 62;
  std::int64_t elements = 1;
  for (int i = 0; i < shape.rank(); ++i) {
    const std::int64_t d = shape[i];
    if (d < 1)
      fail(errc::shape, what + " has shape " + shape.str() + ": dimension " + std::to_string(i) +
                            " is " + std::to_string(d) + ", and every dimension must be >= 1");
    if (__builtin_mul_overflow(elements, d, &elements) ||
        elements > most_bytes / static_cast<std::int64_t>(element_bytes))
      fail(errc::shape, what + " has shape " + shape.str() + ": more than 2^62 bytes of " +
                            std::to_string(element_bytes) + "-byte elements");
  }
}

} // namespace kiln
