// CUDA elementwise kernels: every elementwise op's body (ops/elementwise.hpp) over the device
// math policy with numpy broadcasting; fused programs, run as fused_elementwise nodes and as
// the epilogues anchors apply while a result is in registers; fill, assign and dropout masks.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "kiln/backends/cuda/device_math.cuh"
#include "kiln/backends/cuda/launch.cuh"
#include "kiln/core/rng.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln::cuda {

/// `op`'s body on one element when `op` is elementwise (its own apply over DeviceMath).
template <Op op> __device__ float apply_if_elementwise(float a, float b, float scalar) {
  if constexpr (OpDef<op>::is_elementwise) return OpDef<op>::apply(DeviceMath{}, a, b, scalar);
  return __int_as_float(0x7fc00000); // not in a verified program: NaN would show it
}

/// `op`'s body on one element, chosen by a switch the op list generates, so a fused program
/// needs no second copy of any op's arithmetic.
__device__ inline float apply_op(Op op, float a, float b, float scalar) {
  switch (op) {
#define KILN_CUDA_APPLY(name, spelling)                                                            \
  case Op::name:                                                                                   \
    return apply_if_elementwise<Op::name>(a, b, scalar);
    KILN_OP_LIST(KILN_CUDA_APPLY)
#undef KILN_CUDA_APPLY
  }
  return __int_as_float(0x7fc00000);
}

/// A fused program in kernel-parameter form (FusedInstruction and FusedStore, flattened).
struct DeviceProgram {
  /// Longest program a kernel takes; a longer one has no CUDA kernel.
  static constexpr int max_steps = 64;
  struct Step {
    Op op;
    std::int8_t a, b;
    float scalar;
  };
  int steps = 0;
  int stores = 0;
  Step code[max_steps];
  std::int8_t store_step[max_op_inputs];
  std::int8_t store_input[max_op_inputs];

  DeviceProgram() = default;
  DeviceProgram(const std::vector<FusedInstruction>& program, const std::vector<FusedStore>& st)
      : steps(static_cast<int>(program.size())), stores(static_cast<int>(st.size())) {
    for (int k = 0; k < steps && k < max_steps; ++k) {
      const FusedInstruction& f = program[static_cast<std::size_t>(k)];
      code[k] = Step{f.op, f.a, f.b, f.scalar};
    }
    for (int s = 0; s < stores && s < max_op_inputs; ++s) {
      store_step[s] = st[static_cast<std::size_t>(s)].step;
      store_input[s] = st[static_cast<std::size_t>(s)].input;
    }
  }
};

/// Whether a program fits a kernel parameter.
inline bool program_fits(const std::vector<FusedInstruction>& program,
                         const std::vector<FusedStore>& stores) {
  return program.size() <= static_cast<std::size_t>(DeviceProgram::max_steps) &&
         stores.size() <= static_cast<std::size_t>(max_op_inputs);
}

/// A program's inputs: their device memory and where output element i lives in each.
struct ProgramOperands {
  int count = 0;
  float* base[max_op_inputs] = {};
  BroadcastIndex<max_op_inputs> index;
};

/// Runs `program` for output element i and returns its last step's value. Input 0 is `first`
/// when `first_given` (an anchor's result in registers), else read from memory. Every input is
/// read before any store writes a param, so a store over an input of the program is safe.
__device__ inline float run_program(const DeviceProgram& program, const ProgramOperands& operands,
                                    std::int64_t i, bool first_given, float first) {
  std::int64_t offset[max_op_inputs];
  operands.index.offsets(i, operands.count, offset);
  float value[DeviceProgram::max_steps];
  for (int s = 0; s < program.steps; ++s) {
    const DeviceProgram::Step& step = program.code[s];
    float operand[2];
    for (int j = 0; j < 2; ++j) {
      const int v = j == 0 ? step.a : step.b;
      const int k = -(v + 1);
      operand[j] = v >= 0                    ? value[v]
                   : (k == 0 && first_given) ? first
                                             : operands.base[k][offset[k]];
    }
    value[s] = apply_op(step.op, operand[0], operand[1], step.scalar);
  }
  for (int s = 0; s < program.stores; ++s) {
    const int k = program.store_input[s];
    operands.base[k][offset[k]] = value[program.store_step[s]];
  }
  return value[program.steps - 1];
}

/// An anchor's epilogue bound to its kernel call, as a kernel parameter: program input 0 is
/// the anchor's result, input k >= 1 the node's input anchor_arity + k - 1. Inactive (the
/// result goes out as it is) when the node has no epilogue.
struct EpilogueParams {
  bool active = false;
  DeviceProgram program;
  ProgramOperands operands;

  EpilogueParams() = default;
  explicit EpilogueParams(const KernelArgs& args) {
    const Epilogue* e = args.attrs ? epilogue_of(*args.attrs) : nullptr;
    if (!e || e->empty()) return;
    active = true;
    program = DeviceProgram(e->program, e->stores);
    Shape shapes[max_op_inputs];
    shapes[0] = args.out.shape;
    operands.base[0] = args.out.f32();
    operands.count = args.num_inputs - anchor_arity + 1;
    for (int k = 1; k < operands.count; ++k) {
      const TensorView& in = args.in[static_cast<std::size_t>(anchor_arity + k - 1)];
      shapes[k] = in.shape;
      operands.base[k] = in.f32();
    }
    operands.index = BroadcastIndex<max_op_inputs>(args.out.shape, shapes, operands.count);
  }

