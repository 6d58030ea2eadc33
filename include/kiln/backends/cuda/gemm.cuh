// CUDA matrix products: one tiled GEMM through shared memory over operand loaders, which gives
// matmul (any transposes) and the implicit-GEMM convolution, its input gradient and its weight
// gradient in NCHW and channels-last forms; the node's epilogue is applied to each result while
// it is in registers. Exact FP32; K is split across blocks (summed in a fixed order, so every
// run gives the same bits) where the output alone has too few tiles to fill the device. Indices
// are 32-bit (calls with larger tensors have no kernel), and what a loader can work out once
// per row or column of its operand (an output pixel's image and window) is, outside the K loop.
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

/// Whether every tensor of a call, and its GEMM's sizes, fit the kernels' 32-bit indices.
template <class Call> bool fits_int32(const Call& call, std::int64_t m, std::int64_t n) {
  constexpr std::int64_t limit = std::int64_t{1} << 31;
  bool fits = call.out.shape.numel() < limit && (m + gemm_tile::m - 1) / gemm_tile::m < 65536;
  for (const auto& in : call.in) fits = fits && in.shape.numel() < limit;
  return fits && n < limit;
}

/// out = A (M x K) times B (K x N). A Problem reads A through `a(row_state, k)` and B through
/// `b(k, column_state)`, where `row(m)` and `column(n)` work out once what a row of A or a
/// column of B needs (each thread loads the same few rows and columns at every step of K), and
/// hands each result to `store(m, n, value)`. It says which operand runs contiguously along K
/// (a_k_fastest, b_k_fastest), so that the tile loads coalesce. With `partial`, slice
/// blockIdx.z of K writes its sums there instead, for gemm_sum_slices.
template <class Problem>
__global__ void __launch_bounds__(gemm_tile::threads)
    gemm_kernel(Problem problem, int k_per_slice, float* partial) {
  using namespace gemm_tile;
  constexpr int loads = m * k / threads; // of A and of B per thread and step of K
  __shared__ float a_tile[k][m + 4];
  __shared__ float b_tile[k][n + 4];
  const int t = static_cast<int>(threadIdx.x);
  const int tx = t % 16, ty = t / 16;
  const int m0 = static_cast<int>(blockIdx.y) * m, n0 = static_cast<int>(blockIdx.x) * n;
  const int k_begin = static_cast<int>(blockIdx.z) * k_per_slice;
  const int k_end = min(problem.k, k_begin + k_per_slice);
  // Load l of this thread reads A at row a_row[l], depth k0 + a_depth[l]; B likewise.
  int a_row[loads], a_depth[loads], b_column[loads], b_depth[loads];
  typename Problem::Row rows[loads];
  typename Problem::Column columns[loads];
#pragma unroll
  for (int l = 0; l < loads; ++l) {
    const int e = t + l * threads;
    a_row[l] = Problem::a_k_fastest ? e / k : e % m;
    a_depth[l] = Problem::a_k_fastest ? e % k : e / m;
    b_column[l] = Problem::b_k_fastest ? e / k : e % n;
    b_depth[l] = Problem::b_k_fastest ? e % k : e / n;
    rows[l] = problem.row(min(m0 + a_row[l], problem.m - 1));
    columns[l] = problem.column(min(n0 + b_column[l], problem.n - 1));
  }
  float sum[4][4] = {};
  for (int k0 = k_begin; k0 < k_end; k0 += k) {
#pragma unroll
    for (int l = 0; l < loads; ++l) {
      const int depth = k0 + a_depth[l];
      a_tile[a_depth[l]][a_row[l]] =
          m0 + a_row[l] < problem.m && depth < k_end ? problem.a(rows[l], depth) : 0.0f;
    }
#pragma unroll
    for (int l = 0; l < loads; ++l) {
      const int depth = k0 + b_depth[l];
      b_tile[b_depth[l]][b_column[l]] =
          n0 + b_column[l] < problem.n && depth < k_end ? problem.b(depth, columns[l]) : 0.0f;
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
      const int row = m0 + ty + 16 * i, column = n0 + tx + 16 * j;
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
  const std::int64_t count = static_cast<std::int64_t>(problem.m) * problem.n;
  KILN_CUDA_FOR_EACH(e, count) {
    float total = 0.0f;
    for (int s = 0; s < slices; ++s) total += partial[s * count + e];
    problem.store(static_cast<int>(e / problem.n), static_cast<int>(e % problem.n), total);
  }
}

/// Runs `problem` on the launch context's stream, split over K where gemm_splits says so (the
/// call's workspace then holds the partial results).
template <class Problem> void run_gemm(const char* name, const Problem& problem, void* workspace) {
  if (problem.m == 0 || problem.n == 0) return;
  const int splits = gemm_splits(problem.m, problem.n, problem.k);
  const int per_slice =
      ((problem.k + splits - 1) / splits + gemm_tile::k - 1) / gemm_tile::k * gemm_tile::k;
  const dim3 grid(static_cast<unsigned>((problem.n + gemm_tile::n - 1) / gemm_tile::n),
                  static_cast<unsigned>((problem.m + gemm_tile::m - 1) / gemm_tile::m),
                  static_cast<unsigned>(splits));
  float* partial = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  launch(name, &gemm_kernel<Problem>, grid, gemm_tile::threads, 0, problem, std::max(per_slice, 1),
         partial);
  if (partial)
    launch(name, &gemm_sum_slices<Problem>,
           blocks_for(static_cast<std::int64_t>(problem.m) * problem.n), block_threads, 0, problem,
           static_cast<const float*>(partial), splits);
}

/// What every problem holds besides its loaders: its two inputs (as the op orders them), its
/// output, the GEMM's M, N and K, and the epilogue each result passes through on its way out.
struct GemmCall {
  const float* first;
  const float* second;
  float* out;
  int m, n, k;
  EpilogueParams epilogue;

  __device__ void put(int at, float value) const { out[at] = epilogue(at, value); }
};

/// out (M x N, row-major) = op(first) op(second), op transposing where the flag says.
template <bool transpose_a, bool transpose_b> struct MatMulProblem : GemmCall {
  static constexpr bool a_k_fastest = !transpose_a;
  static constexpr bool b_k_fastest = transpose_b;
  using Row = int;
  using Column = int;

  __device__ int row(int r) const { return transpose_a ? r : r * k; }
  __device__ int column(int c) const { return transpose_b ? c * k : c; }
  __device__ float a(int at, int depth) const {
    return transpose_a ? first[depth * m + at] : first[at + depth];
  }
  __device__ float b(int depth, int at) const {
    return transpose_b ? second[at + depth] : second[depth * n + at];
  }
  __device__ void store(int r, int c, float value) const { put(r * n + c, value); }
};

/// M, N, K of a MatMul call (a KernelArgs or a KernelQuery).
template <class Call> std::array<std::int64_t, 3> matmul_sizes(const Call& call) {
  const auto& attrs = std::get<MatMulAttrs>(*call.attrs);
  const Shape& a = call.in[0].shape;
  return {call.out.shape[0], call.out.shape[1], attrs.transpose_a ? a[0] : a[1]};
}

template <bool transpose_a, bool transpose_b> void matmul_as(const KernelArgs& args) {
  const auto [m, n, k] = matmul_sizes(args);
  const GemmCall call{args.in[0].f32(),    args.in[1].f32(),    args.out.f32(),
                      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                      EpilogueParams(args)};
  run_gemm("matmul", MatMulProblem<transpose_a, transpose_b>{call}, args.workspace);
}

inline void matmul(const KernelArgs& args) {
  const auto& attrs = std::get<MatMulAttrs>(*args.attrs);
  if (attrs.transpose_a)
    attrs.transpose_b ? matmul_as<true, true>(args) : matmul_as<true, false>(args);
  else
    attrs.transpose_b ? matmul_as<false, true>(args) : matmul_as<false, false>(args);
}

inline bool matmul_accepts(const KernelQuery& q) {
  const auto [m, n, k] = matmul_sizes(q);
  return epilogue_fits(q) && fits_int32(q, m, n);
}

inline std::size_t matmul_workspace(const KernelQuery& q) {
  const auto [m, n, k] = matmul_sizes(q);
  return gemm_workspace(m, n, k);
}

/// A convolution's sizes as kernel parameters.
struct ConvSizes {
  int batch, c, h, w, o, kh, kw, oh, ow;
  int stride_h, stride_w, pad_h, pad_w;

  explicit ConvSizes(const ConvGeometry& g)
      : batch(i32(g.batch)), c(i32(g.c)), h(i32(g.h)), w(i32(g.w)), o(i32(g.o)), kh(i32(g.kh)),
        kw(i32(g.kw)), oh(i32(g.oh)), ow(i32(g.ow)), stride_h(i32(g.stride_h)),
        stride_w(i32(g.stride_w)), pad_h(i32(g.pad_h)), pad_w(i32(g.pad_w)) {}

private:
  static int i32(std::size_t v) { return static_cast<int>(v); }
};

/// An output pixel of every image, as the loaders of its window need it: where its image
/// starts and the input row and column its window's first tap reads (before padding).
struct Window {
  int image_base, top, left;
};

/// The window of output pixel `pixel` (over every image) of a convolution whose input images
/// are `image_elements` apart.
__device__ inline Window window_of(const ConvSizes& s, int pixel, int image_elements) {
  const int per_image = s.oh * s.ow, image = pixel / per_image, p = pixel - image * per_image;
  const int i = p / s.ow, j = p - i * s.ow;
  return {image * image_elements, i * s.stride_h - s.pad_h, j * s.stride_w - s.pad_w};
}

/// An input pixel of every image, as the input gradient's loaders need it: where its image's dy
/// starts, and its row and column plus padding (the output pixel of tap (r, q) is at
/// ((top - r) / stride, (left - q) / stride) where the stride divides).
struct Reach {
  int image_base, top, left;
};

__device__ inline Reach reach_of(const ConvSizes& s, int pixel, int dy_image_elements) {
  const int per_image = s.h * s.w, image = pixel / per_image, p = pixel - image * per_image;
  const int ih = p / s.w, iw = p - ih * s.w;
  return {image * dy_image_elements, ih + s.pad_h, iw + s.pad_w};
}

/// Output pixel (i, j) whose tap (r, q) reads the input pixel `reach` names; false when none.
__device__ inline bool reached(const ConvSizes& s, const Reach& reach, int r, int q, int& i,
                               int& j) {
  const int th = reach.top - r, tw = reach.left - q;
  if (th < 0 || tw < 0) return false;
  i = th / s.stride_h;
  j = tw / s.stride_w;
  return i * s.stride_h == th && j * s.stride_w == tw && i < s.oh && j < s.ow;
}

/// What every convolution problem holds: the call and the convolution's sizes.
struct ConvProblem : GemmCall {
  ConvSizes s;
};

/// conv2d, NCHW: rows are output channels, columns output pixels of every image, depth the
/// (input channel, kernel row, kernel column) taps of the OIHW weight.
struct ConvForwardNchw : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: x; second: the weight
  using Row = int;
  using Column = Window;

  __device__ int row(int o) const { return o * k; }
  __device__ Window column(int pixel) const { return window_of(s, pixel, s.c * s.h * s.w); }
  __device__ float a(int at, int tap) const { return second[at + tap]; }
  __device__ float b(int tap, const Window& win) const {
    const int taps = s.kh * s.kw, c = tap / taps, rq = tap - c * taps, r = rq / s.kw,
              q = rq - r * s.kw;
    const int ih = win.top + r, iw = win.left + q;
    const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
    return inside ? first[win.image_base + (c * s.h + ih) * s.w + iw] : 0.0f;
  }
  __device__ void store(int o, int pixel, float value) const {
    const int pixels = s.oh * s.ow, image = pixel / pixels;
    put((image * s.o + o) * pixels + pixel - image * pixels, value);
  }
};

/// conv2d, channels-last: rows are output pixels, columns output channels, depth the
/// (kernel row, kernel column, input channel) taps of the [KH, KW, C, O] weight.
struct ConvForwardNhwc : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: x; second: the weight
  using Row = Window;
  using Column = int;

  __device__ Window row(int pixel) const { return window_of(s, pixel, s.h * s.w * s.c); }
  __device__ int column(int o) const { return o; }
  __device__ float a(const Window& win, int tap) const {
    const int per_row = s.kw * s.c, r = tap / per_row, cq = tap - r * per_row, q = cq / s.c,
              c = cq - q * s.c;
    const int ih = win.top + r, iw = win.left + q;
    const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
    return inside ? first[win.image_base + (ih * s.w + iw) * s.c + c] : 0.0f;
  }
  __device__ float b(int tap, int o) const { return second[tap * s.o + o]; }
  __device__ void store(int pixel, int o, float value) const { put(pixel * s.o + o, value); }
};

