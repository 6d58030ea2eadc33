// Which CPU kernel variant runs a call, and the scratch it needs: the rules each KernelVariant
// of the kernel table carries, decided once per node at lowering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <variant>

#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cpu {

/// Channel counts a channels-last kernel tiles over (output channels; the input's for the
/// input gradient) must be multiples of this: whole vectors on every x86 SIMD target.
inline constexpr std::int64_t channels_last_multiple = 16;

/// The channels a channels-last kernel of `op` tiles over: the output's, or for the input
/// gradient the input's.
inline std::int64_t tiled_channels(Op op, const ConvGeometry& g) {
  return static_cast<std::int64_t>(op == Op::Conv2dGradInput ? g.c : g.o);
}

/// Whether a convolution call asks for the Winograd domain (Conv2dAttrs::winograd).
inline bool winograd_requested(const KernelQuery& q) {
  const auto* a = q.attrs ? std::get_if<Conv2dAttrs>(q.attrs) : nullptr;
  return a && a->winograd;
}

/// Whether the Winograd kernels compute this convolution call (forward or either gradient):
/// channels-last, 3x3 at stride 1 with padding of at most 2, and whole vectors of channels on
/// both sides.
inline bool winograd_fits(const ConvGeometry& g) {
  return g.channels_last && g.kh == 3 && g.kw == 3 && g.stride_h == 1 && g.stride_w == 1 &&
         g.pad_h <= 2 && g.pad_w <= 2 && g.c % channels_last_multiple == 0 &&
         g.o % channels_last_multiple == 0;
}

/// The Winograd variant runs the calls that ask for it and fit it; the channels-last variant
/// takes the rest.
template <Op op> bool winograd_accepts(const KernelQuery& q) {
  return winograd_requested(q) && winograd_fits(conv_geometry(op, q));
}

/// Scratch bytes per thread of a Winograd convolution, with the epilogue's temps and staging.
template <Op op> std::size_t winograd_workspace(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(op, q);
  return (winograd_layout(op, winograd_shape(op, g)).total + epilogue_floats(q.attrs) +
          conv_staging_floats(op, g, q.attrs)) *
         sizeof(float);
}

/// The longest kernel-row run (kernel columns x input channels) the scatter input gradient
/// takes: four AVX-512 vectors, so a tile of its pixels keeps every run in registers.
inline constexpr std::size_t scatter_max_run = 64;

/// Whether the scatter variant computes this input-gradient call: channels-last with input
/// channels that are not whole vectors (which the channels-last variant needs) and kernel rows
/// of at most scatter_max_run floats. Any stride and padding.
inline bool scatter_accepts(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, q);
  return g.channels_last && g.c % channels_last_multiple != 0 && g.kw * g.c <= scatter_max_run;
}

/// Scratch bytes per thread of the scatter input gradient, with the epilogue's temps and
/// staging.
inline std::size_t scatter_workspace(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(Op::Conv2dGradInput, q);
  return (scatter_layout(g).total + epilogue_floats(q.attrs) +
          conv_staging_floats(Op::Conv2dGradInput, g, q.attrs)) *
         sizeof(float);
}

/// Whether the variant of `algorithm` runs this convolution call. The three exclude each
/// other: channels-last activations need the channels-last kernels, which need whole vectors
/// of channels (and, for the input gradient, padding narrower than the kernel); NCHW
/// convolutions read shifted rows where conv_reads_shifted_rows says so, else columns.
template <Op op, ConvAlgorithm algorithm> bool conv_accepts(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(op, q);
  if (algorithm == ConvAlgorithm::channels_last) {
    if (!g.channels_last || tiled_channels(op, g) % channels_last_multiple != 0) return false;
    if (winograd_requested(q) && winograd_fits(g)) return false;
    return op != Op::Conv2dGradInput || (g.pad_h < g.kh && g.pad_w < g.kw);
  }
  if (g.channels_last) return false;
  return conv_reads_shifted_rows(op, g) == (algorithm == ConvAlgorithm::shifted_rows);
}

/// Scratch bytes per thread of a convolution variant: its layout, the epilogue's temps, and
/// the staging of one image's result (see conv_staging_floats).
template <Op op, ConvAlgorithm algorithm> std::size_t conv_workspace(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(op, q);
  return (conv_layout(op, g, algorithm).total + epilogue_floats(q.attrs) +
          conv_staging_floats(op, g, q.attrs)) *
         sizeof(float);
}

/// Whether the channels-last variant of `op` that multiplies in bfloat16 runs this call: the
/// FP32 one's rule, and for the forward and input-gradient kernels an even depth (input
/// channels; output channels for the input gradient), since they multiply pairs of channels;
/// the input gradient's also a stride of 1 (it has no phases).
/// The weight gradient pairs neighbouring pixels of the input a vector of channels at a time,
/// so it takes whole vectors of input channels (with one channel, pairing the pixels cost more
/// than the faster products saved: the MNIST CNN's first layer ran at half its FP32 speed).
template <Op op> bool conv_bf16_accepts(const KernelQuery& q) {
  if (!conv_accepts<op, ConvAlgorithm::channels_last>(q)) return false;
  const ConvGeometry g = conv_geometry(op, q);
  if (op == Op::Conv2d) return g.c % 2 == 0;
  if (op == Op::Conv2dGradInput) return g.o % 2 == 0 && g.stride_h == 1 && g.stride_w == 1;
  return g.c % channels_last_multiple == 0;
}

