// Per-target assembly of the kernel table from the kernel families; re-included once per
// Highway target by implementation.hpp.
#if defined(KILN_CPU_KERNEL_TABLE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_KERNEL_TABLE_INL_H_
#undef KILN_CPU_KERNEL_TABLE_INL_H_
#else
#define KILN_CPU_KERNEL_TABLE_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/backends/cpu/collective.hpp"
#include "kiln/backends/cpu/conv-inl.hpp"
#include "kiln/backends/cpu/conv_channels_last-inl.hpp"
#include "kiln/backends/cpu/conv_channels_last_bf16-inl.hpp"
#include "kiln/backends/cpu/conv_scatter-inl.hpp"
#include "kiln/backends/cpu/conv_shifted_rows-inl.hpp"
#include "kiln/backends/cpu/conv_winograd-inl.hpp"
#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/gemm-inl.hpp"
#include "kiln/backends/cpu/gemm_bf16-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/peak-inl.hpp"
#include "kiln/backends/cpu/pool-inl.hpp"
#include "kiln/backends/cpu/reduce-inl.hpp"
#include "kiln/backends/cpu/softmax-inl.hpp"
#include "kiln/backends/cpu/transpose-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {

inline const KernelTable* GetKernelTable() {
  static const KernelTable table = [] {
    KernelTable t;
    t.target_name = hwy::TargetName(HWY_TARGET);
    t.gemm_tile_rows = kGemmMR;
    t.gemm_tile_columns = GemmNR();
    t.vector_floats = hn::Lanes(GemmTag());
    RegisterElementwiseKernels(t);
    RegisterReduceKernels(t);
    RegisterGemmKernels(t);
    RegisterBf16GemmKernels(t);
    RegisterConvKernels(t);
    RegisterShiftedRowsConvKernels(t);
    RegisterChannelsLastConvKernels(t);
    RegisterChannelsLastBf16ConvKernels(t);
    RegisterScatterConvKernels(t);
    RegisterWinogradConvKernels(t);
    RegisterPoolKernels(t);
    RegisterSoftmaxKernels(t);
    RegisterTransposeKernels(t);
    RegisterPeakMeasurement(t);
    register_collective_kernels(t);
    return t;
  }();
  return &table;
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
