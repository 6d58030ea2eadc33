// Plan: the immutable result of lowering, a list of kernel calls over buffers in one arena.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/passes/target.hpp"
#include "kiln/plan/backend.hpp"
#include "kiln/plan/memory_planner.hpp"

namespace kiln {

/// Where a value's elements live at run time.
struct BufferRef {
  enum class Storage : std::uint8_t { none, arena, param };
  Storage storage = Storage::none;
  std::size_t offset = 0; ///< bytes into the arena, or into the param (a part view of it)
  std::size_t param = 0;  ///< for Storage::param: the index in Plan::params
  Shape shape;
  DType dtype = DType::f32;
};

/// One kernel call.
struct PlanStep {
  Op op = Op::Input;
  ValueId node = -1;
  KernelFn kernel = nullptr;
  std::string kernel_name; ///< the variant the backend chose, e.g. "conv2d.shifted_rows"
  int num_inputs = 0;
  std::array<BufferRef, KernelArgs::max_inputs> inputs{};
  BufferRef output;
  Attrs attrs;
  std::size_t workspace_per_worker = 0;
};

/// A graph input the user feeds before each run.
struct PlanInput {
  std::string name;
  ValueId node = -1;
  BufferRef buffer;
  std::int64_t label_classes = 0; ///< > 0: every fed value must lie in [0, label_classes)
};

/// Everything the executor needs; nothing in it refers back to the IR's nodes.
struct Plan {
  std::vector<PlanStep> steps;
  std::vector<PlanInput> inputs;
  std::vector<BufferRef> values;         ///< where each graph value lives, indexed by ValueId
  std::vector<ValueId> outputs;          ///< graph outputs, as numbered in the lowered graph
  std::vector<ValueId> output_origins;   ///< the same outputs as numbered in the user's graph
  std::int32_t assigns_in_place = 0;     ///< parameter updates written straight into the parameter
  std::int32_t activations_in_place = 0; ///< steps writing over a dying input
  std::vector<std::shared_ptr<Tensor>> params; ///< the host tensors of every param it reads
  std::vector<BufferRequest> buffers;          ///< every arena buffer with its lifetime in steps
  MemoryPlan memory; ///< their offsets, the arena size, the unshared total
  /// Every value of the graph as it was built, before any pass, in a buffer of its own: what
  /// an eager runtime without a memory pool would hold. Set by compile(); the yardstick
  /// for what fusion and planning save together (memory.naive_bytes is planning's alone).
  std::size_t unoptimised_bytes = 0;
  std::size_t workspace_per_worker = 0;
  int threads = 1;
  /// The precision its convolutions and matmuls were allowed to multiply in.
  Precision precision = Precision::f32;
  /// Whether the device may record the step once and replay it (CompileOptions::replay).
  bool replay = true;
  /// The communicator of the plan's all-reduce steps (data-parallel training), else null: the
  /// executor reports its failures after each run.
  std::shared_ptr<Communicator> communicator;
  /// Whether every run checks that its one-element outputs are finite (CompileOptions).
  bool check_finite = false;
  /// The graph compile() was given, whose Values name the outputs; null for a plan lowered
  /// directly.
  const Graph* origin = nullptr;
  /// The device the plan was lowered for: its backend, ISA, and how to measure its peak.
  Target target;
};

} // namespace kiln
