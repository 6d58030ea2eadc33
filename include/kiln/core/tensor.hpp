// Tensor: owned, aligned host memory with a shape; holds parameters and optimizer state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"

namespace kiln {

namespace detail {
struct AlignedFree {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
/// 64-byte aligned, zero-initialised storage of at least `bytes` bytes; kiln.memory.host
/// naming the bytes when the allocator has none.
inline std::unique_ptr<std::byte[], AlignedFree> aligned_zeroed(std::size_t bytes) {
  const std::size_t rounded = (bytes + 63) / 64 * 64 + 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (!p)
    fail(errc::memory,
         "cannot allocate a tensor of " + std::to_string(bytes) + " bytes of host memory");
  std::memset(p, 0, rounded);
  return std::unique_ptr<std::byte[], AlignedFree>(p);
}
} // namespace detail

/// A dense row-major tensor in host memory. Parameters and optimizer state are Tensors:
/// graphs refer to them, compiled plans read and update them in place.
class Tensor {
public:
  /// A zero-filled tensor; kiln.verify.shape for a dimension < 1 or a size past 2^62 bytes.
  explicit Tensor(Shape shape, DType dtype = DType::f32)
      : shape_(checked(shape, dtype)), dtype_(dtype),
        storage_(
            detail::aligned_zeroed(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype))) {}

  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] std::int64_t numel() const { return shape_.numel(); }
  [[nodiscard]] void* data() { return storage_.get(); }
  [[nodiscard]] const void* data() const { return storage_.get(); }

  /// The elements as floats; the tensor must be f32.
  [[nodiscard]] std::span<float> f32() {
    return {reinterpret_cast<float*>(storage_.get()), static_cast<std::size_t>(numel())};
  }
  [[nodiscard]] std::span<const float> f32() const {
    return {reinterpret_cast<const float*>(storage_.get()), static_cast<std::size_t>(numel())};
  }

private:
  static Shape checked(const Shape& shape, DType dtype) {
    check_shape(shape, dtype_size(dtype), "a tensor");
    return shape;
  }

  Shape shape_;
  DType dtype_;
  std::unique_ptr<std::byte[], detail::AlignedFree> storage_;
};

} // namespace kiln
