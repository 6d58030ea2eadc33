// The work the CPU kernels do for a call, as the cost model weighs it: which convolution
// variant runs and whether it writes a column matrix, and how the call's GEMM fills the
// target's register tiles.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "kiln/backends/conv_geometry.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/passes/cost_model.hpp"

namespace kiln::cpu {

/// A GEMM's result rows (m: the register tile's rows), columns (n: its vectors) and depth (k).
struct GemmExtent {
  std::int64_t m = 0, n = 0, k = 0;
};

/// The GEMM each image of a convolution call runs, as the variant that takes the call lays
/// it out: NCHW kernels put channels on the tile's rows and pixels on its vectors,
/// channels-last kernels the other way round.
inline GemmExtent conv_gemm(Op op, const ConvGeometry& g) {
  const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  const std::int64_t taps = i(g.kh * g.kw), out_pixels = i(g.pixels()), in_pixels = i(g.h * g.w);
  if (g.channels_last) {
    if (op == Op::Conv2d) return {out_pixels, i(g.o), i(g.c) * taps};
    if (op == Op::Conv2dGradInput) return {in_pixels, i(g.c), i(g.o) * taps};
    return {i(g.c) * taps, i(g.o), out_pixels};
  }
  if (op == Op::Conv2d) return {i(g.o), out_pixels, i(g.c) * taps};
  if (op == Op::Conv2dGradInput) {
    if (conv_reads_shifted_rows(op, g)) return {i(g.c), in_pixels, i(g.o) * taps};
    return {i(g.c) * taps, out_pixels, i(g.o)};
  }
  return {i(g.o), i(g.c) * taps, out_pixels};
}

/// The share of the peak a GEMM of `extent` reaches on tiles of `rows` x `columns`.
inline double gemm_fill(const GemmExtent& extent, std::size_t rows, std::size_t columns) {
  return tile_fill(extent.m, static_cast<std::int64_t>(rows)) *
         tile_fill(extent.n, static_cast<std::int64_t>(columns)) * depth_fill(extent.k);
}

/// Time, in FLOPs at the peak, the Winograd kernels spend per value they transform (16 per
/// input tile and channel, 16 per output tile and channel) beyond the products: loads, stores
/// and the cache traffic of the transformed tiles. Measured on the MNIST CNN's second
/// convolution, where the transforms took about 40% of the products' time.
inline constexpr double winograd_transform_flops = 16.0;

/// Steps of its inner product a register tile of the Winograd products costs besides them:
/// each tile is stored once (the weight gradient's also loaded and added), where depth_fill's
/// default prices a packed GEMM's tile. With it the model puts Winograd's time at 0.61-0.90
/// of the direct kernel's on the MNIST CNN's and the small ResNet's 3x3 convolutions, where
/// 0.60-0.74 was measured (2026-12-07, AMD EPYC, 2 threads); with the default it rated the
/// ResNet's 16-channel ones at 1.13-1.20, and the rule kept them direct.
inline constexpr double winograd_tile_steps = 2.0;

/// The share of the peak a Winograd call reaches against the direct convolution's FLOPs
/// (`flops`): above 1 where its 16 products per 2x2 tile outweigh its transforms. The products
/// are GEMMs over the tiles' channels (forward, input gradient), or over a group of tiles
/// (weight gradient).
inline double winograd_fill(Op op, const ConvGeometry& g, double flops, const KernelTable& table) {
  const WinogradShape s = winograd_shape(op, g);
  const double tiles = static_cast<double>(g.batch * s.tiles());
  const auto depth = static_cast<std::int64_t>(s.depth), width = static_cast<std::int64_t>(s.width);
  const std::int64_t inner =
      op == Op::Conv2dGradWeight ? static_cast<std::int64_t>(winograd_group) : depth;
  const double fill = tile_fill(width, static_cast<std::int64_t>(table.vector_floats)) *
                      depth_fill(inner, winograd_tile_steps);
  const auto planes = static_cast<double>(s.planes());
  const double products = 2.0 * planes * tiles * static_cast<double>(depth * width) / fill;
  const double transforms =
      winograd_transform_flops * planes * tiles * static_cast<double>(depth + width);
  return flops / (products + transforms);
}

/// Steps of its inner product a scatter tile (conv_scatter-inl.hpp) costs besides them: each
/// accumulator is loaded, added and stored into dx once, and the tile's pixels are gathered.
inline constexpr double scatter_tile_steps = 4.0;

/// The share of the peak the scatter input gradient reaches: tiles of pixels down a column of
/// dy against runs of kernel columns x input channels, over a depth of output channels.
inline double scatter_fill(const ConvGeometry& g, const KernelTable& table) {
  const auto i = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  return tile_fill(i(g.oh), i(scatter_max_pixels)) *
         tile_fill(i(g.kw * g.c), i(table.vector_floats)) * depth_fill(i(g.o), scatter_tile_steps);
}

/// The work of `query` on the kernels of `table`.
inline KernelWork kernel_work(const KernelTable& table, const KernelQuery& query) {
  KernelWork work = operand_work(query);
  const Op op = query.op;
  if (op == Op::Conv2d || op == Op::Conv2dGradInput || op == Op::Conv2dGradWeight) {
    const ConvGeometry g = conv_geometry(op, query);
    if (!g.channels_last && !g.pointwise() && !conv_reads_shifted_rows(op, g)) {
      std::array<Shape, max_op_inputs> shapes{};
      for (std::size_t k = 0; k < query.in.size(); ++k) shapes[k] = query.in[k].shape;
      work.bytes += static_cast<double>(op_info(op).column_matrix_bytes(CostContext{
          std::span<const Shape>(shapes.data(), query.in.size()), query.out.shape, *query.attrs}));
    }
    work.compute_fill = gemm_fill(conv_gemm(op, g), table.gemm_tile_rows,
                                  g.channels_last ? table.vector_floats : table.gemm_tile_columns);
    const std::string kernel = table.select(query, "the CPU").name;
    if (kernel.ends_with(".winograd")) work.compute_fill = winograd_fill(op, g, work.flops, table);
    if (kernel.ends_with(".scatter")) work.compute_fill = scatter_fill(g, table);
  } else if (op == Op::MatMul) {
    const Shape& out = query.out.shape;
    const auto& attrs = std::get<MatMulAttrs>(*query.attrs);
    const Shape& a = query.in[0].shape;
    const std::int64_t depth = attrs.transpose_a ? a[0] : a[1];
    work.compute_fill =
        gemm_fill({out[0], out[1], depth}, table.gemm_tile_rows, table.gemm_tile_columns);
    // B is packed into slivers of the tile's width, and A too when it is read transposed.
    const double packed =
        static_cast<double>(out[1] * depth + (attrs.transpose_a ? out[0] * depth : 0));
    work.packed_bytes = 2.0 * 4.0 * packed;
  }
  // A bfloat16 dot product does two multiply-adds per lane where an FP32 FMA does one.
  if (query.precision == Precision::bf16 && table.select(query, "the CPU").name.ends_with(".bf16"))
    work.compute_fill *= 2.0;
  return work;
}

} // namespace kiln::cpu
