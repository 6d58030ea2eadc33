// CUDA matrix products: one tiled GEMM through shared memory over operand loaders, which gives
// matmul (any transposes) and the implicit-GEMM convolution, its input gradient and its weight
// gradient in NCHW and channels-last forms; the node's epilogue is applied to each result while
// it is in registers. Exact FP32; K is split across blocks (summed in a fixed order, so every
// run gives the same bits) where the output alone has too few tiles to fill the device.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <variant>

#include <cuda_runtime.h>

#include "kiln/backends/conv_geometry.hpp"
#include "kiln/backends/cuda/elementwise.cuh"
#include "kiln/backends/cuda/launch.cuh"

namespace kiln::cuda {

/// Block tile: 64 x 64 outputs, 16 deep in K, 256 threads with a 4 x 4 register tile each.
namespace gemm_tile {
inline constexpr int m = 64, n = 64, k = 16, threads = 256;
} // namespace gemm_tile

/// Multiprocessors the split of K aims to fill twice over (an H200 has 132).
inline constexpr std::int64_t gemm_target_blocks = 264;

/// How many slices of K the GEMM of an M x N x K product is split into: enough blocks for the
/// device when the output has few tiles (a weight gradient: a small result, a long sum), each
/// slice at least 512 deep.
inline int gemm_splits(std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::int64_t tiles =
      ((m + gemm_tile::m - 1) / gemm_tile::m) * ((n + gemm_tile::n - 1) / gemm_tile::n);
  if (tiles >= gemm_target_blocks / 2) return 1;
  const std::int64_t wanted = (gemm_target_blocks + tiles - 1) / tiles;
  return static_cast<int>(std::clamp<std::int64_t>(std::min(wanted, k / 512), 1, 64));
}

/// Scratch of a split GEMM: one partial M x N result per slice.
inline std::size_t gemm_workspace(std::int64_t m, std::int64_t n, std::int64_t k) {
  const int splits = gemm_splits(m, n, k);
  return splits > 1 ? static_cast<std::size_t>(splits * m * n) * sizeof(float) : 0;
}

/// out = A (M x K) times B (K x N), A and B read through `problem.a(m, k)` and `problem.b(k, n)`,
/// each result handed to `problem.store(m, n, value)`. With `partial`, slice blockIdx.z of K
/// writes its sums there instead, for gemm_sum_slices. A Problem says which of its operands
/// are contiguous along K (a_k_fastest, b_k_fastest) so that tile loads coalesce.
template <class Problem>
__global__ void __launch_bounds__(gemm_tile::threads)
    gemm_kernel(Problem problem, std::int64_t k_per_slice, float* partial) {
  using namespace gemm_tile;
  __shared__ float a_tile[k][m + 4];
  __shared__ float b_tile[k][n + 4];
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * m;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * n;
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * k_per_slice;
  const std::int64_t k_end = min(problem.k, k_begin + k_per_slice);
  float sum[4][4] = {};
  for (std::int64_t k0 = k_begin; k0 < k_end; k0 += k) {
    for (int e = static_cast<int>(threadIdx.x); e < m * k; e += threads) {
      const int mm = Problem::a_k_fastest ? e / k : e % m;
      const int kk = Problem::a_k_fastest ? e % k : e / m;
      const std::int64_t row = m0 + mm, depth = k0 + kk;
      a_tile[kk][mm] = row < problem.m && depth < k_end ? problem.a(row, depth) : 0.0f;
    }
    for (int e = static_cast<int>(threadIdx.x); e < n * k; e += threads) {
      const int nn = Problem::b_k_fastest ? e / k : e % n;
      const int kk = Problem::b_k_fastest ? e % k : e / n;
      const std::int64_t column = n0 + nn, depth = k0 + kk;
      b_tile[kk][nn] = column < problem.n && depth < k_end ? problem.b(depth, column) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < k; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = a_tile[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = b_tile[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sum[i][j] = fmaf(a[i], b[j], sum[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t row = m0 + ty + 16 * i, column = n0 + tx + 16 * j;
      if (row >= problem.m || column >= problem.n) continue;
      if (partial)
        partial[(static_cast<std::int64_t>(blockIdx.z) * problem.m + row) * problem.n + column] =
            sum[i][j];
      else
        problem.store(row, column, sum[i][j]);
    }
  }
}

/// Adds the slices' partial results in slice order and stores each sum.
template <class Problem>
__global__ void gemm_sum_slices(Problem problem, const float* __restrict__ partial, int slices) {
  const std::int64_t count = problem.m * problem.n;
  KILN_CUDA_FOR_EACH(e, count) {
    float total = 0.0f;
    for (int s = 0; s < slices; ++s) total += partial[s * count + e];
    problem.store(e / problem.n, e % problem.n, total);
  }
}

/// Runs `problem` on the launch context's stream, split over K where gemm_splits says so (the
/// call's workspace then holds the partial results).
template <class Problem> void run_gemm(const char* name, const Problem& problem, void* workspace) {
  if (problem.m == 0 || problem.n == 0) return;
  const int splits = gemm_splits(problem.m, problem.n, problem.k);
  const std::int64_t per_slice =
      ((problem.k + splits - 1) / splits + gemm_tile::k - 1) / gemm_tile::k * gemm_tile::k;
  const dim3 grid(static_cast<unsigned>((problem.n + gemm_tile::n - 1) / gemm_tile::n),
                  static_cast<unsigned>((problem.m + gemm_tile::m - 1) / gemm_tile::m),
                  static_cast<unsigned>(splits));
  float* partial = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  launch(name, &gemm_kernel<Problem>, grid, gemm_tile::threads, 0, problem,
         std::max<std::int64_t>(per_slice, 1), partial);
  if (partial)
    launch(name, &gemm_sum_slices<Problem>, blocks_for(problem.m * problem.n), block_threads, 0,
           problem, static_cast<const float*>(partial), splits);
}

/// out (M x N, row-major) = op(lhs) op(rhs), op transposing where the flag says.
template <bool transpose_a, bool transpose_b> struct MatMulProblem {
  static constexpr bool a_k_fastest = !transpose_a;
  static constexpr bool b_k_fastest = transpose_b;
  const float* lhs;
  const float* rhs;
  float* out;
  std::int64_t m, n, k;
  EpilogueParams epilogue;

  __device__ float a(std::int64_t row, std::int64_t depth) const {
    return transpose_a ? lhs[depth * m + row] : lhs[row * k + depth];
  }
  __device__ float b(std::int64_t depth, std::int64_t column) const {
    return transpose_b ? rhs[column * k + depth] : rhs[depth * n + column];
  }
  __device__ void store(std::int64_t row, std::int64_t column, float value) const {
    const std::int64_t i = row * n + column;
    out[i] = epilogue(i, value);
  }
};

/// M, N, K of a MatMul call (a KernelArgs or a KernelQuery).
template <class Call> std::array<std::int64_t, 3> matmul_sizes(const Call& call) {
  const auto& attrs = std::get<MatMulAttrs>(*call.attrs);
  const Shape& a = call.in[0].shape;
  return {call.out.shape[0], call.out.shape[1], attrs.transpose_a ? a[0] : a[1]};
}

template <bool transpose_a, bool transpose_b> void matmul_as(const KernelArgs& args) {
  const auto [m, n, k] = matmul_sizes(args);
  run_gemm("matmul",
           MatMulProblem<transpose_a, transpose_b>{args.in[0].f32(), args.in[1].f32(),
                                                   args.out.f32(), m, n, k, EpilogueParams(args)},
           args.workspace);
}

inline void matmul(const KernelArgs& args) {
  const auto& attrs = std::get<MatMulAttrs>(*args.attrs);
  if (attrs.transpose_a)
    attrs.transpose_b ? matmul_as<true, true>(args) : matmul_as<true, false>(args);
  else
    attrs.transpose_b ? matmul_as<false, true>(args) : matmul_as<false, false>(args);
}

inline std::size_t matmul_workspace(const KernelQuery& q) {
  const auto [m, n, k] = matmul_sizes(q);
  return gemm_workspace(m, n, k);
}

/// A convolution's sizes as kernel parameters.
struct ConvSizes {
  std::int64_t batch, c, h, w, o, kh, kw, oh, ow;
  std::int64_t stride_h, stride_w, pad_h, pad_w;

  explicit ConvSizes(const ConvGeometry& g)
      : batch(i64(g.batch)), c(i64(g.c)), h(i64(g.h)), w(i64(g.w)), o(i64(g.o)), kh(i64(g.kh)),
        kw(i64(g.kw)), oh(i64(g.oh)), ow(i64(g.ow)), stride_h(i64(g.stride_h)),
        stride_w(i64(g.stride_w)), pad_h(i64(g.pad_h)), pad_w(i64(g.pad_w)) {}

  /// Input pixel (ih, iw) that tap (r, s) of output pixel (i, j) reads; false in the padding.
  __device__ bool input_pixel(std::int64_t i, std::int64_t j, std::int64_t r, std::int64_t s,
                              std::int64_t& ih, std::int64_t& iw) const {
    ih = i * stride_h - pad_h + r;
    iw = j * stride_w - pad_w + s;
    return ih >= 0 && ih < h && iw >= 0 && iw < w;
  }
  /// Output pixel (i, j) whose tap (r, s) reads input pixel (ih, iw); false when none does.
  __device__ bool output_pixel(std::int64_t ih, std::int64_t iw, std::int64_t r, std::int64_t s,
                               std::int64_t& i, std::int64_t& j) const {
    const std::int64_t th = ih + pad_h - r, tw = iw + pad_w - s;
    if (th < 0 || tw < 0 || th % stride_h != 0 || tw % stride_w != 0) return false;
    i = th / stride_h;
    j = tw / stride_w;
    return i < oh && j < ow;
  }

private:
  static std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }
};

/// What every convolution problem holds: its two inputs (as the op orders them), its output, its
/// sizes, the GEMM's M, N and K, and the epilogue each result passes through on its way out.
struct ConvProblem {
  const float* first;
  const float* second;
  float* out;
  ConvSizes s;
  std::int64_t m, n, k;
  EpilogueParams epilogue;

  __device__ void put(std::int64_t at, float value) const { out[at] = epilogue(at, value); }
};

/// conv2d, NCHW: rows are output channels, columns output pixels of every image, depth the
/// (input channel, kernel row, kernel column) taps of the OIHW weight.
struct ConvForwardNchw : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: x; second: the weight
  __device__ float a(std::int64_t o, std::int64_t tap) const { return second[o * k + tap]; }
  __device__ float b(std::int64_t tap, std::int64_t column) const {
    const std::int64_t c = tap / (s.kh * s.kw), r = tap / s.kw % s.kh, q = tap % s.kw;
    const std::int64_t image = column / (s.oh * s.ow), i = column / s.ow % s.oh, j = column % s.ow;
    std::int64_t ih, iw;
    return s.input_pixel(i, j, r, q, ih, iw) ? first[((image * s.c + c) * s.h + ih) * s.w + iw]
                                             : 0.0f;
  }
  __device__ void store(std::int64_t o, std::int64_t column, float value) const {
    const std::int64_t pixels = s.oh * s.ow, image = column / pixels;
    const std::int64_t at = (image * s.o + o) * pixels + column % pixels;
    put(at, value);
  }
};

/// conv2d, channels-last: rows are output pixels, columns output channels, depth the
/// (kernel row, kernel column, input channel) taps of the [KH, KW, C, O] weight.
struct ConvForwardNhwc : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: x; second: the weight
  __device__ float a(std::int64_t pixel, std::int64_t tap) const {
    const std::int64_t r = tap / (s.kw * s.c), q = tap / s.c % s.kw, c = tap % s.c;
    const std::int64_t image = pixel / (s.oh * s.ow), i = pixel / s.ow % s.oh, j = pixel % s.ow;
    std::int64_t ih, iw;
    return s.input_pixel(i, j, r, q, ih, iw) ? first[((image * s.h + ih) * s.w + iw) * s.c + c]
                                             : 0.0f;
  }
  __device__ float b(std::int64_t tap, std::int64_t o) const { return second[tap * s.o + o]; }
  __device__ void store(std::int64_t pixel, std::int64_t o, float value) const {
    const std::int64_t at = pixel * s.o + o;
    put(at, value);
  }
};

/// conv2d_grad_input, NCHW: rows are input channels, columns input pixels of every image, depth
/// the (output channel, kernel row, kernel column) taps; a tap reaches the input pixel only
/// where the stride lands on it.
struct ConvGradInputNchw : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: dy; second: the weight
  __device__ float a(std::int64_t c, std::int64_t tap) const {
    const std::int64_t o = tap / (s.kh * s.kw), rs = tap % (s.kh * s.kw);
    return second[(o * s.c + c) * s.kh * s.kw + rs];
  }
  __device__ float b(std::int64_t tap, std::int64_t column) const {
    const std::int64_t o = tap / (s.kh * s.kw), r = tap / s.kw % s.kh, q = tap % s.kw;
    const std::int64_t image = column / (s.h * s.w), ih = column / s.w % s.h, iw = column % s.w;
    std::int64_t i, j;
    return s.output_pixel(ih, iw, r, q, i, j) ? first[((image * s.o + o) * s.oh + i) * s.ow + j]
                                              : 0.0f;
  }
  __device__ void store(std::int64_t c, std::int64_t column, float value) const {
    const std::int64_t pixels = s.h * s.w, image = column / pixels;
    const std::int64_t at = (image * s.c + c) * pixels + column % pixels;
    put(at, value);
  }
};

/// conv2d_grad_input, channels-last: rows are input pixels, columns input channels, depth the
/// (kernel row, kernel column, output channel) taps of the [KH, KW, O, C] weight.
struct ConvGradInputNhwc : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: dy; second: the weight
  __device__ float a(std::int64_t pixel, std::int64_t tap) const {
    const std::int64_t r = tap / (s.kw * s.o), q = tap / s.o % s.kw, o = tap % s.o;
    const std::int64_t image = pixel / (s.h * s.w), ih = pixel / s.w % s.h, iw = pixel % s.w;
    std::int64_t i, j;
    return s.output_pixel(ih, iw, r, q, i, j) ? first[((image * s.oh + i) * s.ow + j) * s.o + o]
                                              : 0.0f;
  }
  __device__ float b(std::int64_t tap, std::int64_t c) const { return second[tap * s.c + c]; }
  __device__ void store(std::int64_t pixel, std::int64_t c, float value) const {
    const std::int64_t at = pixel * s.c + c;
    put(at, value);
  }
};

