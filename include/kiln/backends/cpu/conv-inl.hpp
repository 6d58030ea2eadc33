// Per-target conv kernels; re-included once per Highway target by implementation.hpp.
#if defined(KILN_CPU_CONV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_CONV_INL_H_
#undef KILN_CPU_CONV_INL_H_
#else
#define KILN_CPU_CONV_INL_H_
#endif

#include <hwy/highway.h>

#include "kiln/backends/cpu/kernel_table.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline void RegisterConvKernels(KernelTable& table) { (void)table; }

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
