// Scratch memory each CPU kernel needs per worker thread; the planner reserves it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <variant>

#include <oneapi/tbb/task_arena.h>

#include "kiln/backends/conv_geometry.hpp"
#include "kiln/ir/op_list.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cpu {

/// Cache blocking of the CPU GEMM. The kernels (gemm-inl.hpp) and the sizing below share these
/// numbers so a workspace computed here is always large enough for every SIMD target.
namespace gemm_blocking {
/// Depth of a packed panel: an MR x kc sliver of A stays in L1 while B streams from L2.
inline constexpr std::size_t kc = 256;
/// Rows of A packed at once; bounds the packed-A buffer, not a cache level.
inline constexpr std::size_t mc = 256;
/// Columns of a packed B panel: kc x nc floats (512 KiB) is meant to live in L2.
inline constexpr std::size_t nc = 512;
/// Largest micro-tile of any target; edges round up to the tile, so buffers carry this slack.
inline constexpr std::size_t max_mr = 8;
inline constexpr std::size_t max_nr = 64;
} // namespace gemm_blocking

/// Pixels of the column-matrix rows that conv2d_grad_weight builds at a time before
/// transposing them into its GEMM operand (max_nr rows of them stay in L1).
inline constexpr std::size_t conv_pixel_chunk = 128;

/// Most float lanes of a SIMD vector on any target (AVX-512).
inline constexpr std::size_t max_float_lanes = 16;

/// The slice of args.workspace that belongs to the calling worker thread.
inline float* ThreadScratch(const KernelArgs& args) {
  const int t = tbb::this_task_arena::current_thread_index();
  const std::size_t slot = t < 0 ? 0 : static_cast<std::size_t>(t);
  return reinterpret_cast<float*>(args.workspace + slot * args.workspace_per_worker);
}

/// Floats are handed out in 64-byte units so every buffer starts on a cache line.
constexpr std::size_t round_up_floats(std::size_t n) { return (n + 15) / 16 * 16; }

/// Elements of a row a fused elementwise kernel processes at a time; each intermediate
/// result takes one chunk of workspace.
inline constexpr std::int64_t fused_chunk = 1024;

/// Floats of per-thread scratch an anchor's epilogue needs (one chunk per intermediate
/// step). Anchors place it after their own scratch.
inline std::size_t epilogue_floats(const Attrs* attrs) {
  const Epilogue* e = attrs ? epilogue_of(*attrs) : nullptr;
  if (!e || e->program.size() < 2) return 0;
  return round_up_floats((e->program.size() - 1) * static_cast<std::size_t>(fused_chunk));
}

/// Floats of the packed-A buffer of a GEMM with op(A) of M x K.
constexpr std::size_t gemm_packed_a_floats(std::size_t m, std::size_t k) {
  using namespace gemm_blocking;
  return round_up_floats((std::min(mc, m) + max_mr) * std::min(kc, k));
}

/// Floats of the packed-B panel of a GEMM with op(B) of K x N.
constexpr std::size_t gemm_packed_b_floats(std::size_t n, std::size_t k) {
  using namespace gemm_blocking;
  return round_up_floats((std::min(nc, n) + max_nr) * std::min(kc, k));
}

/// Floats of a whole K x N operand B stored pre-packed (NR-wide slivers, full depth).
constexpr std::size_t gemm_prepacked_b_floats(std::size_t n, std::size_t k) {
  return round_up_floats((n + gemm_blocking::max_nr) * k);
}

/// Per-thread scratch of the MatMul kernel, in floats: packed A (only for a transposed A; the
/// GEMM reads rows contiguous in k in place), then packed B, then, where it splits its depth
/// (matmul_splits_depth), one run's partial result.
struct MatMulLayout {
  std::size_t pack_a = 0, pack_b = 0, partial = 0, total = 0;
};

/// M, N, K of a MatMul call, read from its shapes and attributes.
struct MatMulDims {
  std::size_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
};

