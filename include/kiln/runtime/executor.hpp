// Executor: runs a Plan on a backend's device. Owns the arena and scratch memory there; each
// step is one kernel call the device makes.
#pragma once

#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/passes/report.hpp"
#include "kiln/plan/backend.hpp"
#include "kiln/plan/plan.hpp"

namespace kiln {

/// Time spent in one step, from the last profiled runs.
struct StepTime {
  ValueId node = -1;
  Op op = Op::Input;
  double seconds = 0.0; ///< summed over profiled runs
};

/// Memory from a Device, returned to it when this goes.
class DeviceMemory {
public:
  DeviceMemory() = default;
  DeviceMemory(Device& device, std::size_t bytes)
      : device_(&device), data_(device.allocate(bytes)) {}
  DeviceMemory(DeviceMemory&& other) noexcept
      : device_(std::exchange(other.device_, nullptr)), data_(std::exchange(other.data_, nullptr)) {
  }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(data_, other.data_);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (data_) device_->free(data_);
  }
  [[nodiscard]] std::byte* get() const { return data_; }

private:
  Device* device_ = nullptr;
  std::byte* data_ = nullptr;
};

/// Runs a compiled plan. Feed inputs with set_input, call run, read outputs. It talks to its
/// device through the backend contract only, so it runs any backend's plans the same way.
class Executor {
public:
  /// Opens a device of `backend` with the plan's worker count and places the arena, the
  /// workspace and (on a device with memory of its own) a copy of every parameter there.
  Executor(Plan plan, const Backend& backend, CompileReport report = {})
      : plan_(std::move(plan)), report_(std::move(report)), device_(backend.open(plan_.threads)),
        arena_(*device_, plan_.memory.arena_bytes),
        workspace_(*device_,
                   plan_.workspace_per_worker * static_cast<std::size_t>(device_->workers())) {
    device_->set_replay(plan_.replay);
    bind_params();
    kernels_.reserve(plan_.steps.size());
    args_.reserve(plan_.steps.size());
    for (const PlanStep& s : plan_.steps) {
      KernelArgs a;
      a.num_inputs = s.num_inputs;
      for (int i = 0; i < s.num_inputs; ++i)
        a.in[static_cast<std::size_t>(i)] = view(s.inputs[static_cast<std::size_t>(i)]);
      a.out = view(s.output);
      a.attrs = &s.attrs;
      a.workspace = workspace_.get();
      a.workspace_per_worker = s.workspace_per_worker;
      kernels_.push_back(s.kernel);
      args_.push_back(a);
    }
    step_seconds_.assign(plan_.steps.size(), 0.0);
    output_copies_.resize(plan_.outputs.size());
    fed_.assign(plan_.inputs.size(), false);
  }

  /// Copies `data` into the input called `name`; its size must match the input's shape.
  void set_input(const std::string& name, std::span<const float> data) {
    const PlanInput& in = find_input(name, DType::f32, data.size());
    device_->copy_in(address(in.buffer), data.data(), data.size_bytes());
    mark_fed(in);
  }

  /// The memory of f32 input `name` itself, to be filled in place before run() instead of
  /// copied in by set_input (e.g. through kiln::eigen::input). Only where the device's memory
  /// is the host's; elsewhere kiln.api.argument.
  [[nodiscard]] std::span<float> input_memory(const std::string& name) {
    const PlanInput& in = find_input(name, DType::f32);
    if (!device_->shares_host_memory())
      fail(errc::argument,
           "input_memory('" + name + "'): the device's memory is not the host's; use set_input");
    mark_fed(in);
    return {view(in.buffer).f32(), static_cast<std::size_t>(in.buffer.shape.numel())};
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
    device_->copy_in(address(in.buffer), data.data(), data.size_bytes());
    mark_fed(in);
  }

  /// Runs every step once, on the plan's worker count. Every input must have been set at least
  /// once (kiln.api.argument names the first that was not). With the plan's check_finite, a
  /// one-element output (a loss) that is NaN or infinite afterwards is kiln.runtime.not_finite,
  /// naming the run and the output. In data-parallel training, an all-reduce that failed or
  /// timed out in the run is kiln.dist.collective, naming the rank and the collective; the
  /// parameters that run updated are then not to be used (resume from a checkpoint).
  void run() {
    for (std::size_t i = 0; i < fed_.size(); ++i)
      if (!fed_[i])
        fail(errc::argument, "run: input '" + plan_.inputs[i].name +
                                 "' was never set (set_input or input_memory before the first "
                                 "run)");
    for (KernelArgs& a : args_) a.run_counter = runs_;
    device_->run(kernels_, args_,
                 profiling_ ? std::span<double>(step_seconds_) : std::span<double>{});
    if (profiling_) ++profiled_runs_;
    ++runs_;
    if (plan_.communicator) {
      device_->synchronize();
      if (std::string why = plan_.communicator->failure(); !why.empty())
        fail(errc::dist_collective, "run " + std::to_string(runs_ - 1) + ": " + why);
    }
    if (plan_.check_finite) check_finite_outputs();
  }

