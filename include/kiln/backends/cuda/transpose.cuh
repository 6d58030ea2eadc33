// CUDA transpose: any axis permutation up to rank 6, moving 4-byte words (f32 and i32 alike).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "kiln/backends/cuda/launch.cuh"
#include "kiln/backends/essential_transpose.hpp"

namespace kiln::cuda {

namespace transpose_detail {

/// Elements are moved as 32-bit words: every kiln dtype is 4 bytes.
using Word = std::uint32_t;

/// Side of the square tile a 2-D transpose stages in shared memory, and the rows of it each
/// thread row of the block moves per pass.
inline constexpr int tile = 32;
inline constexpr int tile_rows = 8;

/// Words an in-place transpose stages at once (at least one image): 4 MiB keeps the
/// workspace small while each staged batch still fills the device.
inline constexpr std::int64_t staged_words = std::int64_t{1} << 20;

/// Output dims and, for each output axis, the source stride: a gather, used where the
/// innermost axis stays innermost, so reads run along contiguous source runs.
struct Gather {
  int rank = 0;
  std::array<std::int64_t, Shape::max_rank> dims{};
  std::array<std::int64_t, Shape::max_rank> src_stride{};
};

/// A batch of 2-D transposes dst[c * ds + r] = src[r * ss + c], r < rows, c < cols, over the
/// batch axes' source and destination strides.
struct Batched2D {
  std::int64_t rows = 0, cols = 0, ss = 0, ds = 0;
  std::int64_t matrices = 0;
  int batch_rank = 0;
  std::array<std::int64_t, Shape::max_rank> batch_dims{};
  std::array<std::int64_t, Shape::max_rank> batch_src{};
  std::array<std::int64_t, Shape::max_rank> batch_dst{};
};

__global__ void copy_words(const Word* src, Word* dst, std::int64_t n) {
  KILN_CUDA_FOR_EACH(i, n) dst[i] = src[i];
}

__global__ void gather_words(const Word* src, Word* dst, std::int64_t n, Gather g) {
  KILN_CUDA_FOR_EACH(i, n) {
    std::int64_t rest = i, at = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      at += rest % g.dims[u] * g.src_stride[u];
      rest /= g.dims[u];
    }
    dst[i] = src[at];
  }
}

/// One tile x tile block of one matrix per loop trip: read along source rows, written along
/// destination rows, so both sides are coalesced; the padding column avoids bank conflicts.
__global__ void transpose_tiles(const Word* src, Word* dst, Batched2D t) {
  __shared__ Word staged[tile][tile + 1];
  const std::int64_t row_tiles = (t.rows + tile - 1) / tile;
  const std::int64_t col_tiles = (t.cols + tile - 1) / tile;
  const std::int64_t per_matrix = row_tiles * col_tiles;
  const std::int64_t tiles = t.matrices * per_matrix;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  // The loop index is the same for every thread of the block, so the barriers are uniform.
  for (std::int64_t k = blockIdx.x; k < tiles; k += gridDim.x) {
    std::int64_t m = k / per_matrix;
    const std::int64_t within = k % per_matrix;
    const std::int64_t r0 = within / col_tiles * tile, c0 = within % col_tiles * tile;
    std::int64_t src_at = 0, dst_at = 0;
    for (int d = t.batch_rank - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      const std::int64_t idx = m % t.batch_dims[u];
      m /= t.batch_dims[u];
      src_at += idx * t.batch_src[u];
      dst_at += idx * t.batch_dst[u];
    }
    for (int y = ty; y < tile; y += tile_rows) {
      const std::int64_t r = r0 + y, c = c0 + tx;
      if (r < t.rows && c < t.cols) staged[y][tx] = src[src_at + r * t.ss + c];
    }
    __syncthreads();
    for (int y = ty; y < tile; y += tile_rows) {
      const std::int64_t c = c0 + y, r = r0 + tx;
      if (r < t.rows && c < t.cols) dst[dst_at + c * t.ds + r] = staged[tx][y];
    }
    __syncthreads();
  }
}

/// Enqueues dst = src of shape `in` with its axes permuted; src and dst do not overlap.
inline void enqueue(const Word* src, Word* dst, const Shape& in, std::span<const int> perm) {
  const std::int64_t total = in.numel();
  if (total == 0) return;
  const EssentialTranspose e = essential_transpose(in, perm);
  const int k = e.rank;
  if (k <= 1) {
    launch("transpose", copy_words, blocks_for(total), block_threads, 0, src, dst, total);
    return;
  }
  std::array<std::int64_t, Shape::max_rank> in_stride{}, out_stride{};
  e.strides(in_stride, out_stride);
  const auto src_stride_of_output_axis = [&](int i) {
    return in_stride[static_cast<std::size_t>(e.perm[static_cast<std::size_t>(i)])];
  };

  if (e.perm[static_cast<std::size_t>(k - 1)] == k - 1) {
    Gather g;
    g.rank = k;
    for (int i = 0; i < k; ++i) {
      const auto u = static_cast<std::size_t>(i);
      g.dims[u] = e.dims[static_cast<std::size_t>(e.perm[u])];
      g.src_stride[u] = src_stride_of_output_axis(i);
    }
    launch("transpose", gather_words, blocks_for(total), block_threads, 0, src, dst, total, g);
    return;
  }

  // Source rows run along input axis a (the output's innermost), source columns along the
  // input's innermost axis, found at output position j; the other output axes are the batch.
  const int a = e.perm[static_cast<std::size_t>(k - 1)];
  int j = 0;
  while (e.perm[static_cast<std::size_t>(j)] != k - 1) ++j;
  Batched2D t;
  t.rows = e.dims[static_cast<std::size_t>(a)];
  t.cols = e.dims[static_cast<std::size_t>(k - 1)];
  t.ss = in_stride[static_cast<std::size_t>(a)];
  t.ds = out_stride[static_cast<std::size_t>(j)];
  t.matrices = total / (t.rows * t.cols);
  for (int i = 0; i < k - 1; ++i) {
    if (i == j) continue;
    const auto u = static_cast<std::size_t>(t.batch_rank++);
    t.batch_dims[u] = e.dims[static_cast<std::size_t>(e.perm[static_cast<std::size_t>(i)])];
    t.batch_src[u] = src_stride_of_output_axis(i);
    t.batch_dst[u] = out_stride[static_cast<std::size_t>(i)];
  }
  const std::int64_t tiles =
      t.matrices * ((t.rows + tile - 1) / tile) * ((t.cols + tile - 1) / tile);
  launch("transpose", transpose_tiles, blocks_for(tiles, 1), dim3(tile, tile_rows), 0, src, dst, t);
}

/// Images an in-place transpose stages at once, for a batch of `batch` images of `image`
/// words each.
inline std::int64_t staged_images(std::int64_t batch, std::int64_t image) {
  return std::clamp<std::int64_t>(staged_words / std::max<std::int64_t>(1, image), 1, batch);
}

} // namespace transpose_detail