/// `call` is a KernelArgs (at run time) or a KernelQuery (at selection): both name the shapes
/// `in[i].shape`, `out.shape` and the attributes `attrs`.
template <class Call> MatMulDims matmul_dims(const Call& args) {
  MatMulDims d;
  const auto* attrs = args.attrs ? std::get_if<MatMulAttrs>(args.attrs) : nullptr;
  if (attrs) {
    d.transpose_a = attrs->transpose_a;
    d.transpose_b = attrs->transpose_b;
  }
  const Shape& a = args.in[0].shape;
  d.m = static_cast<std::size_t>(args.out.shape[0]);
  d.n = static_cast<std::size_t>(args.out.shape[1]);
  d.k = static_cast<std::size_t>(d.transpose_a ? a[0] : a[1]);
  return d;
}

/// Whether a MatMul sums its depth in runs, one per worker, each into a partial result of its
/// own, the partials then added in order: for an output so small against its depth that tiles
/// of it would pack the same rows of B again for every row of tiles (the MNIST CNN's first
/// linear layer: 64 x 128 over a depth of 9216).
inline bool matmul_splits_depth(const MatMulDims& d) {
  return d.k >= 8 * (d.m + d.n) && d.m * d.n <= (std::size_t{1} << 16);
}

/// The MatMul layout with the packed-A buffer where `packs_a` (the FP32 GEMM packs only a
/// transposed A; the one that multiplies in bfloat16 converts every A).
inline MatMulLayout matmul_layout(const MatMulDims& d, bool packs_a) {
  MatMulLayout l;
  l.pack_b = packs_a ? gemm_packed_a_floats(d.m, d.k) : 0;
  l.partial = l.pack_b + gemm_packed_b_floats(d.n, d.k);
  l.total = l.partial + (matmul_splits_depth(d) ? round_up_floats(d.m * d.n) : 0);
  return l;
}

inline MatMulLayout matmul_layout(const MatMulDims& d) { return matmul_layout(d, d.transpose_a); }

/// The MatMul kernel that multiplies in bfloat16 always converts A: packed A, then packed B,
/// each sized as the FP32 buffers (bfloat16 over the same depth fills half of them).
inline MatMulLayout matmul_bf16_layout(const MatMulDims& d) { return matmul_layout(d, true); }

/// Most taps (input channels x kernel rows x kernel columns) of a weight gradient computed
/// from shifted rows: its tiles hold one vector of sums per (output channel, tap).
inline constexpr std::size_t shifted_rows_max_taps = 32;

/// Most rows of A (output channels; input channels for the input gradient) of a forward or
/// input-gradient GEMM over shifted rows. With more, the column matrix that im2col builds
/// once serves so many rows that its aligned, packed loads win (gemm_conv_micro: 32 -> 64
/// channels ran at 0.6-0.7x of im2col's speed over shifted rows, 6 -> 16 at 1.5-2x).
inline constexpr std::size_t shifted_rows_max_rows = 16;

/// Whether an NCHW convolution kernel reads shifted rows of the zero-padded image
/// (conv_shifted_rows-inl.hpp) instead of building a column matrix: at stride 1 a tap's
/// column-matrix row is a window of the padded image, so the GEMM can read it there. 1x1
/// convolutions read the image as it is anyway.
inline bool conv_reads_shifted_rows(Op op, const ConvGeometry& g) {
  if (g.channels_last || g.stride_h != 1 || g.stride_w != 1 || g.pointwise()) return false;
  if (op == Op::Conv2dGradWeight) return g.ckk() <= shifted_rows_max_taps;
  if (op == Op::Conv2d) return g.o <= shifted_rows_max_rows;
  // The input gradient pads dy by kernel - 1 - padding.
  return g.c <= shifted_rows_max_rows && g.pad_h < g.kh && g.pad_w < g.kw;
}

