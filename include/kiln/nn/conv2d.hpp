// nn::Conv2d: 2-D convolution layer with bias, PyTorch's default initialisation.
#pragma once

#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::nn {

/// y = conv2d(x, weight) + bias, weight OIHW [out, in, k, k], bias [out].
class Conv2d : public Module {
public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel, int stride = 1,
         int padding = 0, bool bias = true)
      : options_{stride, padding}, in_(in_channels), out_(out_channels), kernel_(kernel) {
    if (in_channels < 1 || out_channels < 1 || kernel < 1)
      fail(errc::argument, "Conv2d(" + std::to_string(in_channels) + ", " +
                               std::to_string(out_channels) + ", " + std::to_string(kernel) +
                               "): sizes must be positive");
    const float bound = default_init_bound(in_channels * kernel * kernel);
    weight_ = {"weight", uniform_tensor(Shape{out_channels, in_channels, kernel, kernel}, bound)};
    if (bias) bias_ = {"bias", uniform_tensor(Shape{out_channels}, bound)};
  }

  Value forward(Value x) override {
    Value y = conv2d(x, use(x, weight_), options_);
    if (bias_.tensor) y = y + reshape(use(x, bias_), Shape{1, bias_.tensor->numel(), 1, 1});
    return y;
  }

  [[nodiscard]] std::string describe() const override {
    return "Conv2d(" + std::to_string(in_) + " -> " + std::to_string(out_) + ", " +
           std::to_string(kernel_) + "x" + std::to_string(kernel_) + ", stride " +
           std::to_string(options_.stride) + ", padding " + std::to_string(options_.padding) + ")";
  }

  [[nodiscard]] std::vector<Parameter> parameters() const override {
    if (bias_.tensor) return {named(weight_), named(bias_)};
    return {named(weight_)};
  }

private:
  Conv2dOptions options_;
  std::int64_t in_, out_;
  int kernel_;
  Parameter weight_;
  Parameter bias_;
};

} // namespace kiln::nn
