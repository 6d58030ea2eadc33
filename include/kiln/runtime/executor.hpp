// Executor: runs a Plan. Owns the arena and scratch memory; each step is one indirect call.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "kiln/passes/pass.hpp"
#include "kiln/plan/plan.hpp"

namespace kiln {

/// Time spent in one step, from the last profiled runs.
struct StepTime {
  ValueId node = -1;
  Op op = Op::Input;
  double seconds = 0.0; ///< summed over profiled runs
};

/// Runs a compiled plan. Feed inputs with set_input, call run, read outputs.
class Executor {
public:
  explicit Executor(Plan plan, CompileReport report = {})
      : plan_(std::move(plan)), report_(std::move(report)),
        arena_(detail::aligned_zeroed(plan_.memory.arena_bytes)),
        workspace_(detail::aligned_zeroed(plan_.workspace_per_thread *
                                          static_cast<std::size_t>(plan_.threads))),
        threads_(std::make_unique<tbb::task_arena>(plan_.threads)) {
    args_.reserve(plan_.steps.size());
    for (const PlanStep& s : plan_.steps) {
      KernelArgs a;
      a.num_inputs = s.num_inputs;
      for (int i = 0; i < s.num_inputs; ++i)
        a.in[static_cast<std::size_t>(i)] = view(s.inputs[static_cast<std::size_t>(i)]);
      a.out = view(s.output);
      a.attrs = &s.attrs;
      a.workspace = workspace_.get();
      a.workspace_per_thread = s.workspace_per_thread;
      args_.push_back(a);
    }
    step_seconds_.assign(plan_.steps.size(), 0.0);
  }

  /// Copies `data` into the input called `name`; its size must match the input's shape.
  void set_input(const std::string& name, std::span<const float> data) {
    const PlanInput& in = find_input(name, DType::f32, data.size());
    std::memcpy(view(in.buffer).data, data.data(), data.size_bytes());
  }

  /// Copies i32 `data` (e.g. labels) into the input `name`, checking label ranges.
  void set_input(const std::string& name, std::span<const std::int32_t> data) {
    const PlanInput& in = find_input(name, DType::i32, data.size());
    if (in.label_classes > 0)
      for (std::size_t i = 0; i < data.size(); ++i)
        if (data[i] < 0 || data[i] >= in.label_classes)
          fail(errc::label, "input '" + name + "': label " + std::to_string(data[i]) +
                                " at index " + std::to_string(i) + " is outside [0, " +
                                std::to_string(in.label_classes) + ")");
    std::memcpy(view(in.buffer).data, data.data(), data.size_bytes());
  }

  /// Runs every step once, on the plan's thread count.
  void run() {
    threads_->execute([&] {
      if (profiling_) {
        for (std::size_t i = 0; i < args_.size(); ++i) {
          args_[i].run_counter = runs_;
          const auto t0 = std::chrono::steady_clock::now();
          plan_.steps[i].kernel(args_[i]);
          step_seconds_[i] +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        ++profiled_runs_;
      } else {
        for (std::size_t i = 0; i < args_.size(); ++i) {
          args_[i].run_counter = runs_;
          plan_.steps[i].kernel(args_[i]);
        }
      }
    });
    ++runs_;
  }

  /// The elements of graph output `id` (numbered as in the graph given to compile) after
  /// the last run.
  [[nodiscard]] std::span<const float> output(ValueId id) const {
    for (std::size_t i = 0; i < plan_.output_origins.size(); ++i) {
      if (plan_.output_origins[i] != id) continue;
      const BufferRef& b = plan_.values[static_cast<std::size_t>(plan_.outputs[i])];
      if (b.dtype != DType::f32)
        fail(errc::dtype, "output: value %" + std::to_string(id) + " is not f32");
      return {view(b).f32(), static_cast<std::size_t>(b.shape.numel())};
    }
    fail(errc::not_found,
         "output: value %" + std::to_string(id) + " is not marked as a graph output");
  }
  [[nodiscard]] std::span<const float> output(Value v) const { return output(v.id); }
  /// The single element of a scalar output, e.g. the loss.
  [[nodiscard]] float scalar(Value v) const { return output(v.id)[0]; }

  /// Turns per-step timing on or off (off by default: timing costs a clock read per step).
  void set_profiling(bool on) { profiling_ = on; }
  /// Runs made with profiling on: what step_times() sums over.
  [[nodiscard]] std::uint64_t profiled_runs() const { return profiled_runs_; }
  [[nodiscard]] std::vector<StepTime> step_times() const {
    std::vector<StepTime> t;
    for (std::size_t i = 0; i < plan_.steps.size(); ++i)
      t.push_back({plan_.steps[i].node, plan_.steps[i].op, step_seconds_[i]});
    return t;
  }

  [[nodiscard]] const Plan& plan() const { return plan_; }
  /// What compilation did: every pass with its statistics, every fusion decision.
  [[nodiscard]] const CompileReport& report() const { return report_; }
  [[nodiscard]] std::uint64_t runs() const { return runs_; }

private:
  [[nodiscard]] TensorView view(const BufferRef& b) const {
    void* data = b.storage == BufferRef::Storage::param
                     ? static_cast<void*>(static_cast<std::byte*>(b.tensor->data()) + b.offset)
                     : static_cast<void*>(arena_.get() + b.offset);
    return TensorView{data, b.shape, b.dtype};
  }

  const PlanInput& find_input(const std::string& name, DType dtype, std::size_t count) const {
    for (const PlanInput& in : plan_.inputs) {
      if (in.name != name) continue;
      if (in.buffer.dtype != dtype)
        fail(errc::dtype, "input '" + name + "' is " + std::string(dtype_name(in.buffer.dtype)) +
                              ", fed " + std::string(dtype_name(dtype)));
      if (static_cast<std::int64_t>(count) != in.buffer.shape.numel())
        fail(errc::shape, "input '" + name + "' has shape " + in.buffer.shape.str() + " (" +
                              std::to_string(in.buffer.shape.numel()) + " elements), fed " +
                              std::to_string(count));
      return in;
    }
    fail(errc::not_found, "the plan has no input named '" + name + "'");
  }

  Plan plan_;
  CompileReport report_;
  std::unique_ptr<std::byte[], detail::AlignedFree> arena_;
  std::unique_ptr<std::byte[], detail::AlignedFree> workspace_;
  std::unique_ptr<tbb::task_arena> threads_;
  std::vector<KernelArgs> args_;
  std::vector<double> step_seconds_;
  std::uint64_t runs_ = 0;
  std::uint64_t profiled_runs_ = 0;
  bool profiling_ = false;
};

} // namespace kiln