/// The zero-padded image a shifted-rows convolution reads (x, or dy for the input gradient)
/// and its output in "wide" rows: output pixel (i, j) sits at column i * width + j, so that a
/// tap at kernel row r and column s reads its plane at q + r * width + s for every output
/// column q. The width - out_w columns past each row's end are computed and dropped (for the
/// weight gradient, dy is zero there).
struct ShiftedRows {
  std::size_t planes = 0, in_h = 0, in_w = 0; ///< the image before padding
  std::size_t top = 0, left = 0;              ///< zero rows above it, zero columns left of it
  std::size_t width = 0;                      ///< padded row length, in_w + 2 left
  std::size_t plane = 0; ///< floats per padded plane, with zero slack for the last tiles
  std::size_t out_h = 0, out_w = 0, columns = 0; ///< output rows, their length; out_h * width
  std::size_t taps = 0;                          ///< planes x kernel rows x kernel columns
  /// Floats of one wide output row, rounded up to whole tiles of any target.
  [[nodiscard]] std::size_t row_floats() const {
    return round_up_floats(columns + gemm_blocking::max_nr);
  }
};

inline ShiftedRows shifted_rows(Op op, const ConvGeometry& g) {
  ShiftedRows s;
  const bool input_gradient = op == Op::Conv2dGradInput;
  s.planes = input_gradient ? g.o : g.c;
  s.in_h = input_gradient ? g.oh : g.h;
  s.in_w = input_gradient ? g.ow : g.w;
  s.top = input_gradient ? g.kh - 1 - g.pad_h : g.pad_h;
  s.left = input_gradient ? g.kw - 1 - g.pad_w : g.pad_w;
  s.width = s.in_w + 2 * s.left;
  s.out_h = input_gradient ? g.h : g.oh;
  s.out_w = input_gradient ? g.w : g.ow;
  s.columns = s.out_h * s.width;
  s.taps = s.planes * g.kh * g.kw;
  // A tile starting below `columns` reads up to max_nr columns on, kh - 1 rows and kw - 1
  // columns further down.
  s.plane = round_up_floats((s.in_h + 2 * s.top) * s.width + gemm_blocking::max_nr + g.kw);
  return s;
}

/// Per-thread scratch of the convolution kernels, in floats from the slice start.
/// col: the image's column matrix (pre-packed GEMM operand, or GEMM output for grad-input), or
/// the padded image of a shifted-rows kernel; rows: a block of plain column-matrix rows, or
/// the wide output (dy for grad-weight) of a shifted-rows kernel; partial: this thread's dW
/// (grad-weight only; a shifted-rows kernel keeps one vector of sums per element); offsets:
/// where each tap of a shifted-rows kernel reads its operands.
struct ConvLayout {
  std::size_t col = 0, pack_a = 0, pack_b = 0, rows = 0, partial = 0, offsets = 0, total = 0;
};

/// The rows (or columns) of dx that one phase of a strided input gradient computes: those at
/// q * stride + phase - pad for q in [first, end), each summing `taps` kernel rows
/// phase, phase + stride, ... against dy rows q, q - 1, ... (see ConvGradInputPhase).
struct ConvPhase {
  std::size_t first = 0, end = 0, taps = 0;
  [[nodiscard]] std::size_t count() const { return end - first; }
};

/// Phase `phase` (< stride) of an input gradient along one axis of dx (`size` long) for a
/// kernel of `kernel` taps: dx index i takes tap t exactly when (i + pad - t) is a multiple of
/// the stride, so the indices with (i + pad) % stride == phase share the taps phase + k stride.
inline ConvPhase conv_phase(std::size_t phase, std::size_t size, std::size_t kernel,
                            std::size_t stride, std::size_t pad) {
  ConvPhase p;
  p.taps = kernel > phase ? (kernel - phase + stride - 1) / stride : 0;
  p.first = pad > phase ? (pad - phase + stride - 1) / stride : 0;
  p.end = size + pad > phase ? (size - 1 + pad - phase) / stride + 1 : 0;
  p.end = std::max(p.end, p.first);
  return p;
}

