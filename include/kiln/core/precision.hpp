// The precision convolutions and matmuls multiply in, which a compilation chooses.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

/// What the products of convolutions and matmuls are rounded to before they are added up.
/// Tensors, sums, parameters and optimizer state stay FP32 either way, as with oneDNN's
/// fpmath mode or PyTorch's float32 matmul precision.
enum class Precision : std::uint8_t {
  f32,  ///< exact FP32 products (the default)
  bf16, ///< operands rounded to bfloat16, products summed in FP32 (AVX512-BF16 dot products)
};

/// "f32" or "bf16": the spelling of command lines and reports.
constexpr std::string_view precision_name(Precision p) {
  return p == Precision::bf16 ? "bf16" : "f32";
}

} // namespace kiln
