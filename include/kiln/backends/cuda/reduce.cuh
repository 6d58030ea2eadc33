// CUDA sum_to: a tensor summed down to a shape it broadcasts from, in a fixed order; and
// fused_sum_to, the same sum over an elementwise chain's result computed as it is read.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "kiln/backends/cuda/elementwise.cuh"
#include "kiln/backends/cuda/launch.cuh"

namespace kiln::cuda {

namespace sum_to_detail {

/// Threads of every summing block.
inline constexpr int threads = 256;
/// Blocks a call aims for before it stops splitting the reduced rows into slices, and the
/// most slices: enough to fill the device when few outputs each sum many elements.
inline constexpr std::int64_t target_blocks = 512;
inline constexpr std::int64_t max_slices = 256;
/// Elements each thread should at least add per slice, so a slice pays for its partial sum.
inline constexpr std::int64_t min_per_thread = 16;

/// Up to three merged axes of one kind (kept or reduced), outermost first: extent and the
/// input's element stride.
struct Axes {
  int rank = 0;
  std::array<std::int64_t, 3> n{};
  std::array<std::int64_t, 3> stride{};

  /// Input offset of the i-th combination of the axes (row-major over them).
  __device__ std::int64_t offset(std::int64_t i) const {
    std::int64_t at = 0;
    for (int d = rank - 1; d > 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      at += i % n[u] * stride[u];
      i /= n[u];
    }
    return rank > 0 ? at + i * stride[0] : at;
  }
};

/// sum_to after dropping size-1 axes and merging neighbours of the same kind. Output element o
/// is the o-th combination of the kept axes, row-major, so the output is written densely.
struct SumToPlan {
  Axes kept, reduced;
  std::int64_t outputs = 1; ///< product of the kept extents
  std::int64_t summed = 1;  ///< elements per output: product of the reduced extents
  bool any_reduced = false;
  bool inner_kept = false; ///< the innermost (contiguous) axis is kept
  int columns = 1;         ///< inner kept: adjacent output columns per block (a power of 2)
  int block = threads;     ///< inner reduced: threads per output (a power of 2)
  std::int64_t slices = 1; ///< the summed elements cut into this many partial sums