/// Kernel rows [begin, end) of a convolution's taps: the ones a tile multiplies.
struct TapRows {
  std::size_t begin, end;
};

/// The rows [begin, end) of an image that hold its data, counted from the first row of a
/// kernel's view of it (a halo above makes begin positive; a phase's view may start above the
/// data, so they are signed). Rows outside hold zeros.
struct DataRows {
  std::ptrdiff_t begin, end;
};

/// The kernel rows that reach `data` for some output row in [first, last] (`stride` apart):
/// the others would multiply only zeros of the halo.
inline TapRows TapRowsMeetingData(std::size_t kh, std::size_t stride, std::size_t first,
                                  std::size_t last, const DataRows& data) {
  const auto reach = [stride](std::size_t oh) { return static_cast<std::ptrdiff_t>(oh * stride); };
  const std::ptrdiff_t begin = std::max<std::ptrdiff_t>(0, data.begin - reach(last));
  const std::ptrdiff_t end = std::min(static_cast<std::ptrdiff_t>(kh), data.end - reach(first));
  return end > begin ? TapRows{static_cast<std::size_t>(begin), static_cast<std::size_t>(end)}
                     : TapRows{0, 0};
}

/// The zero border a channels-last kernel puts around the image it reads: the convolution's
/// padding around x; for the input gradient, kernel - 1 - padding around dy at stride 1 (a
/// stride-1 convolution of dy with the flipped kernel), and at larger strides what the phases
/// read: up to ceil(kernel / stride) - 1 rows before dy and past it to the last phase's end.
struct ConvHalo {
  std::size_t top = 0, left = 0, height = 0, width = 0, channels = 0; // height/width padded
  [[nodiscard]] bool any() const { return top > 0 || left > 0; }
  [[nodiscard]] std::size_t floats() const { return height * width * channels; }
};

inline ConvHalo conv_halo(Op op, const ConvGeometry& g) {
  if (op == Op::Conv2dGradInput && g.stride_h == 1 && g.stride_w == 1) {
    const std::size_t top = g.kh - 1 - g.pad_h, left = g.kw - 1 - g.pad_w;
    return {top, left, g.oh + 2 * top, g.ow + 2 * left, g.o};
  }
  if (op == Op::Conv2dGradInput) {
    // Phase 0 has the most taps and reaches furthest.
    const ConvPhase rows = conv_phase(0, g.h, g.kh, g.stride_h, g.pad_h);
    const ConvPhase columns = conv_phase(0, g.w, g.kw, g.stride_w, g.pad_w);
    const std::size_t top = rows.taps > 0 ? rows.taps - 1 : 0;
    const std::size_t left = columns.taps > 0 ? columns.taps - 1 : 0;
    return {top, left, top + std::max(g.oh, rows.end), left + std::max(g.ow, columns.end), g.o};
  }
  return {g.pad_h, g.pad_w, g.h + 2 * g.pad_h, g.w + 2 * g.pad_w, g.c};
}

/// How a convolution kernel gets at its operands: NCHW through a column matrix, NCHW over
/// shifted rows of the padded image, or channels-last as an implicit GEMM.
enum class ConvAlgorithm : std::uint8_t { columns, shifted_rows, channels_last };