  /// The elements of graph output `id` (numbered as in the graph given to compile) after
  /// the last run; waits for the run to finish.
  [[nodiscard]] std::span<const float> output(ValueId id) const {
    for (std::size_t i = 0; i < plan_.output_origins.size(); ++i) {
      if (plan_.output_origins[i] != id) continue;
      const BufferRef& b = plan_.values[static_cast<std::size_t>(plan_.outputs[i])];
      if (b.dtype != DType::f32)
        fail(errc::dtype, "output: value %" + std::to_string(id) + " is not f32");
      const auto count = static_cast<std::size_t>(b.shape.numel());
      device_->synchronize();
      if (device_->shares_host_memory()) return {reinterpret_cast<const float*>(address(b)), count};
      std::vector<float>& copy = output_copies_[i];
      copy.resize(count);
      device_->copy_out(copy.data(), address(b), count * sizeof(float));
      return copy;
    }
    fail(errc::not_found,
         "output: value %" + std::to_string(id) + " is not marked as a graph output");
  }
  /// The elements of graph output `v`, a Value of the graph given to compile (a Value of any
  /// other graph is kiln.api.argument).
  [[nodiscard]] std::span<const float> output(Value v) const {
    if (plan_.origin && v.graph != plan_.origin)
      fail(errc::argument, "output: value %" + std::to_string(v.id) +
                               " belongs to another graph than the one this executor compiled");
    return output(v.id);
  }
  /// The single element of a one-element output, e.g. the loss (kiln.verify.shape for any other).
  [[nodiscard]] float scalar(Value v) const {
    const std::span<const float> out = output(v);
    if (out.size() != 1)
      fail(errc::shape, "scalar: output %" + std::to_string(v.id) + " has " +
                            std::to_string(out.size()) +
                            " elements, not one (read it with output)");
    return out[0];
  }

  /// On a device with memory of its own, copies every parameter the plan updates back into
  /// its host tensor (nothing to do where device memory is host memory).
  void download_params() {
    if (device_->shares_host_memory()) return;
    device_->synchronize();
    for (std::size_t i = 0; i < plan_.params.size(); ++i)
      device_->copy_out(plan_.params[i]->data(), param_memory_[i], tensor_bytes(*plan_.params[i]));
  }
  /// On a device with memory of its own, copies the host tensors of every parameter to the
  /// device again, after the host changed them (nothing to do where memory is shared).
  void upload_params() {
    if (device_->shares_host_memory()) return;
    for (std::size_t i = 0; i < plan_.params.size(); ++i)
      device_->copy_in(param_memory_[i], plan_.params[i]->data(), tensor_bytes(*plan_.params[i]));
  }

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
  /// The device the plan runs on: its clock, its synchronisation.
  [[nodiscard]] Device& device() const { return *device_; }

private:
  void mark_fed(const PlanInput& in) {
    fed_[static_cast<std::size_t>(&in - plan_.inputs.data())] = true;
  }

  void check_finite_outputs() const {
    for (std::size_t i = 0; i < plan_.outputs.size(); ++i) {
      const BufferRef& b = plan_.values[static_cast<std::size_t>(plan_.outputs[i])];
      if (b.dtype != DType::f32 || b.shape.numel() != 1) continue;
      const float v = output(plan_.output_origins[i])[0];
      if (!std::isfinite(v))
        fail(errc::not_finite, "run " + std::to_string(runs_) + ": output %" +
                                   std::to_string(plan_.output_origins[i]) + " is " +
                                   (std::isnan(v) ? "nan"
                                    : v > 0       ? "inf"
                                                  : "-inf") +
                                   " (check_finite)");
    }
  }

  static std::size_t tensor_bytes(const Tensor& t) {
    return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
  }

  /// Where each parameter lives on the device: its host tensor where memory is shared,
  /// else a device copy made here.
  void bind_params() {
    for (const std::shared_ptr<Tensor>& t : plan_.params) {
      if (device_->shares_host_memory()) {
        param_memory_.push_back(static_cast<std::byte*>(t->data()));
        continue;
      }
      param_copies_.emplace_back(*device_, tensor_bytes(*t));
      param_memory_.push_back(param_copies_.back().get());
      device_->copy_in(param_memory_.back(), t->data(), tensor_bytes(*t));
    }
  }

  [[nodiscard]] std::byte* address(const BufferRef& b) const {
    return (b.storage == BufferRef::Storage::param ? param_memory_[b.param] : arena_.get()) +
           b.offset;
  }
  [[nodiscard]] TensorView view(const BufferRef& b) const {
    return TensorView{address(b), b.shape, b.dtype};
  }

  const PlanInput& find_input(const std::string& name, DType dtype) const {
    std::string known;
    for (const PlanInput& in : plan_.inputs) {
      known += (known.empty() ? "'" : ", '") + in.name + "'";
      if (in.name != name) continue;
      if (in.buffer.dtype != dtype)
        fail(errc::dtype, "input '" + name + "' is " + std::string(dtype_name(in.buffer.dtype)) +
                              ", fed " + std::string(dtype_name(dtype)));
      return in;
    }
    fail(errc::not_found, "the plan has no input named '" + name + "' (its inputs: " +
                              (known.empty() ? std::string("none") : known) + ")");
  }
  const PlanInput& find_input(const std::string& name, DType dtype, std::size_t count) const {
    const PlanInput& in = find_input(name, dtype);
    if (static_cast<std::int64_t>(count) != in.buffer.shape.numel())
      fail(errc::shape, "input '" + name + "' has shape " + in.buffer.shape.str() + " (" +
                            std::to_string(in.buffer.shape.numel()) + " elements), fed " +
                            std::to_string(count));
    return in;
  }

  Plan plan_;
  CompileReport report_;
  std::unique_ptr<Device> device_; // before the memory it hands out, which goes first
  DeviceMemory arena_;
  DeviceMemory workspace_;
  std::vector<DeviceMemory> param_copies_;
  std::vector<std::byte*> param_memory_;
  std::vector<KernelFn> kernels_;
  std::vector<KernelArgs> args_;
  std::vector<double> step_seconds_;
  mutable std::vector<std::vector<float>> output_copies_;
  std::vector<bool> fed_; ///< per plan input: set at least once
  std::uint64_t runs_ = 0;
  std::uint64_t profiled_runs_ = 0;
  bool profiling_ = false;
};

} // namespace kiln