  [[nodiscard]] std::size_t workspace_bytes() const {
    return slices > 1 ? static_cast<std::size_t>(slices * outputs) * sizeof(double) : 0;
  }
};

/// The smallest power of two >= n, within [lo, hi].
inline int pow2_within(std::int64_t n, int lo, int hi) {
  int p = lo;
  while (p < hi && p < n) p *= 2;
  return p;
}

/// How a sum from `from` to `to` (same rank; each dim equal or 1) runs. Depends on the shapes
/// alone, so every run sums in the same order and gives the same bits.
inline SumToPlan plan_sum(const Shape& from, const Shape& to) {
  std::array<std::int64_t, Shape::max_rank> n{};
  std::array<bool, Shape::max_rank> reduced{};
  std::size_t m = 0;
  for (int i = 0; i < from.rank(); ++i) {
    if (from[i] == 1) continue;
    const bool r = to[i] == 1;
    if (m > 0 && reduced[m - 1] == r) {
      n[m - 1] *= from[i];
    } else {
      n[m] = from[i];
      reduced[m] = r;
      ++m;
    }
  }
  SumToPlan p;
  // Strides accumulate from the innermost group out; each kind's axes are listed outermost
  // first, so fill them after counting.
  std::array<std::int64_t, Shape::max_rank> stride{};
  std::int64_t s = 1;
  for (std::size_t g = m; g-- > 0;) {
    stride[g] = s;
    s *= n[g];
  }
  for (std::size_t g = 0; g < m; ++g) {
    Axes& axes = reduced[g] ? p.reduced : p.kept;
    const auto u = static_cast<std::size_t>(axes.rank++);
    axes.n[u] = n[g];
    axes.stride[u] = stride[g];
    (reduced[g] ? p.summed : p.outputs) *= n[g];
  }
  p.any_reduced = p.reduced.rank > 0;
  p.inner_kept = m > 0 && !reduced[m - 1];
  if (!p.any_reduced) return p;
  std::int64_t blocks = 0, per_slice = 0;
  if (p.inner_kept) {
    const std::int64_t width = p.kept.n[static_cast<std::size_t>(p.kept.rank - 1)];
    p.columns = pow2_within(width, 1, 32);
    blocks = p.outputs / width * ((width + p.columns - 1) / p.columns);
    per_slice = threads / p.columns * min_per_thread;
  } else {
    p.block = pow2_within(p.summed, 32, threads);
    blocks = p.outputs;
    per_slice = p.block * min_per_thread;
  }
  const std::int64_t wanted = (p.summed + per_slice - 1) / per_slice;
  p.slices = std::clamp<std::int64_t>(std::min(wanted, target_blocks / blocks), 1, max_slices);
  return p;
}

/// The summed tensor's element i, read from memory.
struct Floats {
  const float* x;
  __device__ float operator()(std::int64_t i) const { return x[i]; }
};

/// The summed tensor's element i, computed by a fused chain from its inputs.
struct ChainValues {
  DeviceProgram program;
  ProgramOperands operands;
  __device__ float operator()(std::int64_t i) const {
    return run_program(program, operands, i, false, 0.0f);
  }
};

/// Elements [lo, hi) of the summed ones that slice `s` of `slices` adds.
__device__ inline void slice_bounds(std::int64_t summed, std::int64_t s, std::int64_t slices,
                                    std::int64_t& lo, std::int64_t& hi) {
  lo = summed * s / slices;
  hi = summed * (s + 1) / slices;
}

/// Innermost axis kept: a block covers `columns` adjacent outputs, its threads' rows running
/// down the summed elements, so a warp reads whole row pieces; the rows' partial sums are
/// then added in a fixed tree.
template <class Source>
__global__ void sum_columns(Source x, float* y, double* partial, SumToPlan p) {
  __shared__ double sums[threads];
  const int t = static_cast<int>(threadIdx.x);
  const int tx = t % p.columns, ty = t / p.columns;
  const int lanes = threads / p.columns;
  const std::int64_t width = p.kept.n[static_cast<std::size_t>(p.kept.rank - 1)];
  const std::int64_t column_tiles = (width + p.columns - 1) / p.columns;
  const std::int64_t per_slice = p.outputs / width * column_tiles;
  const std::int64_t blocks = per_slice * p.slices;
  // The loop index is the same for every thread of the block, so the barriers are uniform.
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t s = b / per_slice, within = b % per_slice;
    const std::int64_t c = within % column_tiles * p.columns + tx;
    const std::int64_t o = within / column_tiles * width + c;
    const bool valid = c < width;
    std::int64_t lo = 0, hi = 0;
    slice_bounds(p.summed, s, p.slices, lo, hi);
    double acc = 0.0;
    if (valid) {
      const std::int64_t base = p.kept.offset(o);
      for (std::int64_t r = lo + ty; r < hi; r += lanes) acc += x(base + p.reduced.offset(r));
    }
    sums[t] = acc;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (ty < half) sums[t] += sums[t + half * p.columns];
      __syncthreads();
    }
    if (ty == 0 && valid) {
      if (p.slices == 1)
        y[o] = static_cast<float>(sums[t]);
      else
        partial[s * p.outputs + o] = sums[t];
    }
    __syncthreads();
  }
}

/// Innermost axis reduced (or everything): a block of p.block threads per output (and slice)
/// strides along the summed elements, contiguous runs first, and adds its threads' partial
/// sums in a fixed tree.
template <class Source> __global__ void sum_runs(Source x, float* y, double* partial, SumToPlan p) {
  __shared__ double sums[threads];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t blocks = p.outputs * p.slices;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t s = b / p.outputs, o = b % p.outputs;
    std::int64_t lo = 0, hi = 0;
    slice_bounds(p.summed, s, p.slices, lo, hi);
    const std::int64_t base = p.kept.offset(o);
    double acc = 0.0;
    for (std::int64_t r = lo + t; r < hi; r += p.block) acc += x(base + p.reduced.offset(r));
    sums[t] = acc;
    __syncthreads();
    for (int half = p.block / 2; half > 0; half /= 2) {
      if (t < half) sums[t] += sums[t + half];
      __syncthreads();
    }
    if (t == 0) {
      if (p.slices == 1)
        y[o] = static_cast<float>(sums[0]);
      else
        partial[s * p.outputs + o] = sums[0];
    }
    __syncthreads();
  }
}

/// Each output's slice sums, added in slice order.
__global__ void sum_slices(const double* partial, float* y, std::int64_t outputs,
                           std::int64_t slices) {
  KILN_CUDA_FOR_EACH(o, outputs) {
    double acc = 0.0;
    for (std::int64_t s = 0; s < slices; ++s) acc += partial[s * outputs + o];
    y[o] = static_cast<float>(acc);
  }
}

__global__ void fill_zero(float* y, std::int64_t n) { KILN_CUDA_FOR_EACH(i, n) y[i] = 0.0f; }