inline ConvLayout conv_layout(Op op, const ConvGeometry& g, ConvAlgorithm algorithm) {
  ConvLayout l;
  const std::size_t p = g.pixels(), ckk = g.ckk();
  std::size_t at = 0;
  const auto take = [&at](std::size_t floats) {
    const std::size_t start = at;
    at += round_up_floats(floats);
    return start;
  };
  if (algorithm == ConvAlgorithm::channels_last) {
    // The zero-padded image the implicit GEMM reads (none without a halo); grad-weight also
    // keeps this thread's partial dW in [KH, KW, C, O] order.
    // A strided input gradient also keeps one phase's result before it is spread over dx.
    const ConvHalo halo = conv_halo(op, g);
    const bool phases = op == Op::Conv2dGradInput && (g.stride_h > 1 || g.stride_w > 1);
    l.col = take(halo.any() || phases ? halo.floats() : 0);
    if (phases)
      l.rows =
          take(((g.h + g.stride_h - 1) / g.stride_h) * ((g.w + g.stride_w - 1) / g.stride_w) * g.c);
    if (op == Op::Conv2dGradWeight) l.partial = take(g.o * ckk);
    l.total = at;
    return l;
  }
  if (algorithm == ConvAlgorithm::shifted_rows) {
    // col: the padded image; rows: the wide output rows (dy's, for the weight gradient);
    // offsets: where each tap reads A and B (two size_t per tap).
    const ShiftedRows s = shifted_rows(op, g);
    l.col = take(s.planes * s.plane);
    l.rows = take((op == Op::Conv2dGradInput ? g.c : g.o) * s.row_floats());
    l.offsets = take(2 * s.taps * sizeof(std::size_t) / sizeof(float));
    if (op == Op::Conv2dGradWeight) l.partial = take(g.o * ckk * max_float_lanes);
  } else if (op == Op::Conv2d) {
    // y = W · col: col is B (K = ckk, N = pixels), packed while it is built; W is read in place.
    l.col = take(gemm_prepacked_b_floats(p, ckk));
  } else if (op == Op::Conv2dGradInput) {
    // dcol = W^T · dy, then scattered into dx; a pointwise conv writes dx directly.
    l.col = take(g.pointwise() ? 0 : ckk * p);
    l.pack_a = take(gemm_packed_a_floats(ckk, g.o));
    l.pack_b = take(gemm_packed_b_floats(p, g.o));
  } else {
    // Either dW += dy · col^T, col^T being B (K = pixels, N = ckk) packed while it is built
    // from blocks of plain rows; or dW^T += col · dy^T with col plain rows read in place and
    // dy^T packed. The kernel picks per SIMD target, so room is left for both.
    l.col = take(std::max(gemm_prepacked_b_floats(ckk, p), ckk * p));
    l.rows = take(gemm_blocking::max_nr * conv_pixel_chunk);
    l.pack_b = take(gemm_packed_b_floats(g.o, p));
    l.partial = take(g.o * ckk);
  }
  l.total = at;
  return l;
}

/// A Winograd convolution seen as the forward pass it computes: the input gradient is the
/// convolution of dy, padded by 2 - padding, with the flipped kernel. `depth` channels in,
/// `width` out; outputs come in tile x tile tiles, each reading an alpha x alpha patch of
/// `halo`, the input padded so that every patch lies inside it.
struct WinogradShape {
  std::size_t depth = 0, width = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  /// Side of an output tile: 2 for F(2x2, 3x3) (and the weight gradient's F(3x3, 2x2), which
  /// tiles dy by 2), 4 for F(4x4, 3x3).
  std::size_t tile = 2;
  std::size_t tiles_h = 0, tiles_w = 0;
  ConvHalo halo;
  [[nodiscard]] std::size_t tiles() const { return tiles_h * tiles_w; }
  /// Side of a transformed tile (the input patch a tile reads), and the products per tile.
  [[nodiscard]] std::size_t alpha() const { return tile + 2; }
  [[nodiscard]] std::size_t planes() const { return alpha() * alpha(); }
  /// Whether the image must be copied into the halo: it has padding, or its last tiles
  /// reach past its edge.
  [[nodiscard]] bool padded() const {
    return halo.any() || halo.height > in_h || halo.width > in_w;
  }
};