/// Scratch bytes per thread of a channels-last convolution that multiplies in bfloat16.
template <Op op> std::size_t conv_bf16_workspace(const KernelQuery& q) {
  const ConvGeometry g = conv_geometry(op, q);
  return (conv_bf16_layout(op, g).total + epilogue_floats(q.attrs) +
          conv_staging_floats(op, g, q.attrs)) *
         sizeof(float);
}

/// Scratch bytes per thread of the MatMul kernel: its packing buffers and the epilogue's temps.
inline std::size_t matmul_workspace(const KernelQuery& q) {
  return (matmul_layout(matmul_dims(q)).total + epilogue_floats(q.attrs)) * sizeof(float);
}

/// Scratch bytes per thread of the MatMul kernel that multiplies in bfloat16.
inline std::size_t matmul_bf16_workspace(const KernelQuery& q) {
  return (matmul_bf16_layout(matmul_dims(q)).total + epilogue_floats(q.attrs)) * sizeof(float);
}

/// Scratch bytes per thread of a fused elementwise kernel: a chunk per intermediate result.
inline std::size_t fused_workspace(const KernelQuery& q) {
  const auto& program = std::get<FusedAttrs>(*q.attrs).program;
  return (program.size() - 1) * static_cast<std::size_t>(fused_chunk) * sizeof(float);
}

/// The most columns fused_sum_to sums when the innermost axis is kept: each block of rows keeps
/// one total per column on the stack.
inline constexpr std::int64_t fused_sum_max_columns = 256;

/// Whether fused_sum_to's kernel sums this call: over runs of the innermost axis, or down to
/// the innermost axes alone when they hold at most fused_sum_max_columns elements (per-channel
/// sums of NHWC, bias gradients). Other shapes keep the chain and the sum apart.
inline bool fused_sum_accepts(const KernelQuery& q) {
  const auto& a = std::get<FusedSumAttrs>(*q.attrs);
  const Shape& from = a.chain.shape;
  const Shape& to = a.to;
  int i = from.rank() - 1;
  while (i >= 0 && from[i] == 1) --i;
  if (i < 0 || to[i] == 1) return true;
  std::int64_t columns = 1;
  for (; i >= 0 && (from[i] == 1 || to[i] != 1); --i) columns *= from[i];
  for (; i >= 0; --i)
    if (from[i] != 1 && to[i] != 1) return false;
  return columns <= fused_sum_max_columns;
}

/// Where in a fused_sum_to worker's scratch one chunk of the chain's result goes: after a chunk
/// per intermediate step.
inline std::size_t fused_sum_values_offset(std::size_t steps) {
  return round_up_floats((steps - 1) * static_cast<std::size_t>(fused_chunk));
}

/// Scratch bytes per thread of fused_sum_to: the chain's intermediate chunks and one of its
/// result.
inline std::size_t fused_sum_workspace(const KernelQuery& q) {
  const auto& program = std::get<FusedSumAttrs>(*q.attrs).chain.program;
  return (fused_sum_values_offset(program.size()) + static_cast<std::size_t>(fused_chunk)) *
         sizeof(float);
}

/// Scratch bytes per thread of a transpose: one image, for a transpose in place over a
/// dying input (the batch axis stays first).
inline std::size_t transpose_workspace(const KernelQuery& q) {
  const auto& perm = std::get<TransposeAttrs>(*q.attrs).perm;
  const Shape& in = q.in[0].shape;
  if (perm.empty() || perm[0] != 0 || in[0] == 0) return 0;
  return round_up_floats(static_cast<std::size_t>(in.numel() / in[0])) * sizeof(float);
}

/// Whether a pool reads and writes one layout, channels-last ([N, H, W, C]) or NCHW; each
/// layout has its own kernel.
template <bool channels_last> bool pool_accepts(const KernelQuery& q) {
  const auto& a = std::get<Pool2dAttrs>(*q.attrs);
  return a.channels_last == channels_last && !a.flip_pooled_layout;
}

/// Whether an average pool's call is not NCHW on both sides, which its image-by-image kernel
/// takes.
inline bool pool_in_other_layouts(const KernelQuery& q) {
  const auto& a = std::get<Pool2dAttrs>(*q.attrs);
  return a.channels_last || a.flip_pooled_layout;
}

/// Scratch bytes per thread of an average pool in other layouts: one image of the pooled
/// tensor (a pool's output, its gradient's input).
inline std::size_t pooled_image_workspace(const KernelQuery& q) {
  const Shape& pooled = q.op == Op::AvgPool2d ? q.out.shape : q.in[0].shape;
  if (pooled[0] == 0) return 0;
  return round_up_floats(static_cast<std::size_t>(pooled.numel() / pooled[0])) * sizeof(float);
}

} // namespace kiln::cpu