/// Nothing summed: output element i is the source's element i.
template <class Source> __global__ void copy_values(Source x, float* y, std::int64_t n) {
  KILN_CUDA_FOR_EACH(i, n) y[i] = x(i);
}

} // namespace sum_to_detail

/// Workspace of a sum from `from` to `to`: the slices' partial sums, where few outputs each sum
/// many elements.
inline std::size_t sum_workspace(const Shape& from, const Shape& to) {
  if (from.numel() == 0 || to.numel() == 0) return 0;
  return sum_to_detail::plan_sum(from, pad_rank(to, from.rank())).workspace_bytes();
}

/// Sums `source`, a tensor of shape `from`, down to the output's shape.
template <class Source>
void sum_down(const char* name, const KernelArgs& args, const Shape& from, const Source& source) {
  using namespace sum_to_detail;
  float* y = args.out.f32();
  const std::int64_t n_out = args.out.numel();
  if (n_out == 0) return;
  if (from.numel() == 0) { // sums over no elements
    launch(name, fill_zero, blocks_for(n_out), block_threads, 0, y, n_out);
    return;
  }
  SumToPlan p = plan_sum(from, pad_rank(args.out.shape, from.rank()));
  if (!p.any_reduced) {
    launch(name, copy_values<Source>, blocks_for(n_out), block_threads, 0, source, y, n_out);
    return;
  }
  double* partial = nullptr;
  if (p.slices > 1) {
    // Lowering reserved the workspace; without it, one slice still sums correctly.
    if (args.workspace != nullptr && args.workspace_per_worker >= p.workspace_bytes())
      partial = reinterpret_cast<double*>(args.workspace);
    else
      p.slices = 1;
  }
  if (p.inner_kept) {
    const std::int64_t width = p.kept.n[static_cast<std::size_t>(p.kept.rank - 1)];
    const std::int64_t blocks =
        p.outputs / width * ((width + p.columns - 1) / p.columns) * p.slices;
    launch(name, sum_columns<Source>, blocks_for(blocks, 1), threads, 0, source, y, partial, p);
  } else {
    launch(name, sum_runs<Source>, blocks_for(p.outputs * p.slices, 1), p.block, 0, source, y,
           partial, p);
  }
  if (p.slices > 1)
    launch(name, sum_slices, blocks_for(p.outputs), block_threads, 0, partial, y, p.outputs,
           p.slices);
}

/// Workspace of sum_to: the slices' partial sums, where few outputs each sum many elements.
inline std::size_t sum_to_workspace(const KernelQuery& q) {
  return sum_workspace(q.in[0].shape, q.out.shape);
}

/// sum_to: out = x summed over the axes where out has extent 1 and x does not.
inline void sum_to_kernel(const KernelArgs& args) {
  sum_down("sum_to", args, args.in[0].shape, sum_to_detail::Floats{args.in[0].f32()});
}

/// Workspace of fused_sum_to: as sum_to's over the chain's shape.
inline std::size_t fused_sum_to_workspace(const KernelQuery& q) {
  return sum_workspace(std::get<FusedSumAttrs>(*q.attrs).chain.shape, q.out.shape);
}

/// fused_sum_to: each summed element is computed by the chain where the sum reads it.
inline void fused_sum_to_kernel(const KernelArgs& args) {
  const FusedSumAttrs& fused = std::get<FusedSumAttrs>(*args.attrs);
  sum_to_detail::ChainValues chain;
  chain.program = DeviceProgram(fused.chain.program, fused.chain.stores);
  chain.operands.count = args.num_inputs;
  Shape shapes[max_op_inputs];
  for (int k = 0; k < args.num_inputs; ++k) {
    shapes[k] = args.in[static_cast<std::size_t>(k)].shape;
    chain.operands.base[k] = args.in[static_cast<std::size_t>(k)].f32();
  }
  chain.operands.index = BroadcastIndex<max_op_inputs>(fused.chain.shape, shapes, args.num_inputs);
  sum_down("fused_sum_to", args, fused.chain.shape, chain);
}

inline bool fused_sum_to_accepts(const KernelQuery& q) {
  const FusedSumAttrs& fused = std::get<FusedSumAttrs>(*q.attrs);
  return program_fits(fused.chain.program, fused.chain.stores);
}

/// Puts the sum_to and fused_sum_to kernels into the table.
inline void register_reduce_kernels(KernelTable& table) {
  table.add(Op::SumTo, {"sum_to", &sum_to_kernel, nullptr, &sum_to_workspace});
  table.add(Op::FusedSumTo,
            {"fused_sum_to", &fused_sum_to_kernel, &fused_sum_to_accepts, &fused_sum_to_workspace});
}

} // namespace kiln::cuda