/// The output tile side of a Winograd forward pass or input gradient over out_h x out_w
/// outputs: F(4x4, 3x3) makes 36 products per tile of 16 outputs where F(2x2, 3x3) makes 16 per
/// 4, so it takes the outputs whose covering tiles (the last ones may overhang) cost fewer
/// products that way. The weight gradient stays in F(3x3, 2x2).
inline std::size_t winograd_tile(Op op, std::size_t out_h, std::size_t out_w) {
  if (op == Op::Conv2dGradWeight) return 2;
  const auto tiles = [&](std::size_t m) { return ((out_h + m - 1) / m) * ((out_w + m - 1) / m); };
  return 36 * tiles(4) < 16 * tiles(2) ? 4 : 2;
}

inline WinogradShape winograd_shape(Op op, const ConvGeometry& g) {
  // The weight gradient tiles dy as the forward pass tiles y, reading the same patches of x.
  const bool forward = op != Op::Conv2dGradInput;
  WinogradShape s;
  s.depth = forward ? g.c : g.o;
  s.width = forward ? g.o : g.c;
  s.in_h = forward ? g.h : g.oh;
  s.in_w = forward ? g.w : g.ow;
  s.out_h = forward ? g.oh : g.h;
  s.out_w = forward ? g.ow : g.w;
  s.tile = winograd_tile(op, s.out_h, s.out_w);
  s.tiles_h = (s.out_h + s.tile - 1) / s.tile;
  s.tiles_w = (s.out_w + s.tile - 1) / s.tile;
  const std::size_t top = forward ? g.pad_h : 2 - g.pad_h;
  const std::size_t left = forward ? g.pad_w : 2 - g.pad_w;
  s.halo = {top, left, s.tile * s.tiles_h + 2, s.tile * s.tiles_w + 2, s.depth};
  return s;
}

/// Tiles a Winograd convolution transforms and multiplies as one group: a multiple of every
/// GEMM tile height it uses (3, 6 and 10 tiles), so that the transformed weight for one of the
/// 16 products is read from L1 by every GEMM tile of the group.
inline constexpr std::size_t winograd_group = 30;

/// Per-thread scratch of a Winograd convolution, in floats: `image`, the padded image (when
/// WinogradShape::padded); `inputs`, a group's transformed input tiles, [planes][group][depth];
/// `products`, their products with the transformed weight, [planes][group][width] (for the
/// weight gradient, the group's transformed dy tiles); `weights`, the transformed weight,
/// [planes][depth][width] (the first worker's slice holds the one copy every worker reads). The
/// weight gradient instead keeps `partial`, the worker's sum of products over its images,
/// [16][depth][width], and `kernel`, where the first worker's slice gets the sum of every
/// worker's partial transformed back to 3x3, [9][depth][width].
struct WinogradLayout {
  std::size_t image = 0, inputs = 0, products = 0, weights = 0, partial = 0, kernel = 0, total = 0;
};

inline WinogradLayout winograd_layout(Op op, const WinogradShape& s) {
  WinogradLayout l;
  std::size_t at = 0;
  const auto take = [&at](std::size_t floats) {
    const std::size_t start = at;
    at += round_up_floats(floats);
    return start;
  };
  l.image = take(s.padded() ? s.halo.floats() : 0);
  const std::size_t planes = s.planes();
  l.inputs = take(planes * winograd_group * s.depth);
  l.products = take(planes * winograd_group * s.width);
  const bool weight_gradient = op == Op::Conv2dGradWeight;
  l.weights = take(weight_gradient ? 0 : planes * s.depth * s.width);
  l.partial = take(weight_gradient ? 16 * s.depth * s.width : 0);
  l.kernel = take(weight_gradient ? 9 * s.depth * s.width : 0);
  l.total = at;
  return l;
}

