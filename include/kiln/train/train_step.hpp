// train_step(): turns a graph computing a loss into one whole training step.
#pragma once

#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autodiff/gradients.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/ops/ops.hpp"
#include "kiln/train/optimizers.hpp"

namespace kiln {

/// What train_step added to the graph.
struct TrainStep {
  Value loss;
  std::vector<Value> gradients;    ///< one per parameter, in order
  optim::OptimizerState optimizer; ///< learning rate, momentum buffers, Adam moments, step counter
  /// In data-parallel training, the all-reduces the step runs (one per bucket), else 0.
  int collectives = 0;

  /// Sets the learning rate the compiled step uses from its next run on (for schedules).
  void set_learning_rate(float lr) const {
    if (!(lr > 0.0f) || !std::isfinite(lr))
      fail(errc::argument,
           "set_learning_rate: lr must be finite and > 0, got " + std::to_string(lr));
    optimizer.learning_rate->f32()[0] = lr;
  }
  [[nodiscard]] float learning_rate() const { return optimizer.learning_rate->f32()[0]; }
};

/// Options of train_step.
struct TrainStepOptions {
  /// Train parameters the loss does not depend on (their gradient is zero; weight decay and
  /// momentum still move them). Off, such a parameter is kiln.api.argument naming it: usually
  /// a layer left out of the network by mistake.
  bool allow_unused = false;
  /// Data-parallel training: every rank of this communicator runs the same step on its own
  /// share of each batch, and every gradient is averaged over the ranks before the update
  /// (allreduce_mean), so the parameters stay the same everywhere. Null or one rank: none.
  /// Batchnorm's statistics stay per rank, as PyTorch's DistributedDataParallel without
  /// SyncBatchNorm.
  std::shared_ptr<Communicator> communicator = nullptr;
  /// Gradients are averaged in buckets of about this many bytes, the last layer's first (its
  /// gradient exists first), so each all-reduce starts while the backward pass goes on.
  std::size_t bucket_bytes = std::size_t{1} << 20;
};

/// Appends to the loss's graph the backward pass, the optimizer's update of every parameter
/// and the assignments that write the new values back, and marks the loss as an output.
/// Compile the graph afterwards: each run is then forward + backward + update.
template <class Optimizer>
TrainStep train_step(Value loss, const std::vector<nn::Parameter>& params,
                     const Optimizer& optimizer, const TrainStepOptions& options = {}) {
  if (!loss.valid()) fail(errc::argument, "train_step: empty loss value");
  if (params.empty()) fail(errc::argument, "train_step: no parameters to train");
  Graph& g = *loss.graph;
  std::vector<Value> wrt;
  for (const nn::Parameter& p : params) wrt.push_back(g.param(p.name, p.tensor));
  if (!options.allow_unused) {
    const std::vector<bool> used = reaches(loss, wrt);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!used[i])
        fail(errc::argument, "train_step: parameter '" + params[i].name + "' " +
                                 params[i].tensor->shape().str() +
                                 " does not reach the loss (TrainStepOptions::allow_unused trains "
                                 "it anyway)");
  }
  TrainStep step{loss, gradients(loss, wrt), {}, 0};
  std::vector<Value> update_with = step.gradients;
  if (options.communicator && options.communicator->size() > 1) {
    const std::vector<Value> last_first(step.gradients.rbegin(), step.gradients.rend());
    const std::vector<Value> averaged =
        allreduce_mean(last_first, options.communicator, options.bucket_bytes, step.collectives);
    update_with.assign(averaged.rbegin(), averaged.rend());
    options.communicator->reserve(step.collectives);
  }
  // Every new value is computed before any is written back, so no update reads a
  // parameter another update has already replaced.
  for (const auto& u : optimizer.append(g, params, update_with, step.optimizer))
    assign(u.param, u.new_value);
  g.mark_output(loss);
  return step;
}

} // namespace kiln
