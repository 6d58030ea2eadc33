// The one translation unit of the CPU backend: include this in exactly one .cpp file.
// Highway compiles the kernels once per SIMD target here and picks the best at run time.
#pragma once

#include "kiln/backends/cpu/kernel_table.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kiln/backends/cpu/kernel_table-inl.hpp"
#include <hwy/foreach_target.h> // IWYU pragma: keep
#include <hwy/highway.h>

#include "kiln/backends/cpu/kernel_table-inl.hpp"

#if HWY_ONCE
namespace kiln::cpu {
HWY_EXPORT(GetKernelTable);

const KernelTable& kernel_table() { return *HWY_DYNAMIC_DISPATCH(GetKernelTable)(); }
} // namespace kiln::cpu
#endif
