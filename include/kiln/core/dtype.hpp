// Element types of tensors in the IR and at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

/// Element type of a tensor. f32 for activations and parameters, i32 for class labels.
enum class DType : std::uint8_t { f32, i32 };

inline constexpr DType f32 = DType::f32;
inline constexpr DType i32 = DType::i32;

/// Size in bytes of one element.
constexpr std::size_t dtype_size(DType t) {
  return t == DType::f32 ? sizeof(float) : sizeof(std::int32_t);
}

constexpr std::string_view dtype_name(DType t) { return t == DType::f32 ? "f32" : "i32"; }

} // namespace kiln
