// nn::Linear: fully connected layer y = x W^T + b, PyTorch's layout and initialisation.
#pragma once

#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::nn {

/// y = x · weightᵀ + bias, weight [out, in], bias [out]; x is [N, in].
class Linear : public Module {
public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true)
      : in_(in_features), out_(out_features) {
    if (in_features < 1 || out_features < 1)
      fail(errc::argument, "Linear(" + std::to_string(in_features) + ", " +
                               std::to_string(out_features) + "): sizes must be positive");
    const float bound = default_init_bound(in_features);
    weight_ = {"weight", uniform_tensor(Shape{out_features, in_features}, bound)};
    if (bias) bias_ = {"bias", uniform_tensor(Shape{out_features}, bound)};
  }

  Value forward(Value x) override {
    Value y = matmul(x, use(x, weight_), false, true);
    if (bias_.tensor) y = y + use(x, bias_);
    return y;
  }

  [[nodiscard]] std::string describe() const override {
    return "Linear(" + std::to_string(in_) + " -> " + std::to_string(out_) + ")";
  }

  [[nodiscard]] std::vector<Parameter> parameters() const override {
    if (bias_.tensor) return {named(weight_), named(bias_)};
    return {named(weight_)};
  }

private:
  std::int64_t in_, out_;
  Parameter weight_;
  Parameter bias_;
};

} // namespace kiln::nn
