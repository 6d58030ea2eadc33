// Parameter-free layers: ReLU, MaxPool2d, AvgPool2d, GlobalAvgPool2d, Flatten, Dropout.
#pragma once

#include "kiln/nn/init.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::nn {

/// "(kernel k, stride s, padding p)" of a pooling layer.
inline std::string pool_text(const Pool2dOptions& o) {
  return "(kernel " + std::to_string(o.kernel) + ", stride " +
         std::to_string(o.stride > 0 ? o.stride : o.kernel) + ", padding " +
         std::to_string(o.padding) + ")";
}

class ReLU : public Module {
public:
  Value forward(Value x) override { return relu(x); }
  [[nodiscard]] std::string describe() const override { return "ReLU"; }
};

/// Max pooling; stride defaults to the kernel size.
class MaxPool2d : public Module {
public:
  explicit MaxPool2d(int kernel, int stride = 0, int padding = 0)
      : options_{kernel, stride, padding} {}
  Value forward(Value x) override { return max_pool2d(x, options_); }
  [[nodiscard]] std::string describe() const override { return "MaxPool2d" + pool_text(options_); }

private:
  Pool2dOptions options_;
};

/// Average pooling; stride defaults to the kernel size.
class AvgPool2d : public Module {
public:
  explicit AvgPool2d(int kernel, int stride = 0, int padding = 0)
      : options_{kernel, stride, padding} {}
  Value forward(Value x) override { return avg_pool2d(x, options_); }
  [[nodiscard]] std::string describe() const override { return "AvgPool2d" + pool_text(options_); }

private:
  Pool2dOptions options_;
};

/// [N,C,H,W] -> [N,C], the mean of each channel.
class GlobalAvgPool2d : public Module {
public:
  Value forward(Value x) override { return global_avg_pool2d(x); }
  [[nodiscard]] std::string describe() const override { return "GlobalAvgPool2d"; }
};

/// [N, ...] -> [N, rest].
class Flatten : public Module {
public:
  Value forward(Value x) override { return flatten(x); }
  [[nodiscard]] std::string describe() const override { return "Flatten"; }
};

/// Inverted dropout in training mode (zero with probability p, scale the rest by 1/(1-p));
/// the identity in evaluation mode. Each layer draws its own seed from the generator, and
/// the mask changes every run of the compiled step.
class Dropout : public Module {
public:
  explicit Dropout(float p = 0.5f) : p_(p), seed_(default_generator().next_u64()) {
    if (!(p >= 0.0f && p < 1.0f))
      fail(errc::argument, "Dropout(" + std::to_string(p) + "): p must be in [0, 1)");
  }
  Value forward(Value x) override {
    if (!training_ || p_ == 0.0f) return x;
    return x * dropout_mask(*x.graph, x.shape(), p_, seed_);
  }
  [[nodiscard]] std::string describe() const override {
    return "Dropout(" + std::to_string(p_) + ")";
  }

private:
  float p_;
  std::uint64_t seed_;
};

} // namespace kiln::nn