/// The padded dx a scatter input gradient (conv_scatter-inl.hpp) adds each dy pixel's window
/// into, so that no window needs clipping: `rows` x `cols` pixels of `c` floats, where dx
/// pixel (i, j) is padded pixel (i + pad_h, j + pad_w). A window's kernel row is a run of
/// kw * c floats there, computed in whole vectors of up to `run_floats`.
struct ScatterShape {
  std::size_t rows = 0, cols = 0, run = 0, run_floats = 0;
  [[nodiscard]] std::size_t floats(std::size_t c) const { return rows * cols * c; }
};

inline ScatterShape scatter_shape(const ConvGeometry& g) {
  ScatterShape s;
  s.rows = (g.oh - 1) * g.stride_h + g.kh;
  s.cols = (g.ow - 1) * g.stride_w + g.kw;
  s.run = g.kw * g.c;
  s.run_floats = round_up_floats(s.run);
  return s;
}

/// The most dy pixels one scatter tile multiplies at a time; its scratch holds that many.
inline constexpr std::size_t scatter_max_pixels = 10;

/// Per-thread scratch of a scatter input gradient, in floats: `image`, the padded dx (with
/// slack for the last run's padding lanes); `pixels`, the dy pixels of one tile, channel by
/// channel; `weights`, the weight as [KH][O][run_floats] runs (the first worker's slice holds
/// the one copy every worker reads).
struct ScatterLayout {
  std::size_t image = 0, pixels = 0, weights = 0, total = 0;
};

inline ScatterLayout scatter_layout(const ConvGeometry& g) {
  const ScatterShape s = scatter_shape(g);
  ScatterLayout l;
  std::size_t at = 0;
  const auto take = [&at](std::size_t floats) {
    const std::size_t start = at;
    at += round_up_floats(floats);
    return start;
  };
  l.image = take(s.floats(g.c) + s.run_floats - s.run);
  l.pixels = take(scatter_max_pixels * g.o);
  l.weights = take(g.kh * g.o * s.run_floats);
  l.total = at;
  return l;
}

/// Per-thread scratch of a channels-last convolution that multiplies in bfloat16, in floats:
/// `image`, the image it reads, padded by its halo, as bfloat16 pairs of depths (for the
/// weight gradient: pairs of the values a stride apart along a row); `weights`, the weight as
/// pairs of depths, tap by tap (the first worker's slice holds the one copy every worker
/// reads); for the weight gradient, `gradient`, dy as pairs of neighbouring output pixels of a
/// row, and `partial`, the worker's partial dW in [KH, KW, C, O] order.
struct ConvBf16Layout {
  std::size_t image = 0, weights = 0, gradient = 0, partial = 0, total = 0;
};

inline ConvBf16Layout conv_bf16_layout(Op op, const ConvGeometry& g) {
  ConvBf16Layout l;
  std::size_t at = 0;
  const auto take = [&at](std::size_t floats) {
    const std::size_t start = at;
    at += round_up_floats(floats);
    return start;
  };
  const ConvHalo halo = conv_halo(op, g);
  if (op == Op::Conv2dGradWeight) {
    l.image = take(halo.floats());
    l.gradient = take(g.oh * ((g.ow + 1) / 2) * g.o);
    l.partial = take(g.o * g.ckk());
  } else {
    l.image = take((halo.floats() + 1) / 2);
    l.weights = take((g.kh * g.kw * g.c * g.o + 1) / 2);
  }
  l.total = at;
  return l;
}

/// Floats a Conv2d or Conv2dGradInput kernel with an epilogue sets aside, after its layout's
/// total and the epilogue's temps, to stage one image's result when its output took over an
/// epilogue operand (see EpilogueRunner::result_target).
inline std::size_t conv_staging_floats(Op op, const ConvGeometry& g, const Attrs* attrs) {
  const Epilogue* e = attrs ? epilogue_of(*attrs) : nullptr;
  if (!e || e->empty() || op == Op::Conv2dGradWeight) return 0;
  return round_up_floats(op == Op::Conv2d ? g.o * g.pixels() : g.c * g.h * g.w);
}

} // namespace kiln::cpu
