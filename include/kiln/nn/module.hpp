// Module: a layer that builds its part of a graph and owns its parameters (PyTorch-style).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"
#include "kiln/runtime/tensor.hpp"

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

  /// Trainable parameters, named "weight", "bias", or "3.weight" inside a Sequential.
  [[nodiscard]] virtual std::vector<Parameter> parameters() const { return {}; }
  /// Non-trainable state (batchnorm running statistics).
  [[nodiscard]] virtual std::vector<Parameter> buffers() const { return {}; }

  /// Training mode (the default) vs evaluation mode: changes dropout and batchnorm in the
  /// graphs built afterwards.
  virtual void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  [[nodiscard]] bool training() const { return training_; }

protected:
  /// The graph node of a parameter of this module.
  static Value use(Value x, const Parameter& p) { return x.graph->param(p.name, p.tensor); }

  bool training_ = true;
};

} // namespace kiln::nn
