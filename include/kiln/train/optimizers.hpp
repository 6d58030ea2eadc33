// Optimizers as graph ops: SGD (momentum, weight decay) and Adam append their update to the
// training graph, so one compiled step is forward + backward + update.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"

namespace kiln::optim {

/// A parameter's new value, to be assigned once every update is computed.
struct Update {
  Value param;
  Value new_value;
};

/// The tensors an optimizer keeps between steps. The learning rate is one of them (a
/// one-element tensor read by the compiled step), so a schedule can change it between runs
/// without recompiling.
struct OptimizerState {
  std::vector<nn::Parameter> tensors;
  std::shared_ptr<Tensor> learning_rate;

  /// The learning-rate node of graph `g`, created on first use with value `lr`.
  Value learning_rate_node(Graph& g, float lr) {
    if (!learning_rate) {
      learning_rate = std::make_shared<Tensor>(Shape{1});
      learning_rate->f32()[0] = lr;
      tensors.push_back({"lr", learning_rate});
    }
    return g.param("lr", learning_rate);
  }
};

/// Stochastic gradient descent, PyTorch's formulation (dampening 0):
///   g' = g + weight_decay·w;  v = momentum·v + g';  w = w - lr·v
struct SGD {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;

  /// Appends the update of every parameter; optimizer state tensors go to `state`.
  [[nodiscard]] std::vector<Update> append(Graph& g, const std::vector<nn::Parameter>& params,
                                           const std::vector<Value>& grads,
                                           OptimizerState& state) const {
    if (!(lr > 0.0f) || !std::isfinite(lr) || !(momentum >= 0.0f) || !std::isfinite(momentum) ||
        !(weight_decay >= 0.0f) || !std::isfinite(weight_decay))
      fail(errc::argument, "SGD: lr must be finite and > 0, momentum and weight_decay finite and "
                           ">= 0 (got lr " +
                               std::to_string(lr) + ", momentum " + std::to_string(momentum) +
                               ", weight_decay " + std::to_string(weight_decay) + ")");
    const Value rate = state.learning_rate_node(g, lr);
    std::vector<Update> updates;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Value w = g.param(params[i].name, params[i].tensor);
      Value step = grads[i];
      if (weight_decay != 0.0f) step = step + mul_scalar(w, weight_decay);
      if (momentum != 0.0f) {
        nn::Parameter velocity{params[i].name + ".momentum",
                               std::make_shared<Tensor>(params[i].tensor->shape())};
        const Value v = g.param(velocity.name, velocity.tensor);
        step = mul_scalar(v, momentum) + step;
        updates.push_back({v, step});
        state.tensors.push_back(std::move(velocity));
      }
      updates.push_back({w, w - step * rate});
    }
    return updates;
  }
};

/// Adam (Kingma & Ba), PyTorch's formulation with L2 weight decay:
///   m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²;  w = w - lr·(m/(1-b1^t)) / (sqrt(v/(1-b2^t)) +
///   eps)
struct Adam {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;

  [[nodiscard]] std::vector<Update> append(Graph& g, const std::vector<nn::Parameter>& params,
                                           const std::vector<Value>& grads,
                                           OptimizerState& state) const {
    if (!(lr > 0.0f) || !std::isfinite(lr) || !(beta1 >= 0.0f && beta1 < 1.0f) ||
        !(beta2 >= 0.0f && beta2 < 1.0f) || !(eps > 0.0f) || !std::isfinite(eps) ||
        !(weight_decay >= 0.0f) || !std::isfinite(weight_decay))
      fail(errc::argument, "Adam: needs lr and eps finite and > 0, betas in [0, 1), weight_decay "
                           "finite and >= 0");
    const Value rate = state.learning_rate_node(g, lr);
    std::vector<Update> updates;
    // The step counter t lives in a one-element state tensor, so the bias corrections
    // 1 - beta^t = 1 - exp(t·ln beta) are computed inside the compiled step.
    nn::Parameter counter{"adam.step", std::make_shared<Tensor>(Shape{1})};
    const Value t = add_scalar(g.param(counter.name, counter.tensor), 1.0f);
    updates.push_back({g.param(counter.name, counter.tensor), t});
    state.tensors.push_back(counter);
    const Value correction1 = add_scalar(neg(exp(mul_scalar(t, std::log(beta1)))), 1.0f);
    const Value correction2 = add_scalar(neg(exp(mul_scalar(t, std::log(beta2)))), 1.0f);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Shape& shape = params[i].tensor->shape();
      const Value w = g.param(params[i].name, params[i].tensor);
      Value grad = grads[i];
      if (weight_decay != 0.0f) grad = grad + mul_scalar(w, weight_decay);
      nn::Parameter m_state{params[i].name + ".adam_m", std::make_shared<Tensor>(shape)};
      nn::Parameter v_state{params[i].name + ".adam_v", std::make_shared<Tensor>(shape)};
      const Value m = g.param(m_state.name, m_state.tensor);
      const Value v = g.param(v_state.name, v_state.tensor);
      const Value m_new = mul_scalar(m, beta1) + mul_scalar(grad, 1.0f - beta1);
      const Value v_new = mul_scalar(v, beta2) + mul_scalar(square(grad), 1.0f - beta2);
      const Value denom = add_scalar(sqrt(v_new / correction2), eps);
      updates.push_back({m, m_new});
      updates.push_back({v, v_new});
      updates.push_back({w, w - m_new / correction1 / denom * rate});
      state.tensors.push_back(std::move(m_state));
      state.tensors.push_back(std::move(v_state));
    }
    return updates;
  }
};

} // namespace kiln::optim
