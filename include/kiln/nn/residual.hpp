// nn::Residual: a skip connection, y = inner(x) + x.
#pragma once

#include <memory>

#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::nn {

/// Adds the input to the output of `inner` (which must keep the shape), as in ResNet blocks.
class Residual : public Module {
public:
  template <class Inner>
  requires(std::derived_from<std::decay_t<Inner>, Module> &&
           !std::same_as<std::decay_t<Inner>, Residual>) explicit Residual(Inner&& inner)
      : inner_(std::make_shared<std::decay_t<Inner>>(std::forward<Inner>(inner))) {}

  Value forward(Value x) override {
    const Value y = inner_->forward(x);
    if (!(y.shape() == x.shape()))
      fail(errc::shape, "Residual: inner output %" + std::to_string(y.id) + ":" + y.shape().str() +
                            " differs from its input " + x.shape().str());
    return y + x;
  }
  [[nodiscard]] std::string describe() const override {
    return "Residual(" + inner_->describe() + ")";
  }
  [[nodiscard]] std::vector<Parameter> parameters() const override { return inner_->parameters(); }
  [[nodiscard]] std::vector<Parameter> buffers() const override { return inner_->buffers(); }
  void train(bool on = true) override {
    training_ = on;
    inner_->train(on);
  }
  void set_name_prefix(const std::string& prefix) override {
    prefix_ = prefix;
    inner_->set_name_prefix(prefix);
  }

private:
  std::shared_ptr<Module> inner_;
};

} // namespace kiln::nn
