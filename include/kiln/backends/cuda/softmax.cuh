// CUDA log-softmax and softmax cross-entropy with integer labels, with their gradients.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kiln/backends/cuda/launch.cuh"
#include "kiln/backends/rows.hpp"

namespace kiln::cuda {

namespace softmax_detail {

/// Threads of every block.
inline constexpr int threads = 256;
/// Rows up to this wide get one warp each (eight rows a block); wider rows a whole block.
inline constexpr std::int64_t warp_row_limit = 1024;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

/// Reduces v over a group of kGroup threads (a warp, or the whole block) in a fixed order;
/// every thread of the group gets the same bits (the butterfly adds each pair commutatively).
/// `scratch` is shared memory of threads / 32 floats, used by whole-block groups only.
template <int kGroup, class F> __device__ float reduce_group(float v, F f, float* scratch) {
  for (int mask = 16; mask > 0; mask /= 2) v = f(v, __shfl_xor_sync(0xffffffffu, v, mask));
  if constexpr (kGroup == 32) {
    return v;
  } else {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    __syncthreads(); // the previous reduction's readers are done with scratch
    if (threadIdx.x % 32 == 0) scratch[warp] = v;
    __syncthreads();
    float r = scratch[0];
    for (int w = 1; w < kGroup / 32; ++w) r = f(r, scratch[w]);
    return r;
  }
}

/// log(sum(exp(row))) shifted by the row max so exp cannot overflow, as the CPU computes it.
template <int kGroup>
__device__ float row_log_sum_exp(const float* xr, std::int64_t cols, int lane, float* scratch) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = lane; j < cols; j += kGroup) m = fmaxf(m, xr[j]);
  m = reduce_group<kGroup>(m, MaxOp{}, scratch);
  float s = 0.0f;
  for (std::int64_t j = lane; j < cols; j += kGroup) s += expf(xr[j] - m);
  s = reduce_group<kGroup>(s, SumOp{}, scratch);
  return m + logf(s);
}

/// Calls body(row, lane) for every row, a group of kGroup threads per row. Every thread of a
/// group sees the same rows, so the group's shuffles and barriers are uniform.
template <int kGroup, class Body> __device__ void for_each_row(std::int64_t rows, Body body) {
  constexpr int per_block = threads / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int sub = static_cast<int>(threadIdx.x) / kGroup;
  for (std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * per_block; first < rows;
       first += static_cast<std::int64_t>(gridDim.x) * per_block) {
    const std::int64_t row = first + sub;
    // Only a warp group can run out of rows inside a block; a block group's row is `first`.
    if (row < rows) body(row, lane);
  }
}

template <int kGroup>
__global__ void log_softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t cols) {
  __shared__ float scratch[threads / 32];
  for_each_row<kGroup>(rows, [&](std::int64_t row, int lane) {
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    const float lse = row_log_sum_exp<kGroup>(xr, cols, lane, scratch);
    for (std::int64_t j = lane; j < cols; j += kGroup) yr[j] = xr[j] - lse;
  });
}

/// dx = dy - exp(y) * sum(dy) per row.
template <int kGroup>
__global__ void log_softmax_grad_rows(const float* y, const float* dy, float* dx, std::int64_t rows,
                                      std::int64_t cols) {
  __shared__ float scratch[threads / 32];
  for_each_row<kGroup>(rows, [&](std::int64_t row, int lane) {
    const float* yr = y + row * cols;
    const float* dyr = dy + row * cols;
    float* dxr = dx + row * cols;
    float s = 0.0f;
    for (std::int64_t j = lane; j < cols; j += kGroup) s += dyr[j];
    s = reduce_group<kGroup>(s, SumOp{}, scratch);
    for (std::int64_t j = lane; j < cols; j += kGroup) dxr[j] = fmaf(-expf(yr[j]), s, dyr[j]);
  });
}

