// Profiler: every plan step's time per run, FLOPs and bytes, and the GFLOP/s and GB/s it
// achieved against the machine's peak.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/ops/registry.hpp"
#include "kiln/passes/cost_model.hpp"
#include "kiln/runtime/executor.hpp"

namespace kiln {

/// The peak of `target`'s device on `threads` workers (0: its default), as the target
/// measures it: measured on first use (about half a second), then remembered for the
/// rest of the process. Measure before any compiled step runs: worker threads still spinning
/// after a run take cores from the measurement.
inline MachinePeak machine_peak(const Target& target, int threads) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, int>, MachinePeak> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  const int workers = threads > 0 ? threads : target.default_threads;
  const auto key = std::make_tuple(target.backend, target.isa, workers);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  MachinePeak p;
  p.threads = workers;
  p.gflops = target.peak_gflops ? target.peak_gflops(workers) : 0.0;
  p.gbytes_per_s = target.copy_gbytes_per_s ? target.copy_gbytes_per_s(workers) : 0.0;
  p.cache_gbytes_per_s = target.cache_gbytes_per_s ? target.cache_gbytes_per_s(workers) : 0.0;
  return measured[key] = p;
}

/// The peak of the plan's device on its thread count (see above).
inline MachinePeak machine_peak(const Plan& plan) {
  return machine_peak(plan.target, plan.threads);
}

/// One plan step, averaged over the executor's profiled runs.
struct StepProfile {
  ValueId node = -1;
  Op op = Op::Input;
  Shape shape;                    ///< of the output
  double seconds = 0.0;           ///< per run
  double flops = 0.0;             ///< per run, from the op's definition (OpDef::flops)
  double bytes = 0.0;             ///< per run: every input read once, the output written once
  double predicted_seconds = 0.0; ///< the cost model's time for it (0 without a peak)
  [[nodiscard]] double gflops() const { return seconds > 0 ? flops / seconds * 1e-9 : 0.0; }
  [[nodiscard]] double gbytes_per_s() const { return seconds > 0 ? bytes / seconds * 1e-9 : 0.0; }
};

/// Floating-point operations of one plan step.
inline double step_flops(const PlanStep& s) {
  std::array<Shape, max_op_inputs> shapes{};
  for (int i = 0; i < s.num_inputs; ++i)
    shapes[static_cast<std::size_t>(i)] = s.inputs[static_cast<std::size_t>(i)].shape;
  const CostContext c{std::span<const Shape>(shapes.data(), static_cast<std::size_t>(s.num_inputs)),
                      s.output.shape, s.attrs};
  return static_cast<double>(op_info(s.op).flops(c));
}

/// Bytes a plan step must at least move: each input read once, the output written once.
inline double step_bytes(const PlanStep& s) {
  const auto size = [](const BufferRef& b) {
    return static_cast<double>(b.shape.numel()) * static_cast<double>(dtype_size(b.dtype));
  };
  double total = size(s.output);
  for (int i = 0; i < s.num_inputs; ++i) total += size(s.inputs[static_cast<std::size_t>(i)]);
  return total;
}

/// The call a plan step makes, as its backend's kernel selection and cost model see it.
inline KernelWork step_work(const Plan& plan, const PlanStep& s) {
  std::array<TensorType, max_op_inputs> in{};
  for (int i = 0; i < s.num_inputs; ++i) {
    const BufferRef& b = s.inputs[static_cast<std::size_t>(i)];
    in[static_cast<std::size_t>(i)] = TensorType{b.shape, b.dtype};
  }
  return kernel_work(
      plan.target,
      KernelQuery{s.op, &s.attrs,
                  std::span<const TensorType>(in.data(), static_cast<std::size_t>(s.num_inputs)),
                  TensorType{s.output.shape, s.output.dtype}, plan.precision});
}

/// The cost model's time for one run of the plan on a device of `peak`: the sum over its
/// steps.
inline double predicted_run_seconds(const Plan& plan, const MachinePeak& peak) {
  const CostModel model{peak};
  double total = 0.0;
  for (const PlanStep& s : plan.steps) total += model.seconds(step_work(plan, s));
  return total;
}

/// Every step of the executor's plan with its time per profiled run (zero before the first
/// run with profiling on; see CompileOptions::profile) and, where `peak` is known, the cost
/// model's time for it.
inline std::vector<StepProfile> profile_steps(const Executor& exe, const MachinePeak& peak = {}) {
  const std::vector<StepTime> times = exe.step_times();
  const double runs = static_cast<double>(std::max<std::uint64_t>(1, exe.profiled_runs()));
  const CostModel model{peak};
  std::vector<StepProfile> steps;
  for (std::size_t i = 0; i < times.size(); ++i) {
    const PlanStep& s = exe.plan().steps[i];
    steps.push_back({s.node, s.op, s.output.shape, times[i].seconds / runs, step_flops(s),
                     step_bytes(s), model.seconds(step_work(exe.plan(), s))});
  }
  return steps;
}

/// Prints the `top` steps that took the most time: milliseconds per run, share of the step
/// total, achieved GFLOP/s and GB/s, and those as a share of `peak` (GB/s above 100% of the
/// copy bandwidth means the step's data came from the caches).
inline void print_profile(std::FILE* out, const Executor& exe, const MachinePeak& peak,
                          std::size_t top = 12) {
  std::vector<StepProfile> steps = profile_steps(exe, peak);
  double total = 0.0, predicted = 0.0;
  for (const StepProfile& s : steps) {
    total += s.seconds;
    predicted += s.predicted_seconds;
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepProfile& a, const StepProfile& b) { return a.seconds > b.seconds; });
  std::fprintf(out,
               "peak on %d threads, measured at start-up: %.0f GFLOP/s (FP32 FMA), %.1f GB/s "
               "(copy)\n",
               peak.threads, peak.gflops, peak.gbytes_per_s);
  std::fprintf(out, "top kernels of %zu, %.3f ms per run in all (cost model: %.3f ms):\n",
               steps.size(), 1000.0 * total, 1000.0 * predicted);
  std::fprintf(out, "  %5s %-28s %-16s %8s %6s %8s %6s %7s %6s %8s\n", "node", "op", "output", "ms",
               "time", "GFLOP/s", "peak", "GB/s", "copy", "model ms");
  const auto share = [](double part, double whole) {
    return whole > 0 ? 100.0 * part / whole : 0.0;
  };
  for (std::size_t i = 0; i < std::min(top, steps.size()); ++i) {
    const StepProfile& s = steps[i];
    std::fprintf(out, "  %%%-4d %-28s %-16s %8.3f %5.1f%% %8.1f %5.1f%% %7.1f %5.1f%% %8.3f\n",
                 static_cast<int>(s.node), std::string(op_name(s.op)).c_str(),
                 s.shape.str().c_str(), 1000.0 * s.seconds, share(s.seconds, total), s.gflops(),
                 share(s.gflops(), peak.gflops), s.gbytes_per_s(),
                 share(s.gbytes_per_s(), peak.gbytes_per_s), 1000.0 * s.predicted_seconds);
  }
}

} // namespace kiln