/// conv2d_grad_weight (OIHW result) from NCHW or channels-last activations: rows are output
/// channels, columns the (input channel, kernel row, kernel column) taps, depth every output
/// pixel of every image.
template <bool channels_last> struct ConvGradWeight : ConvProblem {
  static constexpr bool a_k_fastest = !channels_last, b_k_fastest = !channels_last;
  // first: x; second: dy
  __device__ float a(std::int64_t o, std::int64_t pixel) const {
    const std::int64_t pixels = s.oh * s.ow, image = pixel / pixels, p = pixel % pixels;
    return channels_last ? second[pixel * s.o + o] : second[(image * s.o + o) * pixels + p];
  }
  __device__ float b(std::int64_t pixel, std::int64_t tap) const {
    const std::int64_t c = tap / (s.kh * s.kw), r = tap / s.kw % s.kh, q = tap % s.kw;
    const std::int64_t image = pixel / (s.oh * s.ow), i = pixel / s.ow % s.oh, j = pixel % s.ow;
    std::int64_t ih, iw;
    if (!s.input_pixel(i, j, r, q, ih, iw)) return 0.0f;
    return channels_last ? first[((image * s.h + ih) * s.w + iw) * s.c + c]
                         : first[((image * s.c + c) * s.h + ih) * s.w + iw];
  }
  __device__ void store(std::int64_t o, std::int64_t tap, float value) const {
    const std::int64_t at = o * n + tap;
    put(at, value);
  }
};

