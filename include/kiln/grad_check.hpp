// Finite-difference gradient checking: compares kiln's gradients with central differences.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autodiff/gradients.hpp"
#include "kiln/compile.hpp"

namespace kiln {

struct GradCheckOptions {
  float step = 1e-3f; ///< central difference step h: (f(x+h) - f(x-h)) / 2h
  double absolute_tolerance = 2e-3;
  double relative_tolerance = 2e-2;
  int threads = 1;
  /// The backend the graph runs on; null: the CPU.
  const Backend* backend = nullptr;
};

struct GradCheckResult {
  bool ok = true;
  double max_error = 0.0; ///< max |analytic - numeric| / (atol + rtol·|numeric|); ok iff <= 1
  std::string worst;      ///< where the largest error was, e.g. "param 1 [17]: 0.52 vs 0.49"
};

/// Builds `loss = build(graph, params)` (a one-element value) over the given tensors,
/// differentiates it, and compares every element of every gradient with a central finite
/// difference computed by re-running the compiled graph with that element perturbed.
inline GradCheckResult
check_gradients(const std::function<Value(Graph&, const std::vector<Value>&)>& build,
                const std::vector<std::shared_ptr<Tensor>>& tensors,
                const GradCheckOptions& options = {}) {
  Graph g;
  std::vector<Value> params;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    params.push_back(g.param("p" + std::to_string(i), tensors[i]));
  const Value loss = build(g, params);
  const std::vector<Value> grads = gradients(loss, params);
  g.mark_output(loss);
  for (const Value& gv : grads) g.mark_output(gv);
  Executor exe = compile(g, options.backend ? *options.backend : cpu_backend(),
                         CompileOptions{options.threads, false});
  exe.run();
  std::vector<std::vector<float>> analytic;
  for (const Value& gv : grads) {
    const auto s = exe.output(gv);
    analytic.emplace_back(s.begin(), s.end());
  }
  GradCheckResult result;
  for (std::size_t p = 0; p < tensors.size(); ++p) {
    auto data = tensors[p]->f32();
    for (std::size_t i = 0; i < data.size(); ++i) {
      const float saved = data[i];
      // upload_params: a device with memory of its own sees the host's change only then.
      data[i] = saved + options.step;
      exe.upload_params();
      exe.run();
      const double plus = exe.scalar(loss);
      data[i] = saved - options.step;
      exe.upload_params();
      exe.run();
      const double minus = exe.scalar(loss);
      data[i] = saved;
      exe.upload_params();
      const double numeric = (plus - minus) / (2.0 * static_cast<double>(options.step));
      const double a = analytic[p][i];
      const double err = std::abs(a - numeric) / (options.absolute_tolerance +
                                                  options.relative_tolerance * std::abs(numeric));
      if (err > result.max_error) {
        result.max_error = err;
        result.worst = "param " + std::to_string(p) + " [" + std::to_string(i) + "]: analytic " +
                       std::to_string(a) + " vs numeric " + std::to_string(numeric);
      }
    }
  }
  result.ok = result.max_error <= 1.0;
  return result;
}

} // namespace kiln