/// conv2d_grad_input, NCHW: rows are input channels, columns input pixels of every image, depth
/// the (output channel, kernel row, kernel column) taps; a tap reaches the input pixel only
/// where the stride lands on it.
struct ConvGradInputNchw : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: dy; second: the weight
  using Row = int;
  using Column = Reach;

  __device__ int row(int c) const { return c * s.kh * s.kw; }
  __device__ Reach column(int pixel) const { return reach_of(s, pixel, s.o * s.oh * s.ow); }
  __device__ float a(int channel_base, int tap) const {
    const int taps = s.kh * s.kw, o = tap / taps;
    return second[o * s.c * taps + channel_base + tap - o * taps];
  }
  __device__ float b(int tap, const Reach& reach) const {
    const int taps = s.kh * s.kw, o = tap / taps, rq = tap - o * taps, r = rq / s.kw,
              q = rq - r * s.kw;
    int i, j;
    return reached(s, reach, r, q, i, j) ? first[reach.image_base + (o * s.oh + i) * s.ow + j]
                                         : 0.0f;
  }
  __device__ void store(int c, int pixel, float value) const {
    const int pixels = s.h * s.w, image = pixel / pixels;
    put((image * s.c + c) * pixels + pixel - image * pixels, value);
  }
};

/// conv2d_grad_input, channels-last: rows are input pixels, columns input channels, depth the
/// (kernel row, kernel column, output channel) taps of the [KH, KW, O, C] weight.
struct ConvGradInputNhwc : ConvProblem {
  static constexpr bool a_k_fastest = true, b_k_fastest = false;
  // first: dy; second: the weight
  using Row = Reach;
  using Column = int;

