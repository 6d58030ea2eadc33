// Module: a layer that builds its part of a graph and owns its parameters (PyTorch-style).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::nn {

/// A named tensor of a module: a trainable parameter or a buffer (running statistics).
struct Parameter {
  std::string name;
  std::shared_ptr<Tensor> tensor;
};

/// Base of all layers. Calling a module on a Value appends its nodes to that value's graph;
/// the parameters are shared by every graph built from the module, so a training graph and
/// an evaluation graph see the same weights.
class Module {
public:
  virtual ~Module() = default;

  /// Appends this layer's computation on `x` to x's graph.
  virtual Value forward(Value x) = 0;
  Value operator()(Value x) { return forward(x); }

  /// The layer as errors name it, e.g. "Linear(2304 -> 10)"; a layer of your own should say
  /// what it is too.
  [[nodiscard]] virtual std::string describe() const { return "a custom layer"; }

  /// Trainable parameters, named "weight", "bias", or "3.weight" inside a Sequential.
  [[nodiscard]] virtual std::vector<Parameter> parameters() const { return {}; }
  /// Non-trainable state (batchnorm running statistics).
  [[nodiscard]] virtual std::vector<Parameter> buffers() const { return {}; }

  /// Training mode (the default) vs evaluation mode: changes dropout and batchnorm in the
  /// graphs built afterwards.
  virtual void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  [[nodiscard]] bool training() const { return training_; }

  /// Prefixes the names of this module's parameters, e.g. "3." inside a Sequential, so the
  /// IR and DOT output show which layer a parameter belongs to.
  virtual void set_name_prefix(const std::string& prefix) { prefix_ = prefix; }

protected:
  /// A parameter of this module, named with the module's prefix.
  [[nodiscard]] Parameter named(const Parameter& p) const { return {prefix_ + p.name, p.tensor}; }
  /// The graph node of a parameter of this module.
  [[nodiscard]] Value use(Value x, const Parameter& p) const {
    return x.graph->param(prefix_ + p.name, p.tensor);
  }

  bool training_ = true;
  std::string prefix_;
};

} // namespace kiln::nn
