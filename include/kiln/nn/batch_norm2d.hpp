// nn::BatchNorm2d: per-channel normalisation with batch statistics in training and running
// statistics in evaluation, built from elementwise ops and reductions.
#pragma once

#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::nn {

/// Training: y = (x - mean_b) / sqrt(var_b + eps) * weight + bias over each channel of an
/// NCHW batch, and running_mean/var move towards the batch statistics by `momentum`
/// (running_var takes the unbiased variance, as in PyTorch). Evaluation uses the running
/// statistics.
class BatchNorm2d : public Module {
public:
  explicit BatchNorm2d(std::int64_t channels, float eps = 1e-5f, float momentum = 0.1f)
      : channels_(channels), eps_(eps), momentum_(momentum) {
    if (channels < 1)
      fail(errc::argument,
           "BatchNorm2d(" + std::to_string(channels) + "): channels must be positive");
    weight_ = {"weight", constant_tensor(Shape{channels}, 1.0f)};
    bias_ = {"bias", constant_tensor(Shape{channels}, 0.0f)};
    running_mean_ = {"running_mean", constant_tensor(Shape{channels}, 0.0f)};
    running_var_ = {"running_var", constant_tensor(Shape{channels}, 1.0f)};
  }

  [[nodiscard]] std::string describe() const override {
    return "BatchNorm2d(" + std::to_string(channels_) + ")";
  }

  Value forward(Value x) override {
    const Shape s = x.shape();
    if (s.rank() != 4 || s[1] != channels_)
      fail(errc::shape, "BatchNorm2d(" + std::to_string(channels_) + "): input %" +
                            std::to_string(x.id) + ":" + s.str() + " is not [N," +
                            std::to_string(channels_) + ",H,W]");
    const Shape per_channel{1, channels_, 1, 1};
    const Value gamma = reshape(use(x, weight_), per_channel);
    const Value beta = reshape(use(x, bias_), per_channel);
    const Value rm = use(x, running_mean_);
    const Value rv = use(x, running_var_);
    if (!training_) {
      const Value inv_std = rsqrt(reshape(rv, per_channel) + eps_);
      return (x - reshape(rm, per_channel)) * (inv_std * gamma) + beta;
    }
    const auto count = static_cast<float>(s[0] * s[2] * s[3]);
    const Value mean_c = mul_scalar(sum_to(x, per_channel), 1.0f / count);
    const Value centred = x - mean_c;
    const Value var_c = mul_scalar(sum_to(square(centred), per_channel), 1.0f / count);
    const Value y = centred * (rsqrt(var_c + eps_) * gamma) + beta;
    // Running statistics: r' = (1 - m) r + m stat.
    const float unbias = count > 1.0f ? count / (count - 1.0f) : 1.0f;
    const Shape flat{channels_};
    assign(rm, mul_scalar(rm, 1.0f - momentum_) + mul_scalar(reshape(mean_c, flat), momentum_));
    assign(rv,
           mul_scalar(rv, 1.0f - momentum_) + mul_scalar(reshape(var_c, flat), momentum_ * unbias));
    return y;
  }

  [[nodiscard]] std::vector<Parameter> parameters() const override {
    return {named(weight_), named(bias_)};
  }
  [[nodiscard]] std::vector<Parameter> buffers() const override {
    return {named(running_mean_), named(running_var_)};
  }

private:
  std::int64_t channels_;
  float eps_;
  float momentum_;
  Parameter weight_, bias_, running_mean_, running_var_;
};

} // namespace kiln::nn
