// The tensors the checkpoint fuzz harness loads into, and its seed checkpoints are saved
// from: both dtypes, ranks 1 and 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/nn/module.hpp"

namespace kiln::fuzz {

/// A small training state whose every element is a known function of its position.
inline std::vector<nn::Parameter> checkpoint_tensors() {
  std::vector<nn::Parameter> state = {{"0.weight", std::make_shared<Tensor>(Shape{3, 2})},
                                      {"0.bias", std::make_shared<Tensor>(Shape{3})},
                                      {"steps", std::make_shared<Tensor>(Shape{1}, DType::i32)}};
  for (std::size_t t = 0; t < state.size(); ++t) {
    Tensor& tensor = *state[t].tensor;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) {
      if (tensor.dtype() == DType::f32)
        tensor.f32()[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
      else
        static_cast<std::int32_t*>(tensor.data())[i] = static_cast<std::int32_t>(7 + i);
    }
  }
  return state;
}

} // namespace kiln::fuzz
