// nn::Sequential: layers applied in order, e.g. Sequential{Conv2d(1,32,3), ReLU(), ...}.
#pragma once

#include <concepts>
#include <memory>
#include <type_traits>
#include <vector>

#include "kiln/nn/module.hpp"

namespace kiln::nn {

/// Applies its layers in order. Parameter names are prefixed with the layer index, as in
/// PyTorch: "0.weight", "0.bias", "2.weight", ...
class Sequential : public Module {
public:
  Sequential() = default;
  template <class... Layers>
  requires(sizeof...(Layers) > 0 && (std::derived_from<std::decay_t<Layers>, Module> && ...) &&
           !(sizeof...(Layers) == 1 && (std::same_as<std::decay_t<Layers>, Sequential> &&
                                        ...))) explicit Sequential(Layers&&... layers) {
    (layers_.push_back(std::make_shared<std::decay_t<Layers>>(std::forward<Layers>(layers))), ...);
    set_name_prefix("");
  }

  /// Appends a layer; returns *this for chaining.
  Sequential& add(std::shared_ptr<Module> layer) {
    if (!layer) fail(errc::argument, "Sequential::add: null layer");
    layers_.push_back(std::move(layer));
    layers_.back()->set_name_prefix(prefix_ + std::to_string(layers_.size() - 1) + ".");
    return *this;
  }

  /// An error inside a layer is rethrown with the same code, naming the layer and its entry:
  /// "in Sequential entry 4, Linear(2304 -> 10): ...".
  Value forward(Value x) override {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      try {
        x = layers_[i]->forward(x);
      } catch (const Error& e) {
        throw Error(e.code(), "in Sequential entry " + std::to_string(i) + ", " +
                                  layers_[i]->describe() + ": " + e.message());
      }
    }
    return x;
  }

  [[nodiscard]] std::string describe() const override {
    return "Sequential(" + std::to_string(layers_.size()) + " layers)";
  }

  [[nodiscard]] std::vector<Parameter> parameters() const override {
    return collect(&Module::parameters);
  }
  [[nodiscard]] std::vector<Parameter> buffers() const override {
    return collect(&Module::buffers);
  }

  void set_name_prefix(const std::string& prefix) override {
    prefix_ = prefix;
    for (std::size_t i = 0; i < layers_.size(); ++i)
      layers_[i]->set_name_prefix(prefix + std::to_string(i) + ".");
  }

  void train(bool on = true) override {
    training_ = on;
    for (auto& layer : layers_) layer->train(on);
  }

  [[nodiscard]] std::size_t size() const { return layers_.size(); }
  [[nodiscard]] Module& operator[](std::size_t i) { return *layers_.at(i); }

private:
  std::vector<Parameter> collect(std::vector<Parameter> (Module::*list)() const) const {
    std::vector<Parameter> all;
    for (const auto& layer : layers_)
      for (Parameter& p : ((*layer).*list)()) all.push_back(std::move(p));
    return all;
  }

  std::vector<std::shared_ptr<Module>> layers_;
};

} // namespace kiln::nn