  /// The value output element i gets from the anchor's `result` for it.
  __device__ float operator()(std::int64_t i, float result) const {
    return active ? run_program(program, operands, i, true, result) : result;
  }
};

/// Whether an anchor's epilogue (if any) fits a kernel parameter.
inline bool epilogue_fits(const KernelQuery& q) {
  const Epilogue* e = q.attrs ? epilogue_of(*q.attrs) : nullptr;
  return !e || program_fits(e->program, e->stores);
}

template <Op op>
__global__ void elementwise_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   float* out, std::int64_t n, BroadcastIndex<2> index,
                                   float scalar) {
  KILN_CUDA_FOR_EACH(i, n) {
    std::int64_t offset[2];
    index.offsets(i, 2, offset);
    // Both operands are read before the write: out may be a (or b) itself.
    out[i] = OpDef<op>::apply(DeviceMath{}, a[offset[0]], b[offset[1]], scalar);
  }
}

/// One elementwise op; a unary op reads its one input as both operands.
template <Op op> void elementwise(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const auto* s = std::get_if<ScalarAttrs>(args.attrs);
  const int second = args.num_inputs > 1 ? 1 : 0;
  const Shape shapes[2] = {args.in[0].shape, args.in[static_cast<std::size_t>(second)].shape};
  launch(op_name(op).data(), &elementwise_kernel<op>, blocks_for(n), block_threads, 0,
         args.in[0].f32(), args.in[static_cast<std::size_t>(second)].f32(), args.out.f32(), n,
         BroadcastIndex<2>(args.out.shape, shapes, 2), s ? s->value : 0.0f);
}

__global__ void fused_elementwise_kernel(DeviceProgram program, ProgramOperands operands,
                                         float* out, std::int64_t n) {
  KILN_CUDA_FOR_EACH(i, n) { out[i] = run_program(program, operands, i, false, 0.0f); }
}

inline void fused_elementwise(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const FusedAttrs& fused = std::get<FusedAttrs>(*args.attrs);
  ProgramOperands operands;
  operands.count = args.num_inputs;
  Shape shapes[max_op_inputs];
  for (int k = 0; k < args.num_inputs; ++k) {
    shapes[k] = args.in[static_cast<std::size_t>(k)].shape;
    operands.base[k] = args.in[static_cast<std::size_t>(k)].f32();
  }
  operands.index = BroadcastIndex<max_op_inputs>(args.out.shape, shapes, args.num_inputs);
  launch("fused_elementwise", &fused_elementwise_kernel, blocks_for(n), block_threads, 0,
         DeviceProgram(fused.program, fused.stores), operands, args.out.f32(), n);
}

inline bool fused_accepts(const KernelQuery& q) {
  const FusedAttrs& fused = std::get<FusedAttrs>(*q.attrs);
  return program_fits(fused.program, fused.stores);
}

__global__ void fill_kernel(float* out, std::int64_t n, float value) {
  KILN_CUDA_FOR_EACH(i, n) { out[i] = value; }
}

inline void fill(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  launch("fill", &fill_kernel, blocks_for(n), block_threads, 0, args.out.f32(), n,
         std::get<FillAttrs>(*args.attrs).value);
}

/// Writes input 1 into the param's memory (the output); nothing when they share it.
inline void assign(const KernelArgs& args) {
  if (args.out.data == args.in[1].data || args.out.numel() == 0) return;
  LaunchContext& context = launch_context();
  const cudaError_t error =
      cudaMemcpyAsync(args.out.data, args.in[1].data,
                      static_cast<std::size_t>(args.out.numel()) * dtype_size(args.out.dtype),
                      cudaMemcpyDeviceToDevice, context.stream);
  if (error != cudaSuccess && context.error == cudaSuccess) {
    context.error = error;
    context.failed_kernel = "assign";
  }
}

/// Element i of the mask from (seed, run counter, i) exactly as the CPU kernel draws it.
__global__ void dropout_mask_kernel(float* out, std::int64_t n, float p, std::uint64_t seed,
                                    const std::uint64_t* run_counter) {
  const float keep_scale = 1.0f / (1.0f - p);
  const std::uint64_t stream = mix64(seed ^ mix64(*run_counter + 0x5bd1e995ULL));
  KILN_CUDA_FOR_EACH(i, n) {
    const float u = unit_float(mix64(stream + static_cast<std::uint64_t>(i)));
    out[i] = u < p ? 0.0f : keep_scale;
  }
}

inline void dropout_mask(const KernelArgs& args) {
  const std::int64_t n = args.out.numel();
  if (n == 0) return;
  const DropoutAttrs& a = std::get<DropoutAttrs>(*args.attrs);
  launch("dropout_mask", &dropout_mask_kernel, blocks_for(n), block_threads, 0, args.out.f32(), n,
         a.p, a.seed, launch_context().run_counter);
}

inline void register_elementwise_kernels(KernelTable& table) {
#define KILN_CUDA_REGISTER_ELEMENTWISE(name, spelling)                                             \
  if constexpr (OpDef<Op::name>::is_elementwise)                                                   \
    table.add(Op::name, {spelling, &elementwise<Op::name>});
  KILN_OP_LIST(KILN_CUDA_REGISTER_ELEMENTWISE)
#undef KILN_CUDA_REGISTER_ELEMENTWISE
  table.add(Op::Fill, {"fill", &fill});
  table.add(Op::Assign, {"assign", &assign});
  table.add(Op::DropoutMask, {"dropout_mask", &dropout_mask});
  table.add(Op::FusedElementwise, {"fused_elementwise", &fused_elementwise, &fused_accepts});
}

} // namespace kiln::cuda