  __device__ Reach row(int pixel) const { return reach_of(s, pixel, s.oh * s.ow * s.o); }
  __device__ int column(int c) const { return c; }
  __device__ float a(const Reach& reach, int tap) const {
    const int per_row = s.kw * s.o, r = tap / per_row, oq = tap - r * per_row, q = oq / s.o,
              o = oq - q * s.o;
    int i, j;
    return reached(s, reach, r, q, i, j) ? first[reach.image_base + (i * s.ow + j) * s.o + o]
                                         : 0.0f;
  }
  __device__ float b(int tap, int c) const { return second[tap * s.c + c]; }
  __device__ void store(int pixel, int c, float value) const { put(pixel * s.c + c, value); }
};

/// A tap of the weight gradient's columns: its input channel and its kernel row and column.
struct Tap {
  int c, r, q;
};

/// conv2d_grad_weight (OIHW result) from NCHW or channels-last activations: rows are output
/// channels, columns the (input channel, kernel row, kernel column) taps, depth every output
/// pixel of every image.
template <bool channels_last> struct ConvGradWeight : ConvProblem {
  static constexpr bool a_k_fastest = !channels_last, b_k_fastest = !channels_last;
  // first: x; second: dy
  using Row = int;
  using Column = Tap;

  __device__ int row(int o) const { return o; }
  __device__ Tap column(int tap) const {
    const int taps = s.kh * s.kw, c = tap / taps, rq = tap - c * taps, r = rq / s.kw;
    return {c, r, rq - r * s.kw};
  }
  __device__ float a(int o, int pixel) const {
    if (channels_last) return second[pixel * s.o + o];
    const int pixels = s.oh * s.ow, image = pixel / pixels;
    return second[(image * s.o + o) * pixels + pixel - image * pixels];
  }
  __device__ float b(int pixel, const Tap& tap) const {
    const Window win = window_of(s, pixel, channels_last ? s.h * s.w * s.c : s.c * s.h * s.w);
    const int ih = win.top + tap.r, iw = win.left + tap.q;
    if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) return 0.0f;
    return channels_last ? first[win.image_base + (ih * s.w + iw) * s.c + tap.c]
                         : first[win.image_base + (tap.c * s.h + ih) * s.w + iw];
  }
  __device__ void store(int o, int tap, float value) const { put(o * n + tap, value); }
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
  const ConvProblem call{{args.in[0].f32(), args.in[1].f32(), args.out.f32(), static_cast<int>(m),
                          static_cast<int>(n), static_cast<int>(k), EpilogueParams(args)},
                         ConvSizes(g)};
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
/// epilogue that fits a kernel parameter and tensors that fit 32-bit indices.
template <Op op, bool channels_last> bool convolution_accepts(const KernelQuery& q) {
  const auto [m, n, k] = conv_sizes(op, conv_geometry(op, q));
  return std::get<Conv2dAttrs>(*q.attrs).channels_last == channels_last && epilogue_fits(q) &&
         fits_int32(q, m, n);
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
  table.add(Op::MatMul, {"matmul", &matmul, &matmul_accepts, &matmul_workspace});
  register_convolution<Op::Conv2d>(table, "conv2d", "conv2d.channels_last");
  register_convolution<Op::Conv2dGradInput>(table, "conv2d_grad_input",
                                            "conv2d_grad_input.channels_last");
  register_convolution<Op::Conv2dGradWeight>(table, "conv2d_grad_weight",
                                             "conv2d_grad_weight.channels_last");
}

} // namespace kiln::cuda