/// M, N, K of a convolution call as its problem for `op` and layout lays it out.
inline std::array<std::int64_t, 3> conv_sizes(Op op, const ConvGeometry& g) {
  const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  const std::int64_t out_pixels = i(g.batch * g.oh * g.ow), in_pixels = i(g.batch * g.h * g.w);
  if (op == Op::Conv2d)
    return g.channels_last ? std::array{out_pixels, i(g.o), i(g.kh * g.kw * g.c)}
                           : std::array{i(g.o), out_pixels, i(g.c * g.kh * g.kw)};
  if (op == Op::Conv2dGradInput)
    return g.channels_last ? std::array{in_pixels, i(g.c), i(g.kh * g.kw * g.o)}
                           : std::array{i(g.c), in_pixels, i(g.o * g.kh * g.kw)};
  return {i(g.o), i(g.c * g.kh * g.kw), out_pixels};
}

template <Op op, bool channels_last> void convolution(const KernelArgs& args) {
  const ConvGeometry g = conv_geometry(op, args);
  const auto [m, n, k] = conv_sizes(op, g);
  const ConvProblem call{
      args.in[0].f32(),    args.in[1].f32(), args.out.f32(), ConvSizes(g), m, n, k,
      EpilogueParams(args)};
  if constexpr (op == Op::Conv2d && channels_last)
    run_gemm("conv2d.channels_last", ConvForwardNhwc{call}, args.workspace);
  else if constexpr (op == Op::Conv2d)
    run_gemm("conv2d", ConvForwardNchw{call}, args.workspace);
  else if constexpr (op == Op::Conv2dGradInput && channels_last)
    run_gemm("conv2d_grad_input.channels_last", ConvGradInputNhwc{call}, args.workspace);
  else if constexpr (op == Op::Conv2dGradInput)
    run_gemm("conv2d_grad_input", ConvGradInputNchw{call}, args.workspace);
  else
    run_gemm(channels_last ? "conv2d_grad_weight.channels_last" : "conv2d_grad_weight",
             ConvGradWeight<channels_last>{call}, args.workspace);
}

