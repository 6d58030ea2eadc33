// Runs a test body once per Highway target compiled into this binary and supported here.
#pragma once

#include <hwy/targets.h>

#include "kiln/backends/cpu/kernel_table.hpp"

namespace kiln::test {

/// Calls body(table) with the kernel table of every compiled and supported SIMD target.
template <class Body> void for_each_target(Body&& body) {
  for (const auto target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    body(cpu::kernel_table());
  }
  hwy::SetSupportedTargetsForTest(0);
}

} // namespace kiln::test