/// Per row of logits: with kLoss, the row's loss term logsumexp(row) - row[label] into
/// terms[row]; with kGrad, the gradient row (softmax(row) - onehot(label)) * dloss / batch,
/// computed as the CPU does (p * scale, then scale taken off at the label).
template <int kGroup, bool kLoss, bool kGrad>
__global__ void cross_entropy_rows(const float* x, const std::int32_t* labels, const float* dloss,
                                   float batch, float* dx, float* terms, std::int64_t rows,
                                   std::int64_t cols) {
  __shared__ float scratch[threads / 32];
  const float scale = kGrad ? *dloss / batch : 0.0f;
  for_each_row<kGroup>(rows, [&](std::int64_t row, int lane) {
    const float* xr = x + row * cols;
    const float lse = row_log_sum_exp<kGroup>(xr, cols, lane, scratch);
    const std::int32_t label = labels[row];
    // The executor checks fed labels; one outside the row still must not read past it.
    const bool known = label >= 0 && label < cols;
    if (kLoss && lane == 0)
      terms[row] = known ? lse - xr[label] : std::numeric_limits<float>::quiet_NaN();
    if (kGrad) {
      float* dxr = dx + row * cols;
      for (std::int64_t j = lane; j < cols; j += kGroup) {
        float v = expf(xr[j] - lse) * scale;
        if (j == label) v -= scale;
        dxr[j] = v;
      }
    }
  });
}

/// The mean of the rows' loss terms, summed in double in a fixed order (one block), so the
/// loss alone and the loss beside its gradient give the same bits.
__global__ void mean_of_terms(const float* terms, float* loss, std::int64_t rows) {
  __shared__ double sums[threads];
  const int t = static_cast<int>(threadIdx.x);
  double acc = 0.0;
  for (std::int64_t i = t; i < rows; i += threads) acc += static_cast<double>(terms[i]);
  sums[t] = acc;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (t < half) sums[t] += sums[t + half];
    __syncthreads();
  }
  if (t == 0)
    *loss = rows == 0 ? std::numeric_limits<float>::quiet_NaN() // the mean over no rows: 0/0
                      : static_cast<float>(sums[0] / static_cast<double>(rows));
}

/// Launches kernel<32> (a warp per row) for narrow rows, kernel<threads> (a block per row)
/// for wide ones.
template <class Warp, class Block, class... Args>
void launch_rows(const char* name, Warp warp_kernel, Block block_kernel, const Rows& r,
                 Args&&... args) {
  if (r.cols <= warp_row_limit)
    launch(name, warp_kernel, blocks_for(r.rows, threads / 32), threads, 0, args...);
  else
    launch(name, block_kernel, blocks_for(r.rows, 1), threads, 0, args...);
}

/// Records that a launcher lacked the workspace lowering reserves for it.
inline void fail_without_workspace(const char* name) {
  LaunchContext& context = launch_context();
  if (context.error != cudaSuccess) return;
  context.error = cudaErrorInvalidValue;
  context.failed_kernel = name;
}

/// The cross-entropy family: the loss (into `loss`, when not null), the gradient (into
/// `grad`, when not null), from one logsumexp per row.
inline void cross_entropy(const KernelArgs& args, const char* name, float* grad, float* loss) {
  const Rows r = rows_of(args.in[0].shape);
  const float* x = args.in[0].f32();
  const std::int32_t* labels = args.in[1].i32();
  const float* dloss = grad ? args.in[2].f32() : nullptr;
  const auto batch = static_cast<float>(std::max<std::int64_t>(1, r.rows));
  float* terms = nullptr;
  if (loss && r.rows > 0) {
    if (args.workspace == nullptr ||
        args.workspace_per_worker < static_cast<std::size_t>(r.rows) * sizeof(float)) {
      fail_without_workspace(name);
      return;
    }
    terms = reinterpret_cast<float*>(args.workspace);
  }
  if (r.rows > 0) {
    if (loss && grad)
      launch_rows(name, cross_entropy_rows<32, true, true>, cross_entropy_rows<threads, true, true>,
                  r, x, labels, dloss, batch, grad, terms, r.rows, r.cols);
    else if (loss)
      launch_rows(name, cross_entropy_rows<32, true, false>,
                  cross_entropy_rows<threads, true, false>, r, x, labels, dloss, batch, grad, terms,
                  r.rows, r.cols);
    else
      launch_rows(name, cross_entropy_rows<32, false, true>,
                  cross_entropy_rows<threads, false, true>, r, x, labels, dloss, batch, grad, terms,
                  r.rows, r.cols);
  }
  if (loss) launch(name, mean_of_terms, 1, threads, 0, terms, loss, r.rows);
}

} // namespace softmax_detail