/// The NCHW kernel takes NCHW calls, the channels-last one channels-last calls; both need an
/// epilogue that fits a kernel parameter.
template <Op op, bool channels_last> bool convolution_accepts(const KernelQuery& q) {
  return std::get<Conv2dAttrs>(*q.attrs).channels_last == channels_last && epilogue_fits(q);
}

template <Op op> std::size_t convolution_workspace(const KernelQuery& q) {
  const auto [m, n, k] = conv_sizes(op, conv_geometry(op, q));
  return gemm_workspace(m, n, k);
}

template <Op op> void register_convolution(KernelTable& table, const char* nchw, const char* nhwc) {
  table.add(op, {nchw, &convolution<op, false>, &convolution_accepts<op, false>,
                 &convolution_workspace<op>});
  table.add(op, {nhwc, &convolution<op, true>, &convolution_accepts<op, true>,
                 &convolution_workspace<op>});
}

inline void register_gemm_kernels(KernelTable& table) {
  table.add(Op::MatMul, {"matmul", &matmul, &epilogue_fits, &matmul_workspace});
  register_convolution<Op::Conv2d>(table, "conv2d", "conv2d.channels_last");
  register_convolution<Op::Conv2dGradInput>(table, "conv2d_grad_input",
                                            "conv2d_grad_input.channels_last");
  register_convolution<Op::Conv2dGradWeight>(table, "conv2d_grad_weight",
                                             "conv2d_grad_weight.channels_last");
}

} // namespace kiln::cuda