/// Workspace of a transpose that keeps the batch axis first: the staging of whole images for
/// a transpose in place over its dying input (OpDef::overwritable_input), as on the CPU.
inline std::size_t transpose_workspace(const KernelQuery& q) {
  const auto& perm = std::get<TransposeAttrs>(*q.attrs).perm;
  const Shape& in = q.in[0].shape;
  if (perm.size() < 2 || perm[0] != 0 || in[0] == 0) return 0;
  const std::int64_t image = in.numel() / in[0];
  const std::int64_t words = transpose_detail::staged_images(in[0], image) * image;
  return static_cast<std::size_t>(words) * sizeof(transpose_detail::Word);
}

/// transpose: out dim i = in dim perm[i]; moves 4-byte elements of any dtype.
inline void transpose_kernel(const KernelArgs& args) {
  using transpose_detail::Word;
  const auto& perm = std::get<TransposeAttrs>(*args.attrs).perm;
  const Shape& in = args.in[0].shape;
  const std::int64_t total = in.numel();
  if (total == 0) return;
  auto* out = static_cast<Word*>(args.out.data);
  if (args.out.data != args.in[0].data) {
    transpose_detail::enqueue(static_cast<const Word*>(args.in[0].data), out, in, perm);
    return;
  }
  // In place (the batch axis stays first): batches of whole images are staged in the
  // workspace and reordered back from there; a permutation that moves nothing is done.
  if (essential_transpose(in, perm).rank <= 1) return;
  const bool batch_first = perm.size() > 1 && perm[0] == 0;
  const std::int64_t image = batch_first ? total / in[0] : total;
  const std::int64_t fits =
      static_cast<std::int64_t>(args.workspace_per_worker / sizeof(Word)) / image;
  if (!batch_first || fits < 1 || args.workspace == nullptr) {
    LaunchContext& context = launch_context();
    if (context.error == cudaSuccess) {
      context.error = cudaErrorInvalidValue;
      context.failed_kernel = "transpose (in place without staging workspace)";
    }
    return;
  }
  auto* staged = reinterpret_cast<Word*>(args.workspace);
  const std::int64_t per_batch = std::min(fits, in[0]);
  for (std::int64_t first = 0; first < in[0]; first += per_batch) {
    const std::int64_t count = std::min(per_batch, in[0] - first);
    Shape batch = in;
    batch[0] = count;
    const std::int64_t words = count * image;
    launch("transpose", transpose_detail::copy_words, blocks_for(words), block_threads, 0,
           out + first * image, staged, words);
    transpose_detail::enqueue(staged, out + first * image, batch, perm);
  }
}

/// Puts the transpose kernel into the table.
inline void register_transpose_kernels(KernelTable& table) {
  table.add(Op::Transpose, {"transpose", &transpose_kernel, nullptr, &transpose_workspace});
}

} // namespace kiln::cuda