/// Workspace of the cross-entropy loss kernels: each row's loss term, summed afterwards in a
/// fixed order.
inline std::size_t cross_entropy_workspace(const KernelQuery& q) {
  return static_cast<std::size_t>(rows_of(q.in[0].shape).rows) * sizeof(float);
}

/// log_softmax over the last dim: x - logsumexp(row).
inline void log_softmax_kernel(const KernelArgs& args) {
  using namespace softmax_detail;
  const Rows r = rows_of(args.in[0].shape);
  if (r.rows == 0) return;
  launch_rows("log_softmax", log_softmax_rows<32>, log_softmax_rows<threads>, r, args.in[0].f32(),
              args.out.f32(), r.rows, r.cols);
}

/// log_softmax_grad: (y, dy) -> dy - exp(y) * sum(dy) per row.
inline void log_softmax_grad_kernel(const KernelArgs& args) {
  using namespace softmax_detail;
  const Rows r = rows_of(args.in[0].shape);
  if (r.rows == 0) return;
  launch_rows("log_softmax_grad", log_softmax_grad_rows<32>, log_softmax_grad_rows<threads>, r,
              args.in[0].f32(), args.in[1].f32(), args.out.f32(), r.rows, r.cols);
}

/// softmax_cross_entropy: (logits [N,K], labels [N] i32) -> mean NLL of softmax, rank 0.
inline void softmax_cross_entropy_kernel(const KernelArgs& args) {
  softmax_detail::cross_entropy(args, "softmax_cross_entropy", nullptr, args.out.f32());
}

/// softmax_cross_entropy_grad: (logits, labels, dloss) -> (softmax - onehot) * dloss / N.
inline void softmax_cross_entropy_grad_kernel(const KernelArgs& args) {
  softmax_detail::cross_entropy(args, "softmax_cross_entropy_grad", args.out.f32(), nullptr);
}

/// softmax_cross_entropy_with_grad: (logits, labels, dloss) -> [gradient [N*K]..., loss].
inline void softmax_cross_entropy_with_grad_kernel(const KernelArgs& args) {
  const Rows r = rows_of(args.in[0].shape);
  float* out = args.out.f32();
  softmax_detail::cross_entropy(args, "softmax_cross_entropy_with_grad", out,
                                out + r.rows * r.cols);
}

/// Puts the log_softmax and softmax cross-entropy kernels into the table.
inline void register_softmax_kernels(KernelTable& table) {
  table.add(Op::LogSoftmax, {"log_softmax", &log_softmax_kernel});
  table.add(Op::LogSoftmaxGrad, {"log_softmax_grad", &log_softmax_grad_kernel});
  table.add(Op::SoftmaxCrossEntropy, {"softmax_cross_entropy", &softmax_cross_entropy_kernel,
                                      nullptr, &cross_entropy_workspace});
  table.add(Op::SoftmaxCrossEntropyGrad,
            {"softmax_cross_entropy_grad", &softmax_cross_entropy_grad_kernel});
  table.add(Op::SoftmaxCrossEntropyWithGrad,
            {"softmax_cross_entropy_with_grad", &softmax_cross_entropy_with_grad_kernel, nullptr,
             &cross_entropy_workspace});
}

} // namespace kiln::cuda
